package topology

import (
	"context"
	"errors"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

func TestMonitorMarksUsableAndPoolServes(t *testing.T) {
	fake := fakemongo.Start(t, fakemongo.Options{})
	rec := &recorder{}
	topo := newTopology(t, testOptions(rec, fake.Addr()))

	s := mustSelect(t, topo)
	if s.Address() != fake.Addr() || topo.ServerByAddress(fake.Addr()) != s {
		t.Fatalf("selected %s, want %s", s.Address(), fake.Addr())
	}
	if topo.ServerByAddress("127.0.0.1:1") != nil {
		t.Fatal("ServerByAddress found an unknown address")
	}
	if s.State() != Usable || s.Kind() != KindStandalone {
		t.Fatalf("state %v kind %v, want Usable Standalone", s.State(), s.Kind())
	}
	h := s.Hello()
	if h == nil || h.MaxWireVersion != fakemongo.DefaultMaxWireVersion {
		t.Fatalf("hello %+v", h)
	}
	c := checkOut(t, s)
	if err := s.Pool().CheckIn(c); err != nil {
		t.Fatal(err)
	}
	wh, err := topo.WaitHello(ctxTimeout(t, time.Second))
	if err != nil || wh == nil || wh.MaxBSONObjectSize != fakemongo.DefaultMaxBSONObjectSize {
		t.Fatalf("WaitHello = %+v, %v", wh, err)
	}

	// Heartbeats keep going on the one monitoring connection: later checks
	// reuse it rather than dialling again, and parse the plain hello reply.
	n := len(rec.topoEvents(HeartbeatSucceeded, ""))
	eventually(t, "three more heartbeats", func() bool { return len(rec.topoEvents(HeartbeatSucceeded, "")) >= n+3 })
	if got := fake.Accepted(); got != 2 {
		t.Errorf("server accepted %d connections, want 2 (one monitoring, one pooled)", got)
	}
	if s.State() != Usable || s.Hello() == h || s.Hello().MaxWireVersion != fakemongo.DefaultMaxWireVersion {
		t.Errorf("after heartbeats: state %v, hello %+v", s.State(), s.Hello())
	}
	if s.RTT() <= 0 {
		t.Errorf("RTT = %v, want > 0", s.RTT())
	}
	if got := len(rec.poolEvents(pool.PoolReady, "")); got != 1 {
		t.Errorf("%d PoolReady events, want 1 (readying a ready pool is silent)", got)
	}
}

func TestServerDeathClearsPoolAndReturn(t *testing.T) {
	fake, err := fakemongo.Listen("127.0.0.1:0", fakemongo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	addr := fake.Addr()
	t.Cleanup(fake.Close)
	rec := &recorder{}
	o := testOptions(rec, addr)
	o.ServerSelectionTimeout = 300 * time.Millisecond
	topo := newTopology(t, o)

	s := mustSelect(t, topo)
	if err := s.Pool().CheckIn(checkOut(t, s)); err != nil {
		t.Fatal(err)
	}

	fake.Close()
	eventually(t, "server Unknown", func() bool { return s.State() == Unknown })
	eventually(t, "PoolCleared", func() bool { return len(rec.poolEvents(pool.PoolCleared, addr)) == 1 })
	if rec.poolEvents(pool.PoolCleared, addr)[0].InterruptInUseConnections {
		t.Error("a refused connection is not a timeout; in-use connections must not be interrupted")
	}
	if d := s.Description(); d.LastError == nil || d.Hello == nil || d.Kind != KindStandalone {
		t.Errorf("Unknown description %+v: want the error, and the last hello and kind kept", d)
	}
	if _, err := s.Pool().CheckOut(ctxTimeout(t, time.Second)); !errors.As(err, new(*pool.PoolClearedError)) {
		t.Errorf("CheckOut on the cleared pool = %v, want PoolClearedError", err)
	}

	_, err = topo.SelectServer(context.Background(), Criteria{})
	var se *SelectionError
	if !errors.As(err, &se) || !errors.Is(err, ErrSelectionTimeout) {
		t.Fatalf("SelectServer = %v, want a SelectionError timing out", err)
	}
	if se.Code() != HostUnreachableCode || se.CodeName() != "HostUnreachable" {
		t.Errorf("code %d %s", se.Code(), se.CodeName())
	}
	if len(se.Servers) != 1 || se.Servers[0].Address != addr || se.Servers[0].Err == nil || se.Servers[0].State != Unknown {
		t.Errorf("SelectionError servers %+v", se.Servers)
	}
	if msg := err.Error(); !strings.Contains(msg, addr) || !strings.Contains(msg, "Unknown") {
		t.Errorf("SelectionError message %q lacks the host and its state", msg)
	}
	// The context's own end is reported as such.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := topo.SelectServer(ctx, Criteria{}); !errors.Is(err, context.Canceled) || !errors.As(err, &se) {
		t.Errorf("SelectServer(cancelled) = %v", err)
	}

	// The server comes back on the same address.
	var fake2 *fakemongo.Server
	eventually(t, "listening again on "+addr, func() bool {
		fake2, err = fakemongo.Listen(addr, fakemongo.Options{Kind: fakemongo.Mongos})
		return err == nil
	})
	t.Cleanup(fake2.Close)
	eventually(t, "server Usable again", func() bool { return s.State() == Usable })
	if s.Kind() != KindMongos {
		t.Errorf("kind %v after restart as mongos", s.Kind())
	}
	s2 := mustSelect(t, topo)
	if err := s2.Pool().CheckIn(checkOut(t, s2)); err != nil {
		t.Fatal(err)
	}
	var changes []string
	for _, e := range rec.topoEvents(ServerChanged, addr) {
		changes = append(changes, e.Previous.State.String()+">"+e.New.State.String())
	}
	if got := strings.Join(changes, " "); got != "Unknown>Usable Usable>Unknown Unknown>Usable" {
		t.Errorf("state changes %q", got)
	}
}

func TestMonitorTimeoutInterruptsInUse(t *testing.T) {
	fake := fakemongo.Start(t, fakemongo.Options{})
	rec := &recorder{}
	o := testOptions(rec, fake.Addr())
	o.HeartbeatTimeout = 200 * time.Millisecond
	topo := newTopology(t, o)
	s := mustSelect(t, topo)
	inUse := checkOut(t, s)

	fake.SetFailPoint(fakemongo.FailPoint{
		Mode: fakemongo.FailAlwaysOn, FailCommands: []string{"hello"}, AppName: monitorApp,
		BlockConnection: true, BlockTime: 5 * time.Second,
	})
	eventually(t, "PoolCleared", func() bool { return len(rec.poolEvents(pool.PoolCleared, "")) > 0 })
	if ev := rec.poolEvents(pool.PoolCleared, "")[0]; !ev.InterruptInUseConnections {
		t.Fatalf("monitor timeout cleared with %+v, want InterruptInUseConnections", ev)
	}
	failed := rec.topoEvents(HeartbeatFailed, "")
	if len(failed) == 0 || !isTimeout(failed[0].Err) {
		t.Fatalf("heartbeat failures %+v, want a timeout", failed)
	}
	eventually(t, "in-use connection interrupted", inUse.Interrupted)
	_ = s.Pool().CheckIn(inUse)

	fake.ClearFailPoint()
	eventually(t, "server Usable again", func() bool { return s.State() == Usable })
	if err := s.Pool().CheckIn(checkOut(t, s)); err != nil {
		t.Fatal(err)
	}
}

func TestCheckNetworkErrorRetriedAtOnce(t *testing.T) {
	fake := fakemongo.Start(t, fakemongo.Options{})
	rec := &recorder{}
	o := testOptions(rec, fake.Addr())
	o.HeartbeatInterval = time.Minute // only the immediate retry can bring it back
	topo := newTopology(t, o)
	s := mustSelect(t, topo)
	// Let the checks requested by the selection above run, so that the
	// only pending request is the one made below.
	eventually(t, "no pending check request", func() bool { return len(s.checkNow) == 0 })
	time.Sleep(50 * time.Millisecond)
	ok := len(rec.topoEvents(HeartbeatSucceeded, ""))

	fake.CloseAllConns() // drops the monitoring connection; the server stays up
	s.RequestCheck()
	eventually(t, "failed check", func() bool { return len(rec.topoEvents(HeartbeatFailed, "")) == 1 })
	eventually(t, "retried check", func() bool { return len(rec.topoEvents(HeartbeatSucceeded, "")) == ok+1 })
	if s.State() != Usable {
		t.Fatalf("state %v after the retry", s.State())
	}
	if err := rec.topoEvents(HeartbeatFailed, "")[0].Err; !upstream.IsNetworkError(err) {
		t.Errorf("check error %v, want a network error", err)
	}
}

func TestMonitoringIgnoresSaturatedPool(t *testing.T) {
	fake := fakemongo.Start(t, fakemongo.Options{})
	rec := &recorder{}
	o := testOptions(rec, fake.Addr())
	o.HeartbeatInterval = 50 * time.Millisecond
	o.Pool.MaxPoolSize = 1
	topo := newTopology(t, o)
	s := mustSelect(t, topo)
	held := checkOut(t, s)

	// A second checkout waits for the only connection.
	errc := make(chan error, 1)
	go func() {
		c, err := s.Pool().CheckOut(ctxTimeout(t, 30*time.Second))
		if err == nil {
			_ = s.Pool().CheckIn(c)
		}
		errc <- err
	}()
	eventually(t, "a waiter", func() bool { return s.Pool().Stats().Waiters == 1 })

	// Checks go on while the pool is saturated.
	n := len(rec.topoEvents(HeartbeatSucceeded, ""))
	eventually(t, "heartbeats while saturated", func() bool { return len(rec.topoEvents(HeartbeatSucceeded, "")) >= n+3 })
	if w := s.Pool().Stats().Waiters; w != 1 {
		t.Fatalf("%d waiters, want the checkout still waiting", w)
	}
	monitorConns := 0
	for _, c := range fake.Conns() {
		if c.AppName == monitorApp {
			monitorConns++
		}
	}
	if monitorConns != 1 {
		t.Errorf("%d monitoring connections open, want 1 of its own", monitorConns)
	}

	// And they notice the server's death, which frees the waiter at once
	// instead of after its 30s context.
	start := time.Now()
	fake.Kill()
	select {
	case err := <-errc:
		if !errors.As(err, new(*pool.PoolClearedError)) {
			t.Errorf("waiting checkout failed with %v, want PoolClearedError", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the waiting checkout was not failed by the clear")
	}
	t.Logf("waiter released %v after the kill", time.Since(start))
	held.MarkErrored(io.EOF)
	_ = s.Pool().CheckIn(held)
}

func TestHandleError(t *testing.T) {
	fake := fakemongo.Start(t, fakemongo.Options{})
	rec := &recorder{}
	o := testOptions(rec, fake.Addr())
	o.HeartbeatInterval = time.Minute // recoveries come from the requested checks
	topo := newTopology(t, o)
	s := mustSelect(t, topo)
	gen := func() uint64 { return s.Pool().Stats().Generation }
	usableAgain := func() { eventually(t, "server Usable again", func() bool { return s.State() == Usable }) }
	addr := fake.Addr()
	eof := &upstream.NetworkError{Addr: addr, Op: "read", Err: io.EOF}
	timeout := &upstream.NetworkError{Addr: addr, Op: "read", Err: os.ErrDeadlineExceeded}

	c1 := checkOut(t, s)
	g0 := gen()
	noEffect := []error{
		timeout,
		&upstream.CommandError{Code: 11000, CodeName: "DuplicateKey"},
		&pool.WaitQueueTimeoutError{Address: addr},
		&pool.PoolClearedError{Address: addr},
		&pool.PoolClosedError{Address: addr},
		&upstream.ConnectError{Addr: addr, Stage: "dial", Err: context.Canceled},
		// CMAP's backpressure rule: a connection that broke or timed out
		// while being established.
		&pool.ConnectionError{Address: addr, Generation: g0, Err: &upstream.ConnectError{Addr: addr, Stage: "dial",
			Err: &upstream.NetworkError{Addr: addr, Op: "dial", Err: syscall.ECONNREFUSED}}},
		&pool.ConnectionError{Address: addr, Generation: g0, Err: &upstream.ConnectError{Addr: addr, Stage: "hello",
			Err: &upstream.NetworkError{Addr: addr, Op: "read", Err: os.ErrDeadlineExceeded}}},
	}
	for _, err := range noEffect {
		s.HandleError(err, c1)
		s.HandleError(err, nil)
		if s.State() != Usable || gen() != g0 {
			t.Fatalf("after %T %v: state %v generation %d, want no change", err, err, s.State(), gen())
		}
	}

	// A network error on a current connection: Unknown and cleared, then
	// back at once thanks to the requested check.
	s.HandleError(eof, c1)
	if s.State() != Unknown || gen() != g0+1 {
		t.Fatalf("after EOF: state %v generation %d", s.State(), gen())
	}
	if !errors.Is(s.Description().LastError, io.EOF) {
		t.Errorf("LastError %v", s.Description().LastError)
	}
	usableAgain()
	// The same error from the now stale connection changes nothing.
	s.HandleError(eof, c1)
	if s.State() != Usable || gen() != g0+1 {
		t.Fatalf("stale EOF: state %v generation %d", s.State(), gen())
	}
	c1.MarkErrored(eof)
	_ = s.Pool().CheckIn(c1)

	// State-change errors: Unknown; the pool is cleared only on shutdown
	// (the server is 8.0, so a stepdown keeps its connections).
	c2 := checkOut(t, s)
	s.HandleError(&upstream.CommandError{Code: 10107, CodeName: "NotWritablePrimary"}, c2)
	if s.State() != Unknown || gen() != g0+1 {
		t.Fatalf("NotWritablePrimary: state %v generation %d", s.State(), gen())
	}
	usableAgain()
	s.HandleError(&upstream.CommandError{Code: 91, CodeName: "ShutdownInProgress"}, c2)
	if s.State() != Unknown || gen() != g0+2 {
		t.Fatalf("ShutdownInProgress: state %v generation %d", s.State(), gen())
	}
	usableAgain()
	_ = s.Pool().CheckIn(c2)

	// A failed establishment that is no I/O failure, from CheckOut or the
	// background: handled with the generation it started in.
	refused := &upstream.ConnectError{Addr: addr, Stage: "auth", Err: &upstream.CommandError{Code: 18, CodeName: "AuthenticationFailed"}}
	s.HandleError(&pool.ConnectionError{Address: addr, Generation: g0, Err: refused}, nil)
	if s.State() != Usable || gen() != g0+2 {
		t.Fatalf("stale ConnectionError: state %v generation %d", s.State(), gen())
	}
	s.HandleError(&pool.ConnectionError{Address: addr, Generation: g0 + 2, Err: refused}, nil)
	if s.State() != Unknown || gen() != g0+3 {
		t.Fatalf("ConnectionError: state %v generation %d", s.State(), gen())
	}
	usableAgain()
	if got := len(rec.poolEvents(pool.PoolCleared, "")); got != 3 {
		t.Errorf("%d PoolCleared events, want 3", got)
	}
}

func TestBackgroundErrorClearsPool(t *testing.T) {
	fake := fakemongo.Start(t, fakemongo.Options{})
	// The first pool handshake is refused (a hello that fails, not a
	// connection that breaks); monitoring is unaffected.
	fake.SetFailPoint(fakemongo.FailPoint{
		Mode: fakemongo.FailTimes, Times: 1, FailCommands: []string{"hello"}, AppName: poolApp, ErrorCode: 2,
	})
	rec := &recorder{}
	o := testOptions(rec, fake.Addr())
	o.HeartbeatInterval = time.Minute
	o.Pool.MinPoolSize = 2
	topo := newTopology(t, o)
	s := topo.Servers()[0]

	eventually(t, "PoolCleared", func() bool { return len(rec.poolEvents(pool.PoolCleared, "")) == 1 })
	var sawCause bool
	for _, e := range rec.topoEvents(ServerChanged, "") {
		if e.New.State == Unknown && errors.As(e.Err, new(*pool.ConnectionError)) {
			sawCause = true
		}
	}
	if !sawCause {
		t.Error("no change to Unknown caused by the background ConnectionError")
	}
	eventually(t, "minPoolSize reached after recovery", func() bool {
		st := s.Pool().Stats()
		return s.State() == Usable && st.Total >= 2
	})
}

// TestHandshakeNetworkErrorIsBackpressure: a pooled connection that
// breaks or times out in its handshake is labelled SystemOverloadedError
// (CMAP's backpressure rule) and leaves the server Usable and its pool
// uncleared, as SDAM says for such errors.
func TestHandshakeNetworkErrorIsBackpressure(t *testing.T) {
	for _, tc := range []struct {
		name string
		fp   fakemongo.FailPoint
	}{
		{"closed", fakemongo.FailPoint{CloseConnection: true}},
		{"timeout", fakemongo.FailPoint{BlockConnection: true, BlockTime: 3 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := fakemongo.Start(t, fakemongo.Options{})
			rec := &recorder{}
			o := testOptions(rec, fake.Addr())
			o.HeartbeatInterval = time.Minute
			o.Dialer = upstream.NewDialer(upstream.Options{AppName: poolApp, ConnectTimeout: 300 * time.Millisecond, Logger: testLogger()})
			topo := newTopology(t, o)
			s := selectAfterFirstCheck(t, topo)
			fp := tc.fp
			fp.Mode, fp.Times, fp.FailCommands, fp.AppName = fakemongo.FailTimes, 1, []string{"hello"}, poolApp
			fake.SetFailPoint(fp)

			_, err := s.Pool().CheckOut(context.Background())
			var ce *upstream.ConnectError
			if !errors.As(err, &ce) || ce.Stage != "hello" {
				t.Fatalf("CheckOut = %v, want a failed hello", err)
			}
			s.HandleError(err, nil)
			if s.State() != Usable || s.Pool().Stats().Generation != 0 {
				t.Errorf("after %v: state %v, generation %d; want Usable and uncleared", err, s.State(), s.Pool().Stats().Generation)
			}
			if n := len(rec.poolEvents(pool.PoolCleared, "")); n != 0 {
				t.Errorf("%d PoolCleared events", n)
			}
			for _, e := range rec.topoEvents(ServerChanged, "") {
				if e.New.State == Unknown {
					t.Errorf("server marked Unknown: %v", e.Err)
				}
			}
			c := checkOut(t, s)
			_ = s.Pool().CheckIn(c)
		})
	}
}

func TestTwoMongosRoundRobin(t *testing.T) {
	a := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos})
	b := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos})
	rec := &recorder{}
	o := testOptions(rec, a.Addr(), b.Addr())
	o.Selection = SelectRoundRobin
	topo := newTopology(t, o)
	waitAllUsable(t, topo)

	counts := map[string]int{}
	for range 100 {
		counts[mustSelect(t, topo).Address()]++
	}
	if counts[a.Addr()] != 50 || counts[b.Addr()] != 50 {
		t.Fatalf("round-robin distribution %v, want 50/50", counts)
	}
}

