package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/xdg-go/scram"

	"github.com/mongobouncer/mongobouncer/internal/auth"
	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// lookupOn returns an authLookup as auth_user mbauth on a route of uri.
func lookupOn(t *testing.T, uri string) *authLookup {
	t.Helper()
	cs, err := config.ParseConnString(uri)
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Global.AuthUser = "mbauth@admin"
	users, err := auth.ParseFile([]byte(`"mbauth@admin" "mbauth-pw"`), "users.txt")
	if err != nil {
		t.Fatal(err)
	}
	l := &authLookup{}
	l.setConfig(cfg, []config.EffectiveRoute{{Name: config.CatchAll, Conn: cs, Pool: config.Pool{ConnectTimeout: 5 * time.Second}}})
	l.authn = auth.New(users, nil, nil)
	return l
}

// loginWith logs user in with password against creds (SCRAM-SHA-256,
// through a cache that holds them) and returns the login's error.
func loginWith(t *testing.T, creds auth.Creds, user, password string) error {
	t.Helper()
	a := auth.New(&auth.Users{}, nil, auth.NewCache(auth.LookupFunc(func(context.Context, string, string) (auth.Creds, error) {
		return creds, nil
	}), auth.CacheOptions{}))
	cl, err := scram.SHA256.NewClient(user, password, "")
	if err != nil {
		t.Fatal(err)
	}
	cc := cl.NewConversation()
	c1, _ := cc.Step("")
	conv, s1, err := a.Start(context.Background(), auth.SCRAMSHA256, "admin", []byte(c1), true)
	if err != nil {
		return err
	}
	c2, _ := cc.Step(string(s1))
	_, _, err = conv.Step([]byte(c2))
	return err
}

