package pool_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/pool"
)

func TestOptionsValidate(t *testing.T) {
	if err := pool.DefaultOptions().Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	d := pool.DefaultOptions()
	if d.MaxPoolSize != 100 || d.MinPoolSize != 0 || d.MaxConnecting != 2 || d.MaxIdleTime != 0 || d.WaitQueueTimeout != 0 {
		t.Errorf("unexpected defaults %+v", d)
	}
	bad := map[string]func(o *pool.Options){
		"MaxPoolSize<0":   func(o *pool.Options) { o.MaxPoolSize = -1 },
		"MinPoolSize<0":   func(o *pool.Options) { o.MinPoolSize = -1 },
		"Min>Max":         func(o *pool.Options) { o.MaxPoolSize, o.MinPoolSize = 2, 3 },
		"MaxConnecting=0": func(o *pool.Options) { o.MaxConnecting = 0 },
		"MaxIdleTime<0":   func(o *pool.Options) { o.MaxIdleTime = -time.Second },
		"WaitQueue<0":     func(o *pool.Options) { o.WaitQueueTimeout = -time.Second },
	}
	for name, f := range bad {
		o := pool.DefaultOptions()
		f(&o)
		if err := o.Validate(); !errors.Is(err, pool.ErrInvalidOptions) {
			t.Errorf("%s: Validate = %v, want ErrInvalidOptions", name, err)
		}
		if _, err := pool.New("a:1", &mockConnector{}, o); !errors.Is(err, pool.ErrInvalidOptions) {
			t.Errorf("%s: New = %v, want ErrInvalidOptions", name, err)
		}
	}
	o := pool.DefaultOptions()
	o.MaxPoolSize, o.MinPoolSize = 0, 500 // unlimited max: any min is fine
	if err := o.Validate(); err != nil {
		t.Errorf("min with unlimited max: %v", err)
	}
	if _, err := pool.New("", &mockConnector{}, pool.DefaultOptions()); err == nil {
		t.Error("New accepted an empty address")
	}
	if _, err := pool.New("a:1", nil, pool.DefaultOptions()); err == nil {
		t.Error("New accepted a nil connector")
	}
}

func TestEventTypeNames(t *testing.T) {
	want := []string{"ConnectionPoolCreated", "ConnectionPoolReady", "ConnectionPoolCleared", "ConnectionPoolClosed",
		"ConnectionCreated", "ConnectionReady", "ConnectionClosed", "ConnectionCheckOutStarted",
		"ConnectionCheckOutFailed", "ConnectionCheckedOut", "ConnectionCheckedIn"}
	for i, w := range want {
		if got := pool.EventType(i + 1).String(); got != w {
			t.Errorf("EventType(%d) = %q, want %q", i+1, got, w)
		}
	}
	if pool.EventType(0).String() == "" || pool.EventType(200).String() == "" {
		t.Error("unknown event types must still have a name")
	}
}

func TestMonitorsFanOut(t *testing.T) {
	if pool.Monitors() != nil || pool.Monitors(nil, nil) != nil {
		t.Fatal("Monitors of nothing must be nil")
	}
	var a, b int
	ma := pool.MonitorFunc(func(pool.Event) { a++ })
	mb := pool.MonitorFunc(func(pool.Event) { b++ })
	m := pool.Monitors(nil, pool.Monitors(ma, nil), mb)
	m.HandleEvent(pool.Event{Type: pool.PoolReady})
	if a != 1 || b != 1 {
		t.Fatalf("fan-out delivered a=%d b=%d", a, b)
	}
}