func TestTwoMongosLeastBusy(t *testing.T) {
	a := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos})
	b := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos})
	rec := &recorder{}
	topo := newTopology(t, testOptions(rec, a.Addr(), b.Addr()))
	waitAllUsable(t, topo)
	sa, sb := topo.ServerByAddress(a.Addr()), topo.ServerByAddress(b.Addr())

	// Idle: ties alternate.
	counts := map[*Server]int{}
	for range 100 {
		counts[mustSelect(t, topo)]++
	}
	if counts[sa] != 50 || counts[sb] != 50 {
		t.Fatalf("idle distribution a=%d b=%d, want 50/50", counts[sa], counts[sb])
	}

	// One connection busy on a: everything goes to b.
	ca := checkOut(t, sa)
	for range 20 {
		if s := mustSelect(t, topo); s != sb {
			t.Fatalf("selected %s while a is busy and b idle", s.Address())
		}
	}
	// Two busy on b: a is now the less busy.
	cb1, cb2 := checkOut(t, sb), checkOut(t, sb)
	for range 20 {
		if s := mustSelect(t, topo); s != sa {
			t.Fatalf("selected %s while b is busier", s.Address())
		}
	}
	for _, c := range []*pool.Conn{cb1, cb2} {
		_ = sb.Pool().CheckIn(c)
	}
	_ = sa.Pool().CheckIn(ca)

	// Under concurrent load both servers serve.
	var wg sync.WaitGroup
	var mu sync.Mutex
	served := map[*Server]int{}
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				s, err := topo.SelectServer(context.Background(), Criteria{})
				if err != nil {
					t.Error(err)
					return
				}
				c, err := s.Pool().CheckOut(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				served[s]++
				mu.Unlock()
				time.Sleep(100 * time.Microsecond)
				_ = s.Pool().CheckIn(c)
			}
		}()
	}
	wg.Wait()
	if served[sa] < 50 || served[sb] < 50 {
		t.Errorf("concurrent least-busy served a=%d b=%d of 400", served[sa], served[sb])
	}
}

