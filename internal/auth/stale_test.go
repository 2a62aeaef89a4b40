package auth

// Stale credentials of the auth_user lookup (issue 27, item 6): the TTL
// bounds how long a changed password keeps working, a failed proof looks
// the user up again (once per attempt), and authenticationRestrictions
// are honoured.

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xdg-go/scram"
)

// upstreamUsers is a scriptable Lookup: the users an upstream has now,
// and how many times each was asked for.
type upstreamUsers struct {
	mu    sync.Mutex
	users map[string]Creds
	calls map[string]int
}

func newUpstreamUsers() *upstreamUsers {
	return &upstreamUsers{users: map[string]Creds{}, calls: map[string]int{}}
}

func (u *upstreamUsers) Lookup(_ context.Context, user, db string) (Creds, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.calls[user+"@"+db]++
	c, ok := u.users[user+"@"+db]
	if !ok {
		return Creds{}, ErrNotFound
	}
	return c, nil
}

func (u *upstreamUsers) set(user, db string, c Creds) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.users[user+"@"+db] = c
}

func (u *upstreamUsers) drop(user, db string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.users, user+"@"+db)
}

func (u *upstreamUsers) n(user, db string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.calls[user+"@"+db]
}

// scramCreds derives both mechanisms' credentials for password with salt.
func scramCreds(t *testing.T, user, password, salt string, iters int) Creds {
	t.Helper()
	m := map[Mechanism]scram.StoredCredentials{}
	for _, mech := range Mechanisms {
		sc, err := Derive(mech, user, password, []byte(salt), iters)
		if err != nil {
			t.Fatal(err)
		}
		m[mech] = sc
	}
	c, err := NewCreds(m)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// loginFrom runs a whole short-form conversation from peer (none when
// peer.Remote is empty) and returns its error.
func loginFrom(t *testing.T, a *Authenticator, peer Peer, m Mechanism, user, db, password string) error {
	t.Helper()
	var cl *scram.Client
	var err error
	if m == SCRAMSHA1 {
		cl, err = scram.SHA1.NewClientUnprepped(user, mongoPasswordDigest(user, password), "")
	} else {
		cl, err = scram.SHA256.NewClient(user, password, "")
	}
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if peer.Remote != "" {
		ctx = WithPeer(ctx, peer)
	}
	cc := cl.NewConversation()
	c1, _ := cc.Step("")
	conv, s1, err := a.Start(ctx, m, db, []byte(c1), true)
	if err != nil {
		return err
	}
	c2, err := cc.Step(string(s1))
	if err != nil {
		t.Fatal(err)
	}
	s2, done, err := conv.Step([]byte(c2))
	if err != nil {
		return err
	}
	if _, err := cc.Step(string(s2)); err != nil || !done || conv.Identity() == nil {
		t.Fatalf("client refuses the server's proof (%v) or not done (%v)", err, done)
	}
	return nil
}

// countingObserver counts what an Authenticator reports.
type countingObserver struct {
	mu       sync.Mutex
	failures map[string]int
	lookups  map[string]int
}

func newCountingObserver() *countingObserver {
	return &countingObserver{failures: map[string]int{}, lookups: map[string]int{}}
}

func (o *countingObserver) AuthFailed(reason string) {
	o.mu.Lock()
	o.failures[reason]++
	o.mu.Unlock()
}

func (o *countingObserver) AuthLookup(result string) {
	o.mu.Lock()
	o.lookups[result]++
	o.mu.Unlock()
}

func (o *countingObserver) failed(reason string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.failures[reason]
}

func (o *countingObserver) looked(result string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.lookups[result]
}

// fakeClock is a settable clock for a Cache.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func staleRig(t *testing.T, ttl time.Duration) (*Authenticator, *upstreamUsers, *fakeClock, *countingObserver) {
	t.Helper()
	up := newUpstreamUsers()
	cache := NewCache(up, CacheOptions{PositiveTTL: ttl})
	clock := &fakeClock{now: time.Now()}
	cache.now = clock.Now
	a := New(&Users{}, nil, cache)
	obs := newCountingObserver()
	a.SetObserver(obs)
	return a, up, clock, obs
}

