package app

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/auth"
	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

func TestLoadAuthUsers(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) {
		if err := os.WriteFile(filepath.Join(dir, "users.txt"), []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg := config.Default()
	cfg.Path = filepath.Join(dir, "mb.toml")
	cfg.Global.AuthType = config.AuthSCRAM
	cfg.Global.AuthFile = "users.txt" // relative to the configuration file
	cfg.Global.AuthUser = "mb@admin"
	hashed, _ := auth.HashPassword("mb", "admin", "pw")

	write(`"app@admin" "x"` + "\n" + hashed + "\n")
	if _, err := loadAuthUsers(cfg, config.AuthSCRAM, nil); err == nil || !strings.Contains(err.Error(), "auth_user mb@admin needs a line with its plain password") {
		t.Fatalf("auth_user with a stored secret only: %v", err)
	}
	write(`"app@admin" "x"` + "\n" + `"mb@admin" "pw"` + "\n")
	users, err := loadAuthUsers(cfg, config.AuthSCRAM, nil)
	if err != nil || users.Len() != 2 {
		t.Fatalf("%v %v", users, err)
	}
	if ca, _ := newClientAuth(cfg, users, nil, nil, nil, nil); ca == nil || ca.X509 || ca.Users.Users() != users {
		t.Fatalf("client auth %+v", ca)
	}
	write("\"broken\n")
	if _, err := loadAuthUsers(cfg, config.AuthSCRAM, nil); !errors.Is(err, auth.ErrAuthFile) || !strings.Contains(err.Error(), "users.txt:1:") {
		t.Fatalf("bad file: %v", err)
	}
	if u, err := loadAuthUsers(cfg, config.AuthNone, nil); u != nil || err != nil {
		t.Fatal("auth_type none reads no file", u, err)
	}
	cfg.Global.AuthFile = ""
	if _, err := loadAuthUsers(cfg, config.AuthSCRAM, nil); !errors.Is(err, auth.ErrAuthFile) {
		t.Fatalf("scram running, no auth_file: %v", err)
	}
	cfg.Global.AuthType = config.AuthNone
	if ca, _ := newClientAuth(cfg, nil, nil, nil, nil, nil); ca != nil {
		t.Fatal("auth_type none makes no ClientAuth")
	}
}

// authLookup asks the route named after the user's database, else the
// catch-all; with neither, the user is not found (cached negatively, no
// upstream asked).
func TestAuthLookupRoute(t *testing.T) {
	l := &authLookup{}
	cfg := config.Default()
	cfg.Global.AuthUser = "mb@admin"
	l.setConfig(cfg, []config.EffectiveRoute{{Name: "shop"}, {Name: config.CatchAll}})
	if r, au, ok := l.route("shop"); !ok || r.Name != "shop" || au != "mb@admin" {
		t.Fatalf("shop: %q %q %v", r.Name, au, ok)
	}
	if r, _, ok := l.route("admin"); !ok || r.Name != config.CatchAll {
		t.Fatalf("admin: %q %v, want the catch-all", r.Name, ok)
	}
	l.setConfig(cfg, []config.EffectiveRoute{{Name: "shop"}})
	if _, err := l.Lookup(context.Background(), "u", "admin"); !errors.Is(err, auth.ErrNotFound) || !errors.Is(err, errNoLookupRoute) {
		t.Fatalf("no route for admin: %v", err)
	}
}

// authLookup logs in as auth_user with one authenticator, kept across
// lookups (its SCRAM keys are derived once, not per lookup: a random user
// named in a hello costs no PBKDF2), and built again when auth_user's
// password changes or a reload comes.
func TestAuthLookupKeepsOneAuthenticator(t *testing.T) {
	up := fakemongo.Start(t, fakemongo.Options{InMemory: true, Users: []fakemongo.User{
		{Name: "mbauth", Password: "mbauth-pw"}, {Name: "u1", Password: "p1"}, {Name: "u2", Password: "p2"},
	}})
	cs, err := config.ParseConnString("mongodb://" + up.Addr() + "/?directConnection=true")
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Global.AuthUser = "mbauth@admin"
	routes := []config.EffectiveRoute{{Name: config.CatchAll, Conn: cs, Pool: config.Pool{ConnectTimeout: 5 * time.Second}}}
	usersWith := func(pw string) *auth.Users {
		u, err := auth.ParseFile([]byte(`"mbauth@admin" "`+pw+`"`), "users.txt")
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	l := &authLookup{}
	l.setConfig(cfg, routes)
	l.authn = auth.New(usersWith("mbauth-pw"), nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	lookup := func(user string) upstream.HandshakeAuthenticator {
		t.Helper()
		if _, err := l.Lookup(ctx, user, "admin"); err != nil && (user != "ghost" || !errors.Is(err, auth.ErrNotFound)) {
			t.Fatalf("lookup of %s: %v", user, err)
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.au.a
	}
	first := lookup("u1")
	for _, u := range []string{"u2", "ghost", "u1"} {
		if lookup(u) != first {
			t.Fatalf("lookup of %s built another authenticator", u)
		}
	}
	if up.Requests("usersInfo") != 4 || up.AuthFailures() != 0 {
		t.Fatalf("%d usersInfo, %d failed logins", up.Requests("usersInfo"), up.AuthFailures())
	}
	// A new password (a reload of auth_file) is used at the next lookup.
	l.authn.Update(usersWith("new-pw"), nil)
	if _, err := l.Lookup(ctx, "u1", "admin"); err == nil || up.AuthFailures() != 1 {
		t.Fatalf("lookup as auth_user with a new (wrong) password: %v, %d failed logins", err, up.AuthFailures())
	}
	l.authn.Update(usersWith("mbauth-pw"), nil)
	second := lookup("u2")
	if second == first {
		t.Fatal("the authenticator outlived its password")
	}
	// A reload starts over.
	l.setConfig(cfg, routes)
	if lookup("u1") == second {
		t.Fatal("the authenticator outlived a reload")
	}
}

// TestAuthFileModeWarning: an auth_file that group or others may read is
// used, with a warning naming the file and its mode; one for its owner
// alone gets none.
func TestAuthFileModeWarning(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("no mode bits")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "users.txt")
	cfg := config.Default()
	cfg.Global.AuthType = config.AuthSCRAM
	cfg.Global.AuthFile = path
	for _, c := range []struct {
		mode os.FileMode
		warn bool
	}{{0o600, false}, {0o400, false}, {0o604, true}, {0o620, true}, {0o660, true}} {
		if err := os.WriteFile(path, []byte(`"app@admin" "x"`+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, c.mode); err != nil {
			t.Fatal(err)
		}
		var logs bytes.Buffer
		log := slog.New(slog.NewTextHandler(&logs, nil))
		if users, err := loadAuthUsers(cfg, config.AuthSCRAM, log); err != nil || users.Len() != 1 {
			t.Fatalf("%#o: %v %v", c.mode, users, err)
		}
		got := strings.Contains(logs.String(), "level=WARN") && strings.Contains(logs.String(), "auth_file=") &&
			strings.Contains(logs.String(), fmt.Sprintf("mode=%#o", c.mode))
		if got != c.warn {
			t.Errorf("mode %#o: warned %v, want %v: %s", c.mode, got, c.warn, logs.String())
		}
		_ = os.Chmod(path, 0o600)
	}
}

// TestAuthLookupsAtOnceAsShipped: with the shipped configuration, built as
// the application builds it, exactly 16 auth_user lookups run upstream at
// once; the 17th user's waits for one of them to end. (A test of the
// cache alone passes its own small limit; this one holds the default.)
func TestAuthLookupsAtOnceAsShipped(t *testing.T) {
	const shipped = 16
	up := fakemongo.Start(t, fakemongo.Options{InMemory: true, Users: []fakemongo.User{{Name: "mbauth", Password: "mbauth-pw"}}})
	// Every usersInfo stays upstream long enough to count them, and ends
	// before the 17th's wait for a slot (the 5 s lookup timeout) does.
	up.SetFailPoint(fakemongo.FailPoint{Mode: fakemongo.FailAlwaysOn, FailCommands: []string{"usersInfo"},
		BlockConnection: true, BlockTime: 4 * time.Second})
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "users.txt"), []byte(`"mbauth@admin" "mbauth-pw"`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	toml := fmt.Sprintf("[mongobouncer]\nauth_type = \"scram\"\nauth_file = %q\nauth_user = \"mbauth@admin\"\n"+
		"[databases.\"*\"]\nconnection_string = \"mongodb://%s/?directConnection=true\"\n", filepath.Join(dir, "users.txt"), up.Addr())
	cfg, err := config.Parse([]byte(toml), filepath.Join(dir, "mb.toml"))
	if err != nil {
		t.Fatal(err)
	}
	routes, err := cfg.Routes()
	if err != nil {
		t.Fatal(err)
	}
	users, err := loadAuthUsers(cfg, config.AuthSCRAM, nil)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := newClientAuth(cfg, users, routes, nil, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	ask := func(i int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A saslStart's first step, from an address of its own (one
			// address may run only auth_lookups_per_peer at once).
			pctx := auth.WithPeer(ctx, auth.Peer{Remote: fmt.Sprintf("192.0.2.%d:5000", i+1), Local: "127.0.0.1:27017"})
			_, _, _ = ca.Users.Start(pctx, auth.SCRAMSHA256, "admin", []byte(fmt.Sprintf("n,,n=user%d,r=fyko+d2lbbFgONRv9qkxdawL", i)), false)
		}()
	}
	for i := range shipped + 1 {
		ask(i)
	}
	waitFor := func(n int64, within time.Duration) bool {
		for end := time.Now().Add(within); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			if up.Requests("usersInfo") >= n {
				return true
			}
		}
		return false
	}
	if !waitFor(shipped, 3500*time.Millisecond) {
		t.Fatalf("%d lookups reached the upstream, want %d", up.Requests("usersInfo"), shipped)
	}
	time.Sleep(200 * time.Millisecond)
	if n := up.Requests("usersInfo"); n != shipped {
		t.Fatalf("%d lookups at once upstream, want %d (the shipped auth_max_lookups)", n, shipped)
	}
	// The 17th runs once one of the 16 ends.
	if !waitFor(shipped+1, 5*time.Second) {
		t.Fatalf("the 17th lookup never ran: %d", up.Requests("usersInfo"))
	}
}

// TestMaxSCRAMIterationsConfigured: max_scram_iterations bounds the
// auth_file's stored iteration counts and what an upstream may ask for;
// the default (100000) refuses a stored form of 200000 rounds, a
// configuration that raises it accepts it.
func TestMaxSCRAMIterationsConfigured(t *testing.T) {
	defer auth.SetMaxIterations(auth.DefaultMaxIterations)
	defer upstream.SetMaxIterations(upstream.DefaultMaxIterations)
	sc, err := auth.Derive(auth.SCRAMSHA256, "u", "pw", []byte("0123456789abcdef"), 200_000)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	users := filepath.Join(dir, "users.txt")
	line := fmt.Sprintf("%q %q\n", "u@admin", auth.FormatStored(auth.SCRAMSHA256, sc))
	if err := os.WriteFile(users, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key  string
		load bool
	}{{"", false}, {"max_scram_iterations = 200000\n", true}} {
		toml := fmt.Sprintf("[mongobouncer]\nlisten = \"127.0.0.1:0\"\nauth_type = \"scram\"\nauth_file = %q\n%s[databases.\"*\"]\nconnection_string = \"mongodb://127.0.0.1:1/\"\n", users, c.key)
		cfg, err := config.Parse([]byte(toml), filepath.Join(dir, "mb.toml"))
		if err != nil {
			t.Fatal(err)
		}
		a, err := New(cfg, nil)
		if a != nil {
			a.Close(context.Background())
		}
		if got := err == nil; got != c.load {
			t.Errorf("%q: started %v (%v), want %v", c.key, got, err, c.load)
		}
	}
}

// TestAuthFileTooOpen: PostgreSQL's rule for key files. A file another
// user owns (mongobouncer's own, usually) may be 0600 at most; a root-owned
// one may also be read by its group (0640: a Kubernetes Secret mounted with
// fsGroup is 0440, root-owned).
func TestAuthFileTooOpen(t *testing.T) {
	for _, c := range []struct {
		perm  os.FileMode
		uid   uint32
		known bool
		open  bool
	}{
		{0o600, 1000, true, false}, {0o400, 1000, true, false}, {0o640, 1000, true, true}, {0o440, 1000, true, true},
		{0o604, 1000, true, true}, {0o640, 0, true, false}, {0o440, 0, true, false}, {0o660, 0, true, true},
		{0o644, 0, true, true}, {0o640, 0, false, true}, {0o600, 0, false, false},
	} {
		if got := authFileTooOpen(c.perm, c.uid, c.known); got != c.open {
			t.Errorf("%#o owned by %d (known %v): too open %v, want %v", c.perm, c.uid, c.known, got, c.open)
		}
	}
}