func TestStartsPausedAndReady(t *testing.T) {
	p, _ := newTestPool(t, &mockConnector{}, pool.DefaultOptions())
	if s := p.Stats(); s.State != pool.StatePaused || s.State.String() != "paused" {
		t.Fatalf("new pool state %v", s.State)
	}
	_, err := p.CheckOut(ctxT(t))
	var pce *pool.PoolClearedError
	if !errors.As(err, &pce) || !pce.Retryable() || pce.Address != p.Address() {
		t.Fatalf("checkout of a paused pool: %v", err)
	}
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	c, err := p.CheckOut(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if c.ID() != 1 || c.Address() != p.Address() || c.Generation() != 0 || c.Upstream() == nil {
		t.Errorf("conn id=%d addr=%s gen=%d", c.ID(), c.Address(), c.Generation())
	}
	if _, ok := c.ServiceID(); ok {
		t.Error("non-LB connection has a serviceId")
	}
	if err := p.CheckIn(c); err != nil {
		t.Fatal(err)
	}
	p.Close()
	p.Close() // idempotent
	if err := p.Ready(); !errors.As(err, new(*pool.PoolClosedError)) {
		t.Errorf("Ready on a closed pool: %v", err)
	}
	if _, err := p.CheckOut(ctxT(t)); !errors.As(err, new(*pool.PoolClosedError)) {
		t.Errorf("checkout of a closed pool: %v", err)
	}
	p.Clear(true) // no-op, must not panic or emit
	if s := p.Stats(); s.State != pool.StateClosed || s.Total != 0 {
		t.Errorf("closed stats %+v", s)
	}
}

func TestCheckInMisuse(t *testing.T) {
	p1, _ := newTestPool(t, &mockConnector{}, pool.DefaultOptions())
	p2, _ := newTestPool(t, &mockConnector{}, pool.DefaultOptions())
	for _, p := range []*pool.Pool{p1, p2} {
		if err := p.Ready(); err != nil {
			t.Fatal(err)
		}
	}
	c, err := p1.CheckOut(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := p2.CheckIn(c); !errors.Is(err, pool.ErrForeignConn) {
		t.Errorf("foreign check-in: %v", err)
	}
	if err := p1.CheckIn(nil); !errors.Is(err, pool.ErrNilConn) {
		t.Errorf("nil check-in: %v", err)
	}
	if err := p1.CheckIn(c); err != nil {
		t.Fatal(err)
	}
	if err := p1.CheckIn(c); !errors.Is(err, pool.ErrNotCheckedOut) {
		t.Errorf("double check-in: %v", err)
	}
	if s := p1.Stats(); s.Available != 1 || s.InUse != 0 || s.Total != 1 {
		t.Errorf("after misuse: %+v", s.Counts)
	}
}

// Checkouts that had to wait complete in the order they arrived.
func TestFairness(t *testing.T) {
	o := pool.DefaultOptions()
	o.MaxPoolSize = 1
	p, _ := newTestPool(t, &mockConnector{}, o)
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	held, err := p.CheckOut(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	const n = 16
	type got struct {
		i int
		c *pool.Conn
	}
	results := make(chan got, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := p.CheckOut(ctxT(t))
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			results <- got{i, c}
		}()
		waitUntil(t, func() bool { return p.Stats().Waiters == i+1 }, "waiter %d queued", i)
	}
	// A newcomer that finds the connection available must still queue behind them.
	for want := range n {
		if err := p.CheckIn(held); err != nil {
			t.Fatal(err)
		}
		r := <-results
		if r.i != want {
			t.Fatalf("checkout %d completed in position %d", r.i, want)
		}
		held = r.c
	}
	wg.Wait()
	if err := p.CheckIn(held); err != nil {
		t.Fatal(err)
	}
}

// A newcomer never takes an available connection ahead of a waiter.
func TestNoOvertakingOnFastPath(t *testing.T) {
	o := pool.DefaultOptions()
	o.MaxPoolSize = 1
	p, rec := newTestPool(t, &mockConnector{}, o)
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	c, err := p.CheckOut(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan *pool.Conn, 1)
	go func() {
		c, err := p.CheckOut(ctxT(t))
		if err != nil {
			t.Error(err)
		}
		done <- c
	}()
	waitUntil(t, func() bool { return p.Stats().Waiters == 1 }, "waiter queued")
	if err := p.CheckIn(c); err != nil {
		t.Fatal(err)
	}
	c2 := <-done
	if c2 == nil || c2.ID() != c.ID() {
		t.Fatal("waiter did not get the returned connection")
	}
	// The hand-over happened inside CheckIn: CheckedIn immediately followed by CheckedOut.
	ev := onlyTypes(rec.snapshot(), pool.ConnectionCheckedIn, pool.ConnectionCheckedOut)
	if n := len(ev); n != 3 || ev[1].Type != pool.ConnectionCheckedIn || ev[2].Type != pool.ConnectionCheckedOut {
		t.Fatalf("events %v", types(ev))
	}
	if err := p.CheckIn(c2); err != nil {
		t.Fatal(err)
	}
}

// A slow establishment does not hold up checkouts that can use available connections,
// nor any other pool method.
func TestSlowEstablishmentDoesNotBlock(t *testing.T) {
	release := make(chan struct{})
	mc := &mockConnector{delay: func(id int64) time.Duration {
		if id == 2 {
			<-release
		}
		return 0
	}}
	p, _ := newTestPool(t, mc, pool.DefaultOptions())
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	c1, err := p.CheckOut(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	slow := make(chan error, 1)
	go func() {
		c, err := p.CheckOut(ctxT(t))
		if err == nil {
			err = p.CheckIn(c)
		}
		slow <- err
	}()
	waitUntil(t, func() bool { return p.Stats().Pending == 1 }, "connection 2 pending")
	if err := p.CheckIn(c1); err != nil {
		t.Fatal(err)
	}
	done := make(chan *pool.Conn, 1)
	go func() {
		c, err := p.CheckOut(ctxT(t))
		if err != nil {
			t.Error(err)
		}
		done <- c
	}()
	select {
	case c := <-done:
		if c == nil || c.ID() != 1 {
			t.Fatalf("got %v, want connection 1", c)
		}
		if s := p.Stats(); s.Pending != 1 {
			t.Fatalf("connection 2 no longer pending: %+v", s.Counts)
		}
		if err := p.CheckIn(c); err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("checkout of an available connection blocked behind a slow establishment")
	}
	close(release)
	if err := <-slow; err != nil {
		t.Fatal(err)
	}
}

func TestUseChecksInOnErrorAndPanic(t *testing.T) {
	p, rec := newTestPool(t, &mockConnector{}, pool.DefaultOptions())
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	errApp := errors.New("application error")
	var id int64
	err := p.Use(ctxT(t), func(c *pool.Conn) error { id = c.ID(); return errApp })
	if !errors.Is(err, errApp) {
		t.Fatalf("Use returned %v", err)
	}
	if s := p.Stats(); s.Available != 1 || s.InUse != 0 {
		t.Fatalf("after fn error the connection is not available again: %+v", s.Counts)
	}
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("panic not propagated: %v", r)
			}
		}()
		_ = p.Use(ctxT(t), func(c *pool.Conn) error {
			if c.ID() != id {
				t.Errorf("Use got connection %d, want the available %d", c.ID(), id)
			}
			panic("boom")
		})
	}()
	if s := p.Stats(); s.Total != 0 || s.InUse != 0 {
		t.Fatalf("after a panic the connection must be closed: %+v", s.Counts)
	}
	closed := onlyTypes(rec.snapshot(), pool.ConnectionClosed)
	if len(closed) != 1 || closed[0].Reason != pool.ReasonError || closed[0].Err == nil {
		t.Fatalf("closed events %v", types(closed))
	}
	// fn checking the connection in itself is reported, and Use does not check in a
	// connection that was lent to someone else meanwhile.
	var other *pool.Conn
	err = p.Use(ctxT(t), func(c *pool.Conn) error {
		if err := p.CheckIn(c); err != nil {
			return err
		}
		var err error
		other, err = p.CheckOut(ctxT(t))
		return err
	})
	if !errors.Is(err, pool.ErrNotCheckedOut) {
		t.Fatalf("Use after fn checked in: %v", err)
	}
	if s := p.Stats(); s.InUse != 1 {
		t.Fatalf("Use checked in a connection it did not own: %+v", s.Counts)
	}
	if err := p.CheckIn(other); err != nil {
		t.Fatal(err)
	}
}