// A password changed upstream keeps working at most auth_cache_ttl when
// nobody fails a proof meanwhile; then the old one fails and the new one
// works.
func TestChangedPasswordStopsWithinTTL(t *testing.T) {
	a, up, clock, _ := staleRig(t, 30*time.Second)
	up.set("u", "admin", scramCreds(t, "u", "old", "salt-one-16bytes", 4096))
	if err := loginFrom(t, a, Peer{}, SCRAMSHA256, "u", "admin", "old"); err != nil {
		t.Fatal(err)
	}
	up.set("u", "admin", scramCreds(t, "u", "new", "salt-two-16bytes", 4096))
	clock.advance(29 * time.Second)
	if err := loginFrom(t, a, Peer{}, SCRAMSHA256, "u", "admin", "old"); err != nil {
		t.Fatalf("within the TTL, the cached password: %v", err)
	}
	clock.advance(2 * time.Second)
	if err := loginFrom(t, a, Peer{}, SCRAMSHA256, "u", "admin", "old"); !IsAuthFailed(err) {
		t.Fatalf("old password past the TTL: %v, want a failed login", err)
	}
	if err := loginFrom(t, a, Peer{}, SCRAMSHA256, "u", "admin", "new"); err != nil {
		t.Fatalf("new password past the TTL: %v", err)
	}
	if n := up.n("u", "admin"); n != 2 {
		t.Fatalf("%d lookups, want 2 (the first login, the expiry)", n)
	}
}

// The default TTL is auth_cache_ttl's default, 30 seconds.
func TestCacheDefaultTTL(t *testing.T) {
	c := NewCache(newUpstreamUsers(), CacheOptions{})
	if got := time.Duration(c.ttl.Load()); got != 30*time.Second || DefaultCacheTTL != 30*time.Second {
		t.Fatalf("default TTL %v", got)
	}
	c.SetTTL(time.Second)
	if got := time.Duration(c.ttl.Load()); got != time.Second {
		t.Fatalf("SetTTL: %v", got)
	}
}

