package auth

// Enumeration (issue 27, item 8): nothing a client sees before its proof
// tells a known user from an unknown name: saslSupportedMechs, the fake
// credentials' shape, their salts across a restart, and whether a lookup
// was made.

import (
	"context"
	"encoding/base64"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/xdg-go/scram"
)

// serverFirst returns the server-first message a gives user's login.
func serverFirst(t *testing.T, a *Authenticator, m Mechanism, user, db string) string {
	t.Helper()
	var cl *scram.Client
	if m == SCRAMSHA1 {
		cl, _ = scram.SHA1.NewClientUnprepped(user, "x", "")
	} else {
		cl, _ = scram.SHA256.NewClient(user, "x", "")
	}
	c1, _ := cl.NewConversation().Step("")
	_, s1, err := a.Start(context.Background(), m, db, []byte(c1), true)
	if err != nil {
		t.Fatal(err)
	}
	return string(s1)
}

// shapeOf is the iteration count and salt length of a server-first.
func shapeOf(t *testing.T, s1 string) shape {
	t.Helper()
	salt, err := base64.StdEncoding.DecodeString(attr(s1, "s"))
	n, err2 := strconv.Atoi(attr(s1, "i"))
	if err != nil || err2 != nil {
		t.Fatalf("server-first %q", s1)
	}
	return shape{n, len(salt)}
}

// saslSupportedMechs is the same for a SCRAM-SHA-256-only user, a user
// with both, and an unknown name: both mechanisms, with no lookup.
func TestMechanismsSameForEveryone(t *testing.T) {
	sc, _ := Derive(SCRAMSHA256, "only256", "pw", []byte("0123456789abcdef"), 4096)
	users, err := ParseFile([]byte(`"only256@admin" "`+FormatStored(SCRAMSHA256, sc)+`"`+"\n"+`"both@admin" "pw"`), "t")
	if err != nil {
		t.Fatal(err)
	}
	up := newUpstreamUsers()
	a := New(users, nil, NewCache(up, CacheOptions{}))
	want := a.Mechanisms(context.Background(), "ghost", "admin")
	for _, u := range []string{"only256", "both", "ghost", "looked-up"} {
		if got := a.Mechanisms(context.Background(), u, "admin"); !slices.Equal(got, want) || len(got) != 2 {
			t.Fatalf("%s: %v, want %v", u, got, want)
		}
	}
	if len(up.calls) != 0 {
		t.Fatalf("saslSupportedMechs looked users up: %v", up.calls)
	}
	// The SHA-256-only user asked with SCRAM-SHA-1 fails as a wrong
	// password does.
	if _, err := login(t, a, SCRAMSHA1, "only256", "admin", "pw", true); !IsAuthFailed(err) {
		t.Fatal(err)
	}
}

// An unknown name's fake credentials have the iteration count and salt
// length most real users have, per mechanism, from the auth_file and from
// lookups; MongoDB's defaults when there are none.
func TestFakeCredentialsShapedLikeRealUsers(t *testing.T) {
	a := New(&Users{}, nil, nil)
	if got := shapeOf(t, serverFirst(t, a, SCRAMSHA256, "ghost", "admin")); got != (shape{15000, 28}) {
		t.Fatalf("no users: %+v, want MongoDB's defaults", got)
	}
	file := ""
	for i := range 3 {
		u := "u" + strconv.Itoa(i)
		s256, _ := Derive(SCRAMSHA256, u, "pw", []byte("0123456789abcdef"), 4096)
		s1, _ := Derive(SCRAMSHA1, u, "pw", []byte("0123456789abcdefghij"), 5000)
		file += `"` + u + `@admin" "` + FormatStored(SCRAMSHA256, s256) + " " + FormatStored(SCRAMSHA1, s1) + "\"\n"
	}
	users, err := ParseFile([]byte(file), "t")
	if err != nil {
		t.Fatal(err)
	}
	a.Update(users, nil)
	for m, want := range map[Mechanism]shape{SCRAMSHA256: {4096, 16}, SCRAMSHA1: {5000, 20}} {
		s1 := serverFirst(t, a, m, "ghost", "admin")
		if got := shapeOf(t, s1); got != want {
			t.Fatalf("%s: fake %+v, want the users' %+v", m, got, want)
		}
		if s1b := serverFirst(t, a, m, "u0", "admin"); shapeOf(t, s1b) != shapeOf(t, s1) {
			t.Fatalf("%s: a real user's %q and a fake's %q differ in shape", m, s1b, s1)
		}
	}

	// Lookups count too: four users found with 10000 iterations outweigh
	// the three of the auth_file.
	up := newUpstreamUsers()
	for i := range 4 {
		up.set("dyn"+strconv.Itoa(i), "admin", scramCreds(t, "dyn", "pw", "0123456789abcdefghijklmn", 10000))
	}
	b := New(users, nil, NewCache(up, CacheOptions{}))
	for i := range 4 {
		if _, err := b.cache.Get(context.Background(), "dyn"+strconv.Itoa(i), "admin"); err != nil {
			t.Fatal(err)
		}
	}
	if got := shapeOf(t, serverFirst(t, b, SCRAMSHA256, "ghost", "admin")); got != (shape{10000, 24}) {
		t.Fatalf("with lookups: %+v, want {10000 24}", got)
	}
}