// Lookups read the primary: with a secondary first in the seed list whose
// users lag (a password changed on the primary only), the lookup asks the
// primary and gets the new password; it follows the primary a secondary
// names when the seed list lacks it; and without a primary it fails
// rather than read a secondary.
func TestAuthLookupAsksThePrimary(t *testing.T) {
	rs := fakemongo.StartReplicaSet(t, fakemongo.ReplicaSetOptions{Members: 2, InitialPrimary: 1, Base: fakemongo.Options{
		Users: []fakemongo.User{{Name: "mbauth", Password: "mbauth-pw"}, {Name: "u", Password: "old"}},
	}})
	if err := rs.Member(1).Server().SetUserPassword("u", "admin", "new"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, uri := range []string{
		"mongodb://" + rs.Member(0).Addr() + "," + rs.Member(1).Addr() + "/?replicaSet=" + rs.Name(),
		"mongodb://" + rs.Member(0).Addr() + "/?replicaSet=" + rs.Name(), // the secondary alone: it names the primary
	} {
		creds, err := lookupOn(t, uri).Lookup(ctx, "u", "admin")
		if err != nil {
			t.Fatalf("%s: %v", uri, err)
		}
		if err := loginWith(t, creds, "u", "new"); err != nil {
			t.Fatalf("%s: the primary's password: %v (read the lagging secondary?)", uri, err)
		}
	}
	if n := rs.Member(0).Requests("usersInfo"); n != 0 {
		t.Fatalf("the secondary was asked usersInfo %d times", n)
	}
	if err := rs.StepDown(1); err != nil {
		t.Fatal(err)
	}
	_, err := lookupOn(t, "mongodb://"+rs.Member(0).Addr()+","+rs.Member(1).Addr()+"/?replicaSet="+rs.Name()).Lookup(ctx, "u", "admin")
	if err == nil || errors.Is(err, auth.ErrNotFound) {
		t.Fatalf("no primary: %v, want a failure to ask", err)
	}
}

// The usersInfo command asks for the restrictions and reads the primary;
// fakemongo shows them as mongod does, and they come back in the
// credentials (enforced by auth.Start, see internal/auth).
func TestAuthLookupReadsRestrictions(t *testing.T) {
	up := fakemongo.Start(t, fakemongo.Options{InMemory: true, Users: []fakemongo.User{
		{Name: "mbauth", Password: "mbauth-pw"},
		{Name: "r", Password: "pw", Restrictions: []fakemongo.Restriction{{ClientSource: []string{"10.0.0.0/8"}}}},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	creds, err := lookupOn(t, "mongodb://"+up.Addr()+"/?directConnection=true").Lookup(ctx, "r", "admin")
	if err != nil {
		t.Fatal(err)
	}
	a := auth.New(&auth.Users{}, nil, auth.NewCache(auth.LookupFunc(func(context.Context, string, string) (auth.Creds, error) {
		return creds, nil
	}), auth.CacheOptions{}))
	for _, tc := range []struct {
		remote string
		ok     bool
	}{{"10.9.8.7:1234", true}, {"192.0.2.1:1234", false}} {
		cl, _ := scram.SHA256.NewClient("r", "pw", "")
		cc := cl.NewConversation()
		c1, _ := cc.Step("")
		conv, s1, err := a.Start(auth.WithPeer(ctx, auth.Peer{Remote: tc.remote, Local: "127.0.0.1:27017"}), auth.SCRAMSHA256, "admin", []byte(c1), true)
		if err != nil {
			t.Fatal(err)
		}
		c2, _ := cc.Step(string(s1))
		if _, _, err := conv.Step([]byte(c2)); (err == nil) != tc.ok {
			t.Fatalf("from %s: %v, want ok=%v", tc.remote, err, tc.ok)
		}
	}
	cmd := usersInfoCommand("r", "admin")
	if v, _ := cmd.Lookup("showAuthenticationRestrictions").BooleanOK(); !v {
		t.Fatal("usersInfo does not ask for the restrictions")
	}
	if m, _ := cmd.Lookup("$readPreference", "mode").StringValueOK(); m != "primary" {
		t.Fatalf("read preference %q", m)
	}
}

// auth_cache_ttl, auth_lookups_per_peer and auth_max_lookups reach the
// auth_user cache at start; a reload changes the first two, and keeps the
// running auth_max_lookups (a restart changes it).
func TestReloadAppliesAuthCacheConfig(t *testing.T) {
	up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "users.txt"), []byte(`"mbauth@admin" "mbauth-pw"`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "mongobouncer.toml")
	write := func(ttl string, perPeer, max int) {
		doc := fmt.Sprintf("[mongobouncer]\nlisten = \"127.0.0.1:0\"\nauth_type = \"scram\"\nauth_file = \"users.txt\"\n"+
			"auth_user = \"mbauth@admin\"\nauth_cache_ttl = %q\nauth_lookups_per_peer = %d\nauth_max_lookups = %d\n"+
			"[databases.\"*\"]\nconnection_string = \"mongodb://%s/?directConnection=true\"\n", ttl, perPeer, max, up.Addr())
		if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("5s", 2, 8)
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeApp(a) })
	c := a.auth.Users.Cache()
	if c == nil || c.TTL() != 5*time.Second || c.MaxLookupsPerPeer() != 2 || c.MaxLookups() != 8 {
		t.Fatalf("at start: %v", c)
	}
	write("1m", 7, 9)
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	if c.TTL() != time.Minute || c.MaxLookupsPerPeer() != 7 || c.MaxLookups() != 8 {
		t.Fatalf("after a reload: %v %d %d", c.TTL(), c.MaxLookupsPerPeer(), c.MaxLookups())
	}
	if got := a.Config()["auth_max_lookups"]; got != 8 {
		t.Fatalf("the configuration in force says auth_max_lookups = %d, running 8", got)
	}
}

// Fake credentials are derived from the auth_file's contents: a restart
// with the same file gives an unknown name the same salt (another
// process's random key is simulated by seeding another one in between).
func TestFakeSaltsSurviveARestart(t *testing.T) {
	up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "users.txt"), []byte(`"app@admin" "app-pw"`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "mongobouncer.toml")
	doc := "[mongobouncer]\nlisten = \"127.0.0.1:0\"\nauth_type = \"scram\"\nauth_file = \"users.txt\"\n" +
		"[databases.\"*\"]\nconnection_string = \"mongodb://" + up.Addr() + "/?directConnection=true\"\n"
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	salt := func() string {
		cfg, err := config.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		a, err := New(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer closeApp(a)
		cl, _ := scram.SHA256.NewClient("ghost", "x", "")
		c1, _ := cl.NewConversation().Step("")
		_, s1, err := a.auth.Users.Start(context.Background(), auth.SCRAMSHA256, "admin", []byte(c1), true)
		if err != nil {
			t.Fatal(err)
		}
		_, rest, _ := strings.Cut(string(s1), ",s=")
		s, _, _ := strings.Cut(rest, ",")
		return s
	}
	first := salt()
	auth.SeedKeys([]byte("another process's key"))
	if second := salt(); second != first {
		t.Fatalf("an unknown name's salt changed across a restart: %q, then %q", first, second)
	}
}