// A failed proof against cached credentials looks the user up again, once
// per attempt: a new password with the same salt works in that very
// attempt; one with a new salt (what updateUser does) works at the next
// attempt, with no lookup more; a wrong password costs one lookup per
// attempt, not two.
func TestFailedProofLooksAgain(t *testing.T) {
	a, up, clock, obs := staleRig(t, time.Hour)
	up.set("u", "admin", scramCreds(t, "u", "old", "salt-one-16bytes", 4096))
	if err := loginFrom(t, a, Peer{}, SCRAMSHA256, "u", "admin", "old"); err != nil {
		t.Fatal(err)
	}
	clock.advance(time.Second)

	// Same salt and iterations: verified against the new keys at once.
	up.set("u", "admin", scramCreds(t, "u", "new", "salt-one-16bytes", 4096))
	for _, m := range Mechanisms {
		if err := loginFrom(t, a, Peer{}, m, "u", "admin", "new"); err != nil {
			t.Fatalf("%s: new password, same salt: %v", m, err)
		}
	}
	if n := up.n("u", "admin"); n != 2 {
		t.Fatalf("%d lookups, want 2 (the first login, the failed proof's)", n)
	}
	if err := loginFrom(t, a, Peer{}, SCRAMSHA256, "u", "admin", "old"); !IsAuthFailed(err) {
		t.Fatalf("the old password after the change: %v", err)
	}
	clock.advance(time.Second)

	// A new salt: the attempt fails (the client derived its proof from
	// the old salt), the next one works, from the cache.
	up.set("u", "admin", scramCreds(t, "u", "newer", "salt-three-16byt", 4096))
	before := up.n("u", "admin")
	if err := loginFrom(t, a, Peer{}, SCRAMSHA256, "u", "admin", "newer"); !IsAuthFailed(err) {
		t.Fatalf("new salt, first attempt: %v, want a failed login", err)
	}
	if err := loginFrom(t, a, Peer{}, SCRAMSHA256, "u", "admin", "newer"); err != nil {
		t.Fatalf("new salt, next attempt: %v", err)
	}
	if n := up.n("u", "admin") - before; n != 1 {
		t.Fatalf("%d lookups for the new salt, want 1", n)
	}

	// A wrong password: one lookup per failed attempt, and none for an
	// answer fetched during the attempt itself.
	clock.advance(time.Second)
	before = up.n("u", "admin")
	if err := loginFrom(t, a, Peer{}, SCRAMSHA256, "u", "admin", "wrong"); !IsAuthFailed(err) {
		t.Fatal(err)
	}
	if n := up.n("u", "admin") - before; n != 1 {
		t.Fatalf("%d lookups for a wrong password, want 1", n)
	}
	a.Refresh("u", "admin") // the next attempt looks up in Start
	before = up.n("u", "admin")
	if err := loginFrom(t, a, Peer{}, SCRAMSHA256, "u", "admin", "wrong"); !IsAuthFailed(err) {
		t.Fatal(err)
	}
	if n := up.n("u", "admin") - before; n != 1 {
		t.Fatalf("%d lookups for an attempt that looked up already, want 1", n)
	}
	if obs.failed(FailBadProof) != 4 {
		t.Fatalf("bad_proof failures: %v", obs.failures)
	}
}

// A user dropped upstream stops at once after a failed proof, even with
// the right password, instead of working until the TTL.
func TestDroppedUserStopsAfterFailedProof(t *testing.T) {
	a, up, clock, obs := staleRig(t, time.Hour)
	up.set("u", "admin", scramCreds(t, "u", "pw", "salt-one-16bytes", 4096))
	if err := loginFrom(t, a, Peer{}, SCRAMSHA256, "u", "admin", "pw"); err != nil {
		t.Fatal(err)
	}
	up.drop("u", "admin")
	clock.advance(time.Second)
	if err := loginFrom(t, a, Peer{}, SCRAMSHA256, "u", "admin", "guess"); !IsAuthFailed(err) {
		t.Fatal(err)
	}
	if err := loginFrom(t, a, Peer{}, SCRAMSHA256, "u", "admin", "pw"); !IsAuthFailed(err) {
		t.Fatalf("a dropped user after a failed proof: %v, want a failed login", err)
	}
	if obs.failed(FailUnknownUser) != 2 {
		t.Fatalf("failures: %v", obs.failures)
	}
}