func waitAllUsable(t *testing.T, topo *Topology) {
	t.Helper()
	eventually(t, "all servers Usable", func() bool {
		for _, s := range topo.Servers() {
			if s.State() != Usable {
				return false
			}
		}
		return len(topo.sel.Load().writable) == len(topo.Servers())
	})
}

func TestSecondaryNotSelected(t *testing.T) {
	fake := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.ReplicaSetMember, SetName: "rs0", Secondary: true})
	rec := &recorder{}
	o := testOptions(rec, fake.Addr())
	o.ServerSelectionTimeout = 200 * time.Millisecond
	topo := newTopology(t, o)
	s := topo.Servers()[0]
	eventually(t, "secondary checked", func() bool { return s.State() == Usable })
	if s.Kind() != KindRSSecondary {
		t.Fatalf("kind %v", s.Kind())
	}
	if s := topo.TrySelectServer(Criteria{}); s != nil {
		t.Fatalf("TrySelectServer = %v, want nil for a secondary", s.Address())
	}
	_, err := topo.SelectServer(context.Background(), Criteria{})
	if !errors.Is(err, ErrSelectionTimeout) || !strings.Contains(err.Error(), "not selectable") {
		t.Fatalf("SelectServer = %v, want a timeout naming the unselectable secondary", err)
	}
	// WaitHello still describes the upstream.
	if h, err := topo.WaitHello(context.Background()); err != nil || h.SetName != "rs0" {
		t.Fatalf("WaitHello = %+v, %v", h, err)
	}
}

