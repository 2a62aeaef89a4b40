package topology

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/auth"
	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// userOptions are testOptions with user pools whose connections log in
// as the pool's user.
func userOptions(rec *recorder, hosts ...string) Options {
	o := testOptions(rec, hosts...)
	o.UserDialer = func(a upstream.Authenticator) pool.Connector {
		return upstream.NewDialer(upstream.Options{AppName: poolApp, ConnectTimeout: 2 * time.Second,
			Logger: testLogger(), Authenticator: a})
	}
	o.UserPoolMonitor = func() pool.Monitor { return rec }
	return o
}

func scramAs(t *testing.T, user, password string) upstream.Authenticator {
	t.Helper()
	a, err := upstream.NewAuthenticator(upstream.Credential{Username: user, Password: password, Source: "admin"})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

var fakeUsers = []fakemongo.User{{Name: "alice", Password: "alice-pw"}, {Name: "bob", Password: "bob-pw"}}

// loggedIn returns the users the fake's open connections logged in as.
func loggedIn(fake *fakemongo.Server) []string {
	var out []string
	for _, u := range fake.AuthenticatedUsers() {
		if u != "" {
			out = append(out, u)
		}
	}
	slices.Sort(out)
	return out
}

// mustUserPool returns the pool of user ("name@db").
func mustUserPool(t *testing.T, s *Server, user string, a upstream.Authenticator) *pool.Pool {
	t.Helper()
	id, ok := auth.ParseUserID(user)
	if !ok {
		t.Fatalf("user %q", user)
	}
	p, err := s.UserPool(id, a)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestUserPoolsLogInAsTheirUserAndFollowTheServer(t *testing.T) {
	fake, err := fakemongo.Listen("127.0.0.1:0", fakemongo.Options{Users: fakeUsers})
	if err != nil {
		t.Fatal(err)
	}
	addr := fake.Addr()
	t.Cleanup(fake.Close)
	rec := &recorder{}
	topo := newTopology(t, userOptions(rec, addr))
	s := mustSelect(t, topo)

	alice := mustUserPool(t, s, "alice@admin", scramAs(t, "alice", "alice-pw"))
	if again := mustUserPool(t, s, "alice@admin", nil); again != alice {
		t.Fatal("a second UserPool call made another pool")
	}
	bob := mustUserPool(t, s, "bob@admin", scramAs(t, "bob", "bob-pw"))
	for _, p := range []*pool.Pool{alice, bob} {
		c, err := p.CheckOut(ctxTimeout(t, 5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if err := p.CheckIn(c); err != nil {
			t.Fatal(err)
		}
	}
	if got := loggedIn(fake); !slices.Equal(got, []string{"admin.alice", "admin.bob"}) {
		t.Fatalf("the upstream sees %v logged in", got)
	}
	if st := s.UserPools(); len(st) != 2 || st[0].User.String() != "alice@admin" || st[1].User.String() != "bob@admin" {
		t.Fatalf("UserPools = %+v", st)
	}
	// Selection's load counts the user pools' connections.
	c, _ := alice.CheckOut(ctxTimeout(t, 5*time.Second))
	if s.load() != 1 {
		t.Errorf("load %d with one user connection in use, want 1", s.load())
	}
	_ = alice.CheckIn(c)

	// The server dies: its user pools are cleared with it, and come back
	// when it does.
	fake.Close()
	eventually(t, "user pools paused", func() bool {
		return alice.Stats().State == pool.StatePaused && bob.Stats().State == pool.StatePaused
	})
	if _, err := bob.CheckOut(ctxTimeout(t, time.Second)); !errors.As(err, new(*pool.PoolClearedError)) {
		t.Fatalf("checkout of a dead server's user pool = %v", err)
	}
	var fake2 *fakemongo.Server
	eventually(t, "listening again on "+addr, func() bool {
		fake2, err = fakemongo.Listen(addr, fakemongo.Options{Users: fakeUsers})
		return err == nil
	})
	t.Cleanup(fake2.Close)
	eventually(t, "user pools ready again", func() bool {
		return alice.Stats().State == pool.StateReady && bob.Stats().State == pool.StateReady
	})

	topo.Close()
	if alice.Stats().State != pool.StateClosed || bob.Stats().State != pool.StateClosed {
		t.Fatal("Close left user pools open")
	}
	if _, err := s.UserPool(auth.UserID{User: "carol", DB: "admin"}, scramAs(t, "carol", "x")); !errors.As(err, new(*pool.PoolClosedError)) {
		t.Fatalf("UserPool on a closed topology = %v", err)
	}
}

// A login the upstream refuses pauses that user's pool only: the server
// stays usable for everyone else, and the user's next try comes with the
// server's next successful check, not with every client request.
func TestUserPoolLoginFailureIsTheUsersAlone(t *testing.T) {
	fake := fakemongo.Start(t, fakemongo.Options{Users: fakeUsers})
	rec := &recorder{}
	o := userOptions(rec, fake.Addr())
	// Polled, and rarely: no check comes before the test asks for one.
	o.MonitoringMode = MonitoringPoll
	o.HeartbeatInterval = 10 * time.Second
	topo := newTopology(t, o)
	s := selectAfterFirstCheck(t, topo)

	bad := mustUserPool(t, s, "bob@admin", scramAs(t, "bob", "wrong"))
	_, err := bad.CheckOut(ctxTimeout(t, 5*time.Second))
	var authErr *upstream.AuthError
	if !errors.As(err, &authErr) || !authErr.AuthenticationFailed() {
		t.Fatalf("checkout with a wrong password = %v, want an AuthError with code 18", err)
	}
	s.HandlePoolError(bad, err, nil)
	if bad.Stats().State != pool.StatePaused {
		t.Fatal("the failing user's pool is not paused")
	}
	if s.State() != Usable || s.Pool().Stats().State != pool.StateReady {
		t.Fatalf("one user's failed login changed the server: %v, main pool %v", s.State(), s.Pool().Stats().State)
	}
	// Checkouts meanwhile fail at once, saying why, without logging in.
	before := fake.AuthAttempts()
	for range 20 {
		_, err := bad.CheckOut(ctxTimeout(t, time.Second))
		var cleared *pool.PoolClearedError
		if !errors.As(err, &cleared) || !errors.As(cleared.Cause, &authErr) {
			t.Fatalf("checkout of the paused pool = %v, want the login failure as its cause", err)
		}
	}
	if n := fake.AuthAttempts() - before; n != 0 {
		t.Fatalf("%d logins while the pool was paused", n)
	}
	// Another user is served.
	good := mustUserPool(t, s, "alice@admin", scramAs(t, "alice", "alice-pw"))
	c, err := good.CheckOut(ctxTimeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	_ = good.CheckIn(c)
	// The next successful check readies the failing pool for one more try.
	s.RequestCheck()
	eventually(t, "the failing pool ready again", func() bool { return bad.Stats().State == pool.StateReady })

	// A stale failure (from before the last clear) changes nothing.
	gen := bad.Stats().Generation
	s.HandlePoolError(bad, &pool.ConnectionError{Address: fake.Addr(), Generation: gen - 1, Err: err}, nil)
	if bad.Stats().State != pool.StateReady {
		t.Fatal("a stale failure paused the pool")
	}
}

// A network failure on a user pool's connection is the server's: it is
// marked Unknown and all its pools are cleared.
func TestUserPoolNetworkErrorIsTheServers(t *testing.T) {
	fake := fakemongo.Start(t, fakemongo.Options{Users: fakeUsers})
	rec := &recorder{}
	o := userOptions(rec, fake.Addr())
	// No check comes to the rescue: the network error asks for one at
	// once, which would otherwise find the server again (and ready its
	// pools) before the assertion on a slow machine.
	o.HeartbeatInterval = time.Minute
	o.MinHeartbeatInterval = time.Minute
	topo := newTopology(t, o)
	s := selectAfterFirstCheck(t, topo)
	p := mustUserPool(t, s, "alice@admin", scramAs(t, "alice", "alice-pw"))
	c, err := p.CheckOut(ctxTimeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	s.HandlePoolError(p, &upstream.NetworkError{Op: "read", Err: errors.New("connection reset")}, c)
	c.MarkErrored(nil)
	_ = p.CheckIn(c)
	if s.State() != Unknown || s.Pool().Stats().State != pool.StatePaused || p.Stats().State != pool.StatePaused {
		t.Fatalf("after a network error: server %v, main pool %v, user pool %v", s.State(), s.Pool().Stats().State, p.Stats().State)
	}
}

func TestUserPoolLimitAndIdleClose(t *testing.T) {
	fake := fakemongo.Start(t, fakemongo.Options{Users: fakeUsers})
	rec := &recorder{}
	o := userOptions(rec, fake.Addr())
	o.Pool.MaxPoolSize = 10
	o.Pool.WaitQueueTimeout = 100 * time.Millisecond
	o.MaxUserConnections = 2
	o.UserPoolIdleTimeout = 200 * time.Millisecond
	topo := newTopology(t, o)
	s := mustSelect(t, topo)
	a := scramAs(t, "alice", "alice-pw")
	p := mustUserPool(t, s, "alice@admin", a)
	if m := p.Stats().Options.MaxPoolSize; m != 2 {
		t.Fatalf("user pool size %d, want max_user_connections 2", m)
	}
	c1, err1 := p.CheckOut(ctxTimeout(t, 5*time.Second))
	c2, err2 := p.CheckOut(ctxTimeout(t, 5*time.Second))
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	if _, err := p.CheckOut(ctxTimeout(t, 5*time.Second)); !errors.As(err, new(*pool.WaitQueueTimeoutError)) {
		t.Fatalf("a third connection for the user: %v, want a wait-queue timeout", err)
	}
	// In use, the pool is not idle however long it waits.
	time.Sleep(500 * time.Millisecond)
	if p.Stats().State == pool.StateClosed {
		t.Fatal("a pool with connections in use was closed as idle")
	}
	_ = p.CheckIn(c1)
	_ = p.CheckIn(c2)
	eventually(t, "the idle user pool closed", func() bool { return p.Stats().State == pool.StateClosed })
	if len(s.UserPools()) != 0 {
		t.Fatal("the closed pool is still listed")
	}
	eventually(t, "its connections closed upstream", func() bool { return len(loggedIn(fake)) == 0 })
	// The next request makes a new one.
	p2 := mustUserPool(t, s, "alice@admin", a)
	if p2 == p || p2.Stats().State != pool.StateReady {
		t.Fatal("no fresh pool after the idle one closed")
	}
	// Limits change live, capped for users.
	if err := s.SetPoolLimits(pool.Limits{MaxPoolSize: 5, MaxConnecting: 2, WaitQueueTimeout: time.Second}, 3); err != nil {
		t.Fatal(err)
	}
	if m := p2.Stats().Options.MaxPoolSize; m != 3 {
		t.Fatalf("after SetPoolLimits the user pool size is %d, want 3", m)
	}
	if m := s.Pool().Stats().Options.MaxPoolSize; m != 5 {
		t.Fatalf("after SetPoolLimits the main pool size is %d, want 5", m)
	}
}

// TestUserPoolsOfUsersWhoseNamesCollide: user "a" on database "b@c" and
// user "a@b" on database "c" both write "a@b@c"; they are two users, with
// a pool each, each logged in as its own user.
func TestUserPoolsOfUsersWhoseNamesCollide(t *testing.T) {
	fake, err := fakemongo.Listen("127.0.0.1:0", fakemongo.Options{Users: []fakemongo.User{
		{Name: "a", DB: "b@c", Password: "pw-1"}, {Name: "a@b", DB: "c", Password: "pw-2"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	topo := newTopology(t, userOptions(&recorder{}, fake.Addr()))
	s := mustSelect(t, topo)
	as := func(user, db, pw string) upstream.Authenticator {
		a, err := upstream.NewAuthenticator(upstream.Credential{Username: user, Password: pw, Source: db})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	one, err := s.UserPool(auth.UserID{User: "a", DB: "b@c"}, as("a", "b@c", "pw-1"))
	if err != nil {
		t.Fatal(err)
	}
	two, err := s.UserPool(auth.UserID{User: "a@b", DB: "c"}, as("a@b", "c", "pw-2"))
	if err != nil {
		t.Fatal(err)
	}
	if one == two || len(s.UserPools()) != 2 {
		t.Fatalf("one pool for two users (%d pools)", len(s.UserPools()))
	}
	for _, p := range []*pool.Pool{one, two} {
		c, err := p.CheckOut(ctxTimeout(t, 5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = p.CheckIn(c) }()
	}
	if got := loggedIn(fake); !slices.Equal(got, []string{"b@c.a", "c.a@b"}) {
		t.Fatalf("the upstream sees %v logged in", got)
	}
}

func TestUserPoolNeedsUserDialer(t *testing.T) {
	fake := fakemongo.Start(t, fakemongo.Options{})
	topo := newTopology(t, testOptions(&recorder{}, fake.Addr()))
	if _, err := mustSelect(t, topo).UserPool(auth.UserID{User: "u", DB: "admin"}, nil); !errors.Is(err, ErrNoUserPools) {
		t.Fatalf("UserPool without UserDialer = %v", err)
	}
}

// BenchmarkUserPoolLookup is the lookup every pass-through request makes
// before its checkout.
func BenchmarkUserPoolLookup(b *testing.B) {
	fake := fakemongo.Start(b, fakemongo.Options{Users: fakeUsers})
	topo := newTopology(b, userOptions(&recorder{}, fake.Addr()))
	s := mustSelect(b, topo)
	a, err := upstream.NewAuthenticator(upstream.Credential{Username: "alice", Password: "alice-pw", Source: "admin"})
	if err != nil {
		b.Fatal(err)
	}
	alice := auth.UserID{User: "alice", DB: "admin"}
	if _, err := s.UserPool(alice, a); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.UserPool(alice, a); err != nil {
			b.Fatal(err)
		}
	}
}

// selectAfterFirstCheck selects the one server once its first check is
// done. A selection made before it asks the monitor for another check,
// which comes MinHeartbeatInterval (500 ms) later: on a slow machine, in
// the middle of a test that counts on no check before it asks for one.
func selectAfterFirstCheck(t *testing.T, topo *Topology) *Server {
	t.Helper()
	within(t, "the first check", func() bool { return topo.TrySelectServer(Criteria{}) != nil })
	return mustSelect(t, topo)
}