// authenticationRestrictions: a login is allowed when its addresses meet
// one restriction document (each field present: one of its ranges),
// refused otherwise, and refused without addresses to check.
func TestAuthenticationRestrictions(t *testing.T) {
	a, up, _, obs := staleRig(t, time.Hour)
	var logs strings.Builder
	var logMu sync.Mutex
	a.SetLogger(slog.New(slog.NewTextHandler(&lockedWriter{mu: &logMu, w: &logs}, nil)))
	c := scramCreds(t, "r", "pw", "salt-one-16bytes", 4096)
	c.restrict = restrictions{
		{clientSource: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, serverAddress: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}},
		{clientSource: []netip.Prefix{netip.MustParsePrefix("2001:db8::/32")}},
	}
	up.set("r", "admin", c)
	for _, tc := range []struct {
		peer Peer
		ok   bool
	}{
		{Peer{Remote: "10.1.2.3:5000", Local: "127.0.0.1:27017"}, true},
		{Peer{Remote: "[::ffff:10.1.2.3]:5000", Local: "[::ffff:127.0.0.1]:27017"}, true},
		{Peer{Remote: "[2001:db8::1]:5000", Local: "[::1]:27017"}, true},
		{Peer{Remote: "192.168.1.1:5000", Local: "127.0.0.1:27017"}, false},
		{Peer{Remote: "10.1.2.3:5000", Local: "127.0.0.2:27017"}, false},
		{Peer{Remote: "/tmp/mongobouncer.sock", Local: "/tmp/mongobouncer.sock"}, false},
		{Peer{}, false},
	} {
		err := loginFrom(t, a, tc.peer, SCRAMSHA256, "r", "admin", "pw")
		if tc.ok && err != nil || !tc.ok && !IsAuthFailed(err) {
			t.Errorf("%+v: %v, want ok=%v", tc.peer, err, tc.ok)
		}
	}
	if n := obs.failed(FailRestricted); n != 4 {
		t.Fatalf("%d restricted failures, want 4 (%v)", n, obs.failures)
	}
	logMu.Lock()
	defer logMu.Unlock()
	out := logs.String()
	if n := strings.Count(out, "client login refused by the user's authenticationRestrictions"); n != 4 ||
		!strings.Contains(out, "remote=192.168.1.1:5000") || !strings.Contains(out, "user=r@admin") {
		t.Fatalf("%d log lines, want one per refused attempt naming user and addresses:\n%s", n, out)
	}
}

// lockedWriter serializes writes to w.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// usersInfo's authenticationRestrictions are read into the credentials;
// one that cannot be read refuses the user (not taken for none).
func TestRestrictionsFromUsersInfo(t *testing.T) {
	if _, err := parseRange("10.0.0.0/33"); err == nil {
		t.Fatal("a bad range accepted")
	}
	if p, err := parseRange("::ffff:10.0.0.0/104"); err != nil || p != netip.MustParsePrefix("10.0.0.0/8") {
		t.Fatalf("IPv4-mapped range: %v %v", p, err)
	}
	if p, err := parseRange("192.0.2.7"); err != nil || p != netip.MustParsePrefix("192.0.2.7/32") {
		t.Fatalf("a bare address: %v %v", p, err)
	}
	rs := restrictions{{clientSource: []netip.Prefix{}}}
	if rs.allows(Peer{Remote: "10.0.0.1:1", Local: "10.0.0.2:2"}, true) {
		t.Fatal("an empty clientSource list allows")
	}
	if !(restrictions{}).allows(Peer{}, false) {
		t.Fatal("no restriction refuses")
	}
}

// A user found missing is kept as long as a found one (by default), so
// that once one expires the other has too: timing does not tell a name
// upstream from one that is not.
func TestNegativeTTLIsThePositive(t *testing.T) {
	a, up, clock, _ := staleRig(t, 2*time.Minute)
	up.set("u", "admin", scramCreds(t, "u", "pw", "salt-one-16bytes", 4096))
	for _, u := range []string{"u", "ghost"} {
		_ = loginFrom(t, a, Peer{}, SCRAMSHA256, u, "admin", "pw")
	}
	clock.advance(time.Minute)
	for _, u := range []string{"u", "ghost"} {
		if _, err := a.cache.Get(context.Background(), u, "admin"); u == "u" && err != nil {
			t.Fatal(err)
		}
		if n := up.n(u, "admin"); n != 1 {
			t.Fatalf("%s: %d lookups within the TTL, want 1", u, n)
		}
	}
	clock.advance(time.Minute + time.Second)
	for _, u := range []string{"u", "ghost"} {
		_, _ = a.cache.Get(context.Background(), u, "admin")
		if n := up.n(u, "admin"); n != 2 {
			t.Fatalf("%s: %d lookups past the TTL, want 2", u, n)
		}
	}
}