func TestPrimarySelected(t *testing.T) {
	fake := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.ReplicaSetMember, SetName: "rs0"})
	topo := newTopology(t, testOptions(&recorder{}, fake.Addr()))
	s := mustSelect(t, topo)
	if s.Kind() != KindRSPrimary {
		t.Fatalf("kind %v", s.Kind())
	}
	if got := topo.TrySelectServer(Criteria{}); got != s {
		t.Fatalf("TrySelectServer = %v, want the primary", got)
	}
}

func TestLoadBalanced(t *testing.T) {
	fake := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos, LoadBalanced: true})
	rec := &recorder{}
	o := testOptions(rec, fake.Addr())
	o.Pool.LoadBalanced = true
	o.Dialer = upstream.NewDialer(upstream.Options{AppName: poolApp, LoadBalanced: true, Logger: testLogger()})
	o.MonitorDialer = upstream.NewDialer(upstream.Options{AppName: monitorApp, LoadBalanced: true, Logger: testLogger()})
	topo := newTopology(t, o)

	// Selectable before any check: there is no SDAM behind a load balancer.
	s, err := topo.SelectServer(ctxTimeout(t, time.Millisecond), Criteria{})
	if err != nil || s.Kind() != KindLoadBalancer {
		t.Fatalf("SelectServer = %v, %v", s, err)
	}
	h, err := topo.WaitHello(ctxTimeout(t, 10*time.Second))
	if err != nil || !h.HasServiceID || h.ServiceID != fake.ServiceID() {
		t.Fatalf("WaitHello = %+v, %v", h, err)
	}
	c := checkOut(t, s)
	s.HandleError(&upstream.NetworkError{Addr: fake.Addr(), Op: "read", Err: io.EOF}, c)
	if s.State() != Usable {
		t.Fatal("a load-balanced server was marked Unknown")
	}
	cleared := rec.poolEvents(pool.PoolCleared, "")
	if len(cleared) != 1 || !cleared[0].HasServiceID || cleared[0].ServiceID != fake.ServiceID() {
		t.Fatalf("PoolCleared events %+v, want one for the service", cleared)
	}
	c.MarkErrored(io.EOF)
	_ = s.Pool().CheckIn(c)

	// A dead load balancer keeps the server selectable; checkouts fail.
	fake.Close()
	n := len(rec.topoEvents(HeartbeatFailed, ""))
	eventually(t, "failed heartbeat", func() bool { return len(rec.topoEvents(HeartbeatFailed, "")) > n })
	if s.State() != Usable {
		t.Fatal("a load-balanced server was marked Unknown by its monitor")
	}
}