func TestMarkErrored(t *testing.T) {
	mc := &mockConnector{}
	p, rec := newTestPool(t, mc, pool.DefaultOptions())
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	c, err := p.CheckOut(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	ioErr := errors.New("read: connection reset")
	c.MarkErrored(ioErr)
	c.MarkErrored(errors.New("second")) // the first error wins
	if err := p.CheckIn(c); err != nil {
		t.Fatal(err)
	}
	closed := onlyTypes(rec.snapshot(), pool.ConnectionClosed)
	if len(closed) != 1 || closed[0].Reason != pool.ReasonError || !errors.Is(closed[0].Err, ioErr) {
		t.Fatalf("closed events %v (%v)", types(closed), closed)
	}
	waitUntil(t, func() bool { return mc.upstream(c.ID()).closed.Load() == 1 }, "socket closed")
	c.MarkErrored(nil) // after check-in: ignored, no panic
}

func TestClearFailsWaitersAtOnce(t *testing.T) {
	o := pool.DefaultOptions()
	o.MaxPoolSize = 1
	p, rec := newTestPool(t, &mockConnector{}, o)
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	c, err := p.CheckOut(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	const n = 5
	errs := make(chan error, n)
	for i := range n {
		go func() {
			_, err := p.CheckOut(ctxT(t))
			errs <- err
		}()
		waitUntil(t, func() bool { return p.Stats().Waiters == i+1 }, "waiters")
	}
	cause := errors.New("server monitor: connection reset")
	p.ClearWithError(cause, false)
	for range n {
		select {
		case err := <-errs:
			var pce *pool.PoolClearedError
			if !errors.As(err, &pce) || pce.Cause != cause || !strings.Contains(err.Error(), cause.Error()) {
				t.Fatalf("waiter error %v", err)
			}
			if errors.Is(err, cause) {
				t.Fatal("PoolClearedError must not unwrap to the clear's cause (it is not a network error)")
			}
		case <-time.After(5 * time.Second):
			t.Fatal("clear did not fail the waiters at once")
		}
	}
	failed := onlyTypes(rec.snapshot(), pool.ConnectionCheckOutFailed, pool.PoolCleared)
	if len(failed) != n+1 || failed[0].Type != pool.PoolCleared {
		t.Fatalf("events %v", types(failed))
	}
	for _, e := range failed[1:] {
		if e.Reason != pool.ReasonConnectionError {
			t.Fatalf("waiter failed with reason %q", e.Reason)
		}
	}
	if err := p.CheckIn(c); err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.Total != 0 || s.Generation != 1 || s.State != pool.StatePaused {
		t.Fatalf("stale connection not closed at check-in: %+v", s)
	}
}

func TestClearInterruptsInUse(t *testing.T) {
	mc := &mockConnector{}
	o := pool.DefaultOptions()
	o.MaintenanceInterval = time.Hour // only the clear's immediate run can do it
	p, rec := newTestPool(t, mc, o)
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	c, err := p.CheckOut(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	avail, err := p.CheckOut(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.CheckIn(avail); err != nil {
		t.Fatal(err)
	}
	p.Clear(true)
	waitUntil(t, func() bool { return mc.upstream(c.ID()).closed.Load() == 1 }, "in-use socket interrupted")
	if !c.Interrupted() {
		t.Fatal("Interrupted() = false after an interrupting clear")
	}
	var pce *pool.PoolClearedError
	if err := c.InterruptedError(); !errors.As(err, &pce) || !pce.Retryable() ||
		err.Error() != "Connection to "+p.Address()+" interrupted due to server monitor timeout" {
		t.Fatalf("InterruptedError = %v", err)
	}
	waitUntil(t, func() bool { return p.Stats().Available == 0 }, "stale available connection closed by the run")
	if err := p.CheckIn(c); err != nil {
		t.Fatal(err)
	}
	if n := mc.upstream(c.ID()).closed.Load(); n != 1 {
		t.Fatalf("interrupted socket closed %d times", n)
	}
	ev := onlyTypes(rec.snapshot(), pool.PoolCleared, pool.ConnectionClosed)
	if len(ev) != 3 || !ev[0].InterruptInUseConnections || ev[2].ConnectionID != c.ID() || ev[2].Reason != pool.ReasonStale {
		t.Fatalf("events %v", types(ev))
	}
	// Connections created after the clear are not interrupted.
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	c3, err := p.CheckOut(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	p.Clear(false)
	time.Sleep(20 * time.Millisecond)
	if c3.Interrupted() {
		t.Fatal("non-interrupting clear interrupted an in-use connection")
	}
	if err := p.CheckIn(c3); err != nil {
		t.Fatal(err)
	}
}

func TestClearOfPausedPoolStillBumpsGeneration(t *testing.T) {
	p, rec := newTestPool(t, &mockConnector{}, pool.DefaultOptions())
	p.Clear(false)
	p.Clear(false)
	if g := p.Stats().Generation; g != 2 {
		t.Fatalf("generation %d, want 2", g)
	}
	if n := rec.count(pool.PoolCleared); n != 0 {
		t.Fatalf("%d PoolCleared events for a paused pool", n)
	}
}

func TestWaitQueueTimeoutError(t *testing.T) {
	o := pool.DefaultOptions()
	o.MaxPoolSize = 1
	o.WaitQueueTimeout = 30 * time.Millisecond
	p, rec := newTestPool(t, &mockConnector{}, o)
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	c, err := p.CheckOut(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.CheckOut(ctxT(t))
	var wqt *pool.WaitQueueTimeoutError
	if !errors.As(err, &wqt) || wqt.Cause != nil || wqt.InUse != 1 || wqt.MaxPoolSize != 1 || wqt.Waited < o.WaitQueueTimeout || !wqt.Timeout() {
		t.Fatalf("waitQueueTimeout error %#v", err)
	}
	for _, s := range []string{"connections in use: 1", "maxPoolSize: 1", p.Address(), "Timed out while checking out a connection from connection pool"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("%q lacks %q", err, s)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(10 * time.Millisecond); cancel() }()
	_ = p.SetLimits(pool.Limits{MaxPoolSize: 1, MaxConnecting: 2}) // no waitQueueTimeout: only ctx
	_, err = p.CheckOut(ctx)
	if !errors.Is(err, context.Canceled) || !errors.As(err, &wqt) {
		t.Fatalf("cancelled checkout: %v", err)
	}
	dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer dcancel()
	if _, err = p.CheckOut(dctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("deadline checkout: %v", err)
	}
	if _, err = p.CheckOut(dctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("checkout with an expired context: %v", err)
	}
	failed := onlyTypes(rec.snapshot(), pool.ConnectionCheckOutFailed)
	if len(failed) != 4 {
		t.Fatalf("failures %v", types(failed))
	}
	for _, e := range failed {
		if e.Reason != pool.ReasonTimeout {
			t.Errorf("reason %q", e.Reason)
		}
	}
	if s := p.Stats(); s.Waiters != 0 {
		t.Fatalf("timed-out waiters left in the queue: %+v", s.Counts)
	}
	if err := p.CheckIn(c); err != nil {
		t.Fatal(err)
	}
}

// A checkout that gives up while its connection is being established leaves the
// connection to the pool instead of wasting it.
func TestAbandonedEstablishmentIsKept(t *testing.T) {
	mc := &mockConnector{delay: func(int64) time.Duration { return 100 * time.Millisecond }}
	p, rec := newTestPool(t, mc, pool.DefaultOptions())
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := p.CheckOut(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("checkout: %v", err)
	}
	// The next checkout takes the pending connection over instead of dialing again.
	c, err := p.CheckOut(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if c.ID() != 1 || rec.count(pool.ConnectionCreated) != 1 || mc.calls.Load() != 1 {
		t.Fatalf("got connection %d after %d creations", c.ID(), rec.count(pool.ConnectionCreated))
	}
	if err := p.CheckIn(c); err != nil {
		t.Fatal(err)
	}
	// And with nobody waiting it becomes available.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel2()
	c1, err := p.CheckOut(ctxT(t)) // hold 1 so that the next checkout creates 2
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.CheckOut(ctx2); err == nil {
		t.Fatal("checkout finished before its connection could be established")
	}
	waitUntil(t, func() bool { return p.Stats().Available == 1 }, "abandoned connection became available")
	if err := p.CheckIn(c1); err != nil {
		t.Fatal(err)
	}
}

func TestConnectionErrorOnCheckout(t *testing.T) {
	errDial := errors.New("dial tcp: connection refused")
	var bgErrs atomic.Int32
	o := pool.DefaultOptions()
	o.OnBackgroundError = func(error) { bgErrs.Add(1) }
	p, rec := newTestPool(t, &mockConnector{fail: func(int64) error { return errDial }}, o)
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	_, err := p.CheckOut(ctxT(t))
	var ce *pool.ConnectionError
	if !errors.As(err, &ce) || !errors.Is(err, errDial) || ce.ConnectionID != 1 || ce.Address != p.Address() {
		t.Fatalf("checkout error %v", err)
	}
	ev := rec.snapshot()
	closed := onlyTypes(ev, pool.ConnectionClosed, pool.ConnectionCheckOutFailed)
	if len(closed) != 2 || closed[0].Reason != pool.ReasonError || closed[1].Reason != pool.ReasonConnectionError ||
		!errors.Is(closed[1].Err, errDial) {
		t.Fatalf("events %v", types(ev))
	}
	if bgErrs.Load() != 0 {
		t.Fatal("a checkout's own establishment error was reported as a background error")
	}
	if s := p.Stats(); s.Total != 0 || s.Pending != 0 {
		t.Fatalf("failed connection still counted: %+v", s.Counts)
	}
}

func TestBackgroundErrorBeforeClosedEvent(t *testing.T) {
	errHello := errors.New("hello: HostUnreachable")
	o := pool.DefaultOptions()
	o.MinPoolSize = 1
	var p *pool.Pool
	var got atomic.Value
	var closedBefore atomic.Int32
	rec := newRecorder(o)
	o.Monitor = rec
	o.OnBackgroundError = func(err error) {
		got.Store(err)
		closedBefore.Store(int32(rec.count(pool.ConnectionClosed)))
		p.Clear(false)
	}
	p, err := pool.New("127.0.0.1:1", &mockConnector{fail: func(int64) error { return errHello }}, o)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	if err := rec.waitFor(pool.ConnectionClosed, 1, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	var ce *pool.ConnectionError
	if e, _ := got.Load().(error); !errors.As(e, &ce) || !errors.Is(e, errHello) {
		t.Fatalf("background error %v", got.Load())
	}
	if closedBefore.Load() != 0 {
		t.Fatal("OnBackgroundError ran after ConnectionClosed")
	}
	ev := onlyTypes(rec.snapshot(), pool.ConnectionCreated, pool.PoolCleared, pool.ConnectionClosed)
	if len(ev) < 3 || ev[1].Type != pool.PoolCleared || ev[2].Reason != pool.ReasonError {
		t.Fatalf("events %v", types(ev))
	}
	rec.checkInvariants(t)
}

func TestMaintenanceIdleAndMinPoolSize(t *testing.T) {
	o := pool.DefaultOptions()
	o.MinPoolSize = 2
	o.MaxIdleTime = 30 * time.Millisecond
	o.MaintenanceInterval = 10 * time.Millisecond
	p, rec := newTestPool(t, &mockConnector{}, o)
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	if err := rec.waitFor(pool.ConnectionReady, 2, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	// Idle connections are closed and replaced, keeping minPoolSize.
	if err := rec.waitFor(pool.ConnectionClosed, 2, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, e := range onlyTypes(rec.snapshot(), pool.ConnectionClosed) {
		if e.Reason != pool.ReasonIdle {
			t.Fatalf("closed with reason %q", e.Reason)
		}
	}
	if err := rec.waitFor(pool.ConnectionReady, 4, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	// A paused pool is not populated.
	p.Clear(false)
	time.Sleep(50 * time.Millisecond)
	n := rec.count(pool.ConnectionCreated)
	time.Sleep(50 * time.Millisecond)
	if rec.count(pool.ConnectionCreated) != n {
		t.Fatal("a paused pool created connections")
	}
	if s := p.Stats(); s.Total != 0 {
		t.Fatalf("stale connections kept by the paused pool: %+v", s.Counts)
	}
}

func TestSetLimits(t *testing.T) {
	o := pool.DefaultOptions()
	o.MaxPoolSize = 1
	o.MaintenanceInterval = time.Hour
	p, rec := newTestPool(t, &mockConnector{}, o)
	rec.mu.Lock()
	rec.maxPoolSize = 0 // the limit changes below; the recorder cannot follow it
	rec.mu.Unlock()
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	c1, err := p.CheckOut(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *pool.Conn, 1)
	go func() {
		c, err := p.CheckOut(ctxT(t))
		if err != nil {
			t.Error(err)
		}
		got <- c
	}()
	waitUntil(t, func() bool { return p.Stats().Waiters == 1 }, "waiter queued")
	if err := p.SetLimits(pool.Limits{MaxPoolSize: 0, MaxConnecting: 0}); !errors.Is(err, pool.ErrInvalidOptions) {
		t.Fatalf("invalid limits accepted: %v", err)
	}
	if err := p.SetLimits(pool.Limits{MaxPoolSize: 3, MaxConnecting: 2}); err != nil {
		t.Fatal(err)
	}
	c2 := <-got
	if c2 == nil || c2.ID() != 2 {
		t.Fatal("raising maxPoolSize did not serve the waiter")
	}
	c3, err := p.CheckOut(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []*pool.Conn{c1, c2, c3} {
		if err := p.CheckIn(c); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.SetLimits(pool.Limits{MaxPoolSize: 1, MaxConnecting: 1, MaxIdleTime: time.Hour}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool { return p.Stats().Total == 1 }, "surplus connections trimmed")
	if s := p.Stats(); s.Options.MaxPoolSize != 1 || s.Options.MaxConnecting != 1 || s.Options.MaxIdleTime != time.Hour {
		t.Fatalf("options not updated: %+v", s.Options)
	}
	p.Close()
	if err := p.SetLimits(pool.DefaultOptions().Limits()); !errors.As(err, new(*pool.PoolClosedError)) {
		t.Fatalf("SetLimits on a closed pool: %v", err)
	}
}

func TestCloseFailsWaitersAndPending(t *testing.T) {
	mc := &mockConnector{delay: func(id int64) time.Duration {
		if id > 1 {
			return time.Hour // until cancelled
		}
		return 0
	}}
	o := pool.DefaultOptions()
	o.MaxPoolSize = 2
	o.MaxConnecting = 1
	var bg atomic.Int32
	o.OnBackgroundError = func(error) { bg.Add(1) }
	p, rec := newTestPool(t, mc, o)
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	c1, err := p.CheckOut(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := p.CheckOut(ctxT(t))
			errs <- err
		}()
	}
	waitUntil(t, func() bool { s := p.Stats(); return s.Pending == 1 && s.Waiters == 1 }, "one establishing, one waiting")
	p.Close()
	for range 2 {
		select {
		case err := <-errs:
			if !errors.As(err, new(*pool.PoolClosedError)) {
				t.Fatalf("checkout during close: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("close did not end the checkouts")
		}
	}
	if err := p.CheckIn(c1); err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.Total != 0 {
		t.Fatalf("after close: %+v", s.Counts)
	}
	for _, e := range onlyTypes(rec.snapshot(), pool.ConnectionClosed, pool.ConnectionCheckOutFailed) {
		if e.Reason != pool.ReasonPoolClosed {
			t.Errorf("%v reason %q, want poolClosed", e.Type, e.Reason)
		}
	}
	if bg.Load() != 0 {
		t.Fatal("a cancelled establishment was reported as a background error")
	}
}

// Clear(true) interrupts connections being established; their checkouts fail with a
// retryable error and nothing is reported to the topology layer.
func TestClearInterruptsPending(t *testing.T) {
	mc := &mockConnector{delay: func(int64) time.Duration { return time.Hour }}
	var bg atomic.Int32
	o := pool.DefaultOptions()
	o.OnBackgroundError = func(error) { bg.Add(1) }
	p, rec := newTestPool(t, mc, o)
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := p.CheckOut(ctxT(t))
		errc <- err
	}()
	waitUntil(t, func() bool { return p.Stats().Pending == 1 }, "pending")
	p.Clear(true)
	select {
	case err := <-errc:
		var pce *pool.PoolClearedError
		if !errors.As(err, &pce) || !pce.Interrupted || !pce.Retryable() {
			t.Fatalf("checkout error %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("clear did not interrupt the establishment")
	}
	ev := onlyTypes(rec.snapshot(), pool.PoolCleared, pool.ConnectionClosed, pool.ConnectionCheckOutFailed)
	if len(ev) != 3 || ev[1].Reason != pool.ReasonStale || ev[2].Reason != pool.ReasonConnectionError {
		t.Fatalf("events %v", types(ev))
	}
	if bg.Load() != 0 {
		t.Fatal("interrupted establishment reported as a background error")
	}
}

// A Connector that panics or returns nothing cannot corrupt the pool's accounting.
func TestMisbehavingConnector(t *testing.T) {
	var n atomic.Int32
	c := connectorFunc(func(ctx context.Context, addr string, id int64) (pool.Upstream, error) {
		if n.Add(1) == 1 {
			panic("connector bug")
		}
		return nil, nil
	})
	p, _ := newTestPool(t, c, pool.DefaultOptions())
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		_, err := p.CheckOut(ctxT(t))
		if !errors.As(err, new(*pool.ConnectionError)) {
			t.Fatalf("attempt %d: %v", i, err)
		}
	}
	if s := p.Stats(); s.Total != 0 || s.Pending != 0 {
		t.Fatalf("counts %+v", s.Counts)
	}
}

type connectorFunc func(ctx context.Context, addr string, id int64) (pool.Upstream, error)

func (f connectorFunc) Connect(ctx context.Context, addr string, id int64) (pool.Upstream, error) {
	return f(ctx, addr, id)
}

// waitUntil polls cond for up to 5 seconds.
func waitUntil(t *testing.T, cond func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", fmt.Sprintf(format, args...))
		}
		time.Sleep(time.Millisecond)
	}
}

// blockingUpstream's Close blocks until released, like a TLS close_notify stuck on a
// full send buffer.
type blockingUpstream struct {
	*mockUpstream
	release <-chan struct{}
}

func (u blockingUpstream) Close() error {
	<-u.release
	return u.mockUpstream.Close()
}

// Closing sockets never blocks the pool's callers.
func TestSocketCloseNeverBlocks(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	mc := &mockConnector{wrap: func(u *mockUpstream) pool.Upstream { return blockingUpstream{u, release} }}
	p, _ := newTestPool(t, mc, pool.DefaultOptions())
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	c1, err := p.CheckOut(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	c2, err := p.CheckOut(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.CheckIn(c2); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		c1.MarkErrored(errors.New("i/o timeout"))
		if err := p.CheckIn(c1); err != nil { // closes c1
			t.Error(err)
		}
		p.Close() // closes c2
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("CheckIn/Close blocked on a socket close")
	}
	if s := p.Stats(); s.Total != 0 {
		t.Fatalf("connections still counted: %+v", s.Counts)
	}
}

// ConnectionReady.Duration covers the establishment, and ConnectionCheckedOut.Duration
// the whole checkout including it.
func TestEventDurations(t *testing.T) {
	const dial = 200 * time.Millisecond
	mc := &mockConnector{delay: func(int64) time.Duration { return dial }}
	p, rec := newTestPool(t, mc, pool.DefaultOptions())
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	c, err := p.CheckOut(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	ev := onlyTypes(rec.snapshot(), pool.ConnectionReady, pool.ConnectionCheckedOut)
	if len(ev) != 2 || ev[0].Duration < dial || ev[1].Duration < ev[0].Duration {
		t.Fatalf("durations: %v ready %v, checked out %v", types(ev), ev[0].Duration, ev[1].Duration)
	}
	if err := p.CheckIn(c); err != nil {
		t.Fatal(err)
	}
	c, err = p.CheckOut(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	// Served from the available stack without waiting: the pool reads no
	// clock for it and reports 0 (Event.Duration).
	ev = onlyTypes(rec.snapshot(), pool.ConnectionCheckedOut)
	if d := ev[len(ev)-1].Duration; d != 0 {
		t.Errorf("reusing an available connection reported %v, want 0", d)
	}
	if err := p.CheckIn(c); err != nil {
		t.Fatal(err)
	}
	// Failed at once (the pool is paused): 0 as well.
	p.Clear(false)
	if _, err := p.CheckOut(ctxT(t)); err == nil {
		t.Fatal("checkout from a paused pool succeeded")
	}
	ev = onlyTypes(rec.snapshot(), pool.ConnectionCheckOutFailed)
	if len(ev) != 1 || ev[0].Duration != 0 {
		t.Fatalf("immediate failure: want one ConnectionCheckOutFailed with duration 0, got %+v", ev)
	}
}