// Fake salts (and plain passwords' salts) derive from the seed, the
// auth_file's contents: the same file gives the same salts after a
// restart, another file others.
func TestFakeSaltsStableAcrossRestarts(t *testing.T) {
	saved := processKeys.key.Load()
	t.Cleanup(func() { processKeys.key.Store(saved) })
	fakeSalt := func() string {
		return attr(serverFirst(t, New(&Users{}, nil, nil), SCRAMSHA256, "ghost", "admin"), "s")
	}
	plainSalt := func() string {
		u, err := ParseFile([]byte(`"p@admin" "pw"`), "t")
		if err != nil {
			t.Fatal(err)
		}
		c, _ := u.Lookup("p", "admin")
		sc, _ := c.For(SCRAMSHA256)
		return sc.Salt
	}
	SeedKeys([]byte("file contents one"))
	fake1, plain1 := fakeSalt(), plainSalt()
	processKeys.key.Store(newKeyring().key.Load()) // a restart: a new random key...
	SeedKeys([]byte("file contents one"))          // ...seeded from the same file
	if fakeSalt() != fake1 || plainSalt() != plain1 {
		t.Fatal("salts changed across a restart with the same auth_file")
	}
	SeedKeys([]byte("file contents two"))
	if fakeSalt() == fake1 || plainSalt() == plain1 {
		t.Fatal("another seed gives the same salts")
	}
}

// With auth_user, an auth_file user's first login is looked up too (its
// answer unused), as an unknown name's is: both cost a round trip, so
// timing does not tell them apart; and neither is looked up again while
// cached.
func TestAuthFileUserLookedUpToo(t *testing.T) {
	users, err := ParseFile([]byte(`"known@admin" "pw"`), "t")
	if err != nil {
		t.Fatal(err)
	}
	up := newUpstreamUsers()
	cache := NewCache(up, CacheOptions{PositiveTTL: time.Hour})
	a := New(users, nil, cache)
	if err := loginFrom(t, a, Peer{}, SCRAMSHA256, "known", "admin", "pw"); err != nil {
		t.Fatalf("auth_file user: %v", err)
	}
	if err := loginFrom(t, a, Peer{}, SCRAMSHA256, "ghost", "admin", "pw"); !IsAuthFailed(err) {
		t.Fatal(err)
	}
	if up.n("known", "admin") != 1 || up.n("ghost", "admin") != 1 {
		t.Fatalf("lookups %v, want one each", up.calls)
	}
	// Cached: the next logins look nobody up.
	if err := loginFrom(t, a, Peer{}, SCRAMSHA256, "known", "admin", "pw"); err != nil {
		t.Fatal(err)
	}
	if up.n("known", "admin") != 1 {
		t.Fatalf("lookups %v, want the cached answer", up.calls)
	}
	// The auth_file wins over the upstream's answer.
	up.set("known", "admin", scramCreds(t, "known", "other", "salt-one-16bytes", 4096))
	a.Refresh("known", "admin")
	if err := loginFrom(t, a, Peer{}, SCRAMSHA256, "known", "admin", "pw"); err != nil {
		t.Fatalf("auth_file user with another password upstream: %v", err)
	}
}