func TestSelectionTimeoutNamesEveryHost(t *testing.T) {
	a, b := deadAddr(t), deadAddr(t)
	rec := &recorder{}
	o := testOptions(rec, a, b)
	o.ServerSelectionTimeout = 100 * time.Millisecond
	topo := newTopology(t, o)
	eventually(t, "both checked", func() bool {
		for _, s := range topo.Servers() {
			if s.Description().LastError == nil {
				return false
			}
		}
		return true
	})
	_, err := topo.SelectServer(context.Background(), Criteria{})
	var se *SelectionError
	if !errors.As(err, &se) || !errors.Is(err, ErrSelectionTimeout) {
		t.Fatalf("SelectServer = %v", err)
	}
	if len(se.Servers) != 2 {
		t.Fatalf("servers %+v", se.Servers)
	}
	// Servers are listed by address, as the topology keeps them.
	want := []string{a, b}
	slices.Sort(want)
	for i, addr := range want {
		st := se.Servers[i]
		if st.Address != addr || st.State != Unknown || !errors.As(st.Err, new(*upstream.ConnectError)) {
			t.Errorf("server %d: %+v", i, st)
		}
		if !strings.Contains(err.Error(), addr) {
			t.Errorf("message %q lacks %s", err, addr)
		}
	}
	if len(rec.poolEvents(pool.PoolReady, "")) != 0 {
		t.Error("a pool of an unreachable server was readied")
	}
	if _, err := topo.WaitHello(context.Background()); !errors.Is(err, ErrSelectionTimeout) {
		t.Errorf("WaitHello = %v", err)
	}
}