// A failed proof's second look replaces the cached user only with a new
// answer. While the upstream cannot be asked (an election, a partition),
// anyone's wrong password neither makes the user's logins wait for the
// second look nor, once it fails, evicts the user: the user keeps logging
// in from the cache, and only the failing attempt fails (lookup_failed).
// Once the upstream answers again, its answer (here: not found) replaces
// the cached one.
func TestFailedProofKeepsCachedUserUntilANewAnswer(t *testing.T) {
	up := newUpstreamUsers()
	up.set("alice", "admin", scramCreds(t, "alice", "pw", "salt-one-16bytes", 4096))
	var down atomic.Bool
	asked := make(chan struct{}, 1)
	outage := make(chan struct{})
	c := NewCache(LookupFunc(func(ctx context.Context, user, db string) (Creds, error) {
		if down.Load() {
			select {
			case asked <- struct{}{}:
			default:
			}
			select { // no primary to be found for a while
			case <-outage:
			case <-ctx.Done():
			}
			return Creds{}, errors.New("no primary")
		}
		return up.Lookup(ctx, user, db)
	}), CacheOptions{PositiveTTL: time.Hour, Timeout: 2 * time.Second})
	clock := &fakeClock{now: time.Now()}
	c.now = clock.Now
	a := New(&Users{}, nil, c)
	obs := newCountingObserver()
	a.SetObserver(obs)
	alice := Peer{Remote: "192.0.2.1:5000", Local: "127.0.0.1:27017"}
	attacker := Peer{Remote: "203.0.113.9:4000", Local: "127.0.0.1:27017"}
	if err := loginFrom(t, a, alice, SCRAMSHA256, "alice", "admin", "pw"); err != nil {
		t.Fatal(err)
	}
	down.Store(true)
	clock.advance(time.Second)

	// A wrong password, by anyone: its second look is in flight, and
	// alice logs in from the cache meanwhile, without waiting for it.
	guess := make(chan error, 1)
	go func() { guess <- loginFrom(t, a, attacker, SCRAMSHA256, "alice", "admin", "guess") }()
	select {
	case <-asked:
	case <-time.After(5 * time.Second):
		t.Fatal("the failed proof did not look alice up again")
	}
	start := time.Now()
	err := loginFrom(t, a, alice, SCRAMSHA256, "alice", "admin", "pw")
	if d := time.Since(start); err != nil || d > time.Second {
		t.Errorf("the cached user during another client's second look: %v after %v", err, d)
	}
	close(outage)
	if err := <-guess; !IsAuthFailed(err) {
		t.Fatalf("a wrong password: %v", err)
	}

	// The second look failed: alice is still cached.
	if err := loginFrom(t, a, alice, SCRAMSHA256, "alice", "admin", "pw"); err != nil {
		t.Errorf("after another client's failed attempt, the cached user during the outage: %v", err)
	}
	clock.advance(time.Second)
	if err := loginFrom(t, a, attacker, SCRAMSHA256, "alice", "admin", "guess"); !IsAuthFailed(err) {
		t.Fatalf("a wrong password: %v", err)
	}
	if err := loginFrom(t, a, alice, SCRAMSHA256, "alice", "admin", "pw"); err != nil {
		t.Errorf("after a second failed attempt, the cached user during the outage: %v", err)
	}
	if n := obs.failed(FailLookupFailed); n != 2 {
		t.Errorf("%d failed attempts counted lookup_failed, want 2: %v", n, obs.failures)
	}

	// The upstream answers again: alice was dropped meanwhile, and the
	// next failed proof's answer replaces her cached credentials.
	down.Store(false)
	up.drop("alice", "admin")
	clock.advance(time.Second)
	if err := loginFrom(t, a, attacker, SCRAMSHA256, "alice", "admin", "guess"); !IsAuthFailed(err) {
		t.Fatalf("a wrong password: %v", err)
	}
	if err := loginFrom(t, a, alice, SCRAMSHA256, "alice", "admin", "pw"); !IsAuthFailed(err) {
		t.Fatalf("a user dropped upstream, after a failed proof's new answer: %v, want a failed login", err)
	}
}