func TestWaitHelloWaitsForFirstCheck(t *testing.T) {
	fake := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos})
	fake.SetFailPoint(fakemongo.FailPoint{
		Mode: fakemongo.FailTimes, Times: 1, FailCommands: []string{"hello"}, AppName: monitorApp,
		BlockConnection: true, BlockTime: 200 * time.Millisecond,
	})
	topo := newTopology(t, testOptions(&recorder{}, fake.Addr()))
	h, err := topo.WaitHello(ctxTimeout(t, 10*time.Second))
	if err != nil || h.Msg != "isdbgrid" {
		t.Fatalf("WaitHello = %+v, %v", h, err)
	}
}

func TestCloseWakesWaiters(t *testing.T) {
	o := testOptions(&recorder{}, deadAddr(t))
	o.ServerSelectionTimeout = time.Minute
	topo, err := New("closing", o)
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	go func() {
		_, err := topo.SelectServer(context.Background(), Criteria{})
		errs <- err
	}()
	go func() {
		_, err := topo.WaitHello(context.Background())
		errs <- err
	}()
	time.Sleep(50 * time.Millisecond)
	topo.Close()
	for range 2 {
		select {
		case err := <-errs:
			if !errors.Is(err, ErrClosed) || !errors.As(err, new(*SelectionError)) {
				t.Errorf("waiter got %v, want ErrClosed", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Close did not wake a waiter")
		}
	}
	if _, err := topo.SelectServer(context.Background(), Criteria{}); !errors.Is(err, ErrClosed) {
		t.Errorf("SelectServer after Close = %v", err)
	}
	topo.Close() // idempotent
	// Errors reported after Close are ignored.
	topo.Servers()[0].HandleError(io.EOF, nil)
}

func TestCloseStopsMonitorsOfLiveServers(t *testing.T) {
	fake := fakemongo.Start(t, fakemongo.Options{})
	topo, err := New("closing", testOptions(&recorder{}, fake.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	s := mustSelect(t, topo)
	c := checkOut(t, s)
	topo.Close()
	if st := s.Pool().Stats().State; st != pool.StateClosed {
		t.Errorf("pool state %v after Close", st)
	}
	_ = s.Pool().CheckIn(c)
	eventually(t, "monitoring connection closed", func() bool {
		for _, ci := range fake.Conns() {
			if ci.AppName == monitorApp {
				return false
			}
		}
		return true
	})
}
