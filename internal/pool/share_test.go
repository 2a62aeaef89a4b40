package pool_test

// Tests of the Share (share.go): a connection budget over several pools of
// one server, as max_db_connections bounds a route's user pools and its
// service pool together.

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/pool"
)

// liveCounter is a Monitor shared by every pool of a Share: it counts the
// connections alive over all of them (ConnectionCreated to ConnectionClosed)
// and records a violation whenever that sum exceeds max at a creation or a
// checkout. The pool emits Created after taking its slot and releases the
// slot after Closed, so the count can never honestly exceed the cap.
type liveCounter struct {
	max        int64
	live, peak atomic.Int64
	checkouts  atomic.Int64
	closedIdle atomic.Int64
	mu         sync.Mutex
	violations []string
}

func (l *liveCounter) HandleEvent(e pool.Event) {
	switch e.Type {
	case pool.ConnectionCreated:
		n := l.live.Add(1)
		for {
			p := l.peak.Load()
			if n <= p || l.peak.CompareAndSwap(p, n) {
				break
			}
		}
		l.check(e, n)
	case pool.ConnectionCheckedOut:
		l.checkouts.Add(1)
		l.check(e, l.live.Load())
	case pool.ConnectionClosed:
		l.live.Add(-1)
		if e.Reason == pool.ReasonIdle {
			l.closedIdle.Add(1)
		}
	}
}

func (l *liveCounter) check(e pool.Event, n int64) {
	if n > l.max {
		l.mu.Lock()
		l.violations = append(l.violations, fmt.Sprintf("%v on %s: %d connections over all pools > cap %d", e.Type, e.Address, n, l.max))
		l.mu.Unlock()
	}
}

// sharedPools makes n pools (users) sharing s, each counted by lc.
func sharedPools(t *testing.T, s *pool.Share, lc *liveCounter, n int, o pool.Options, c pool.Connector) []*pool.Pool {
	t.Helper()
	o.Share = s
	o.Monitor = lc
	ps := make([]*pool.Pool, n)
	for i := range ps {
		p, _ := newTestPool(t, c, o)
		if err := p.Ready(); err != nil {
			t.Fatal(err)
		}
		ps[i] = p
	}
	return ps
}

// TestShareCapHoldsUnderConcurrentUsers: many goroutines over several pools
// (users), each pool allowed more than the cap on its own: the sum of their
// connections never exceeds the Share's cap, at any creation or checkout,
// every checkout succeeds (nobody starves), and the cap is reached.
func TestShareCapHoldsUnderConcurrentUsers(t *testing.T) {
	const cap, users, workers, rounds = 5, 4, 32, 150
	s, err := pool.NewShare(cap)
	if err != nil {
		t.Fatal(err)
	}
	lc := &liveCounter{max: cap}
	o := pool.DefaultOptions()
	o.MaxPoolSize = 10
	o.WaitQueueTimeout = 10 * time.Second
	conn := &mockConnector{delay: func(id int64) time.Duration { return time.Duration(id%3) * 100 * time.Microsecond }}
	ps := sharedPools(t, s, lc, users, o, conn)

	ctx := ctxT(t)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	deadline := time.Now().Add(15 * time.Second)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Users of unequal appetite: worker w mostly uses pool w%users,
			// now and then another, so pools go idle while others wait.
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for range rounds {
				if time.Now().After(deadline) {
					return
				}
				p := ps[w%users]
				if r.IntN(4) == 0 {
					p = ps[r.IntN(users)]
				}
				c, err := p.CheckOut(ctx)
				if err != nil {
					errs <- err
					return
				}
				if d := r.IntN(50); d > 40 {
					time.Sleep(time.Duration(d) * time.Microsecond)
				}
				if err := p.CheckIn(c); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("checkout: %v", err)
	}
	lc.mu.Lock()
	for i, v := range lc.violations {
		if i < 5 {
			t.Errorf("cap violated: %s", v)
		}
	}
	lc.mu.Unlock()
	st := s.Stats()
	total := 0
	for _, p := range ps {
		total += p.Stats().Total
	}
	if st.Used != total || st.Used > cap {
		t.Errorf("Share counts %d connections, the pools %d, cap %d", st.Used, total, cap)
	}
	if lc.peak.Load() != cap {
		t.Errorf("peak %d connections over all pools, want the cap %d reached", lc.peak.Load(), cap)
	}
	if st.Waits == 0 {
		t.Errorf("no pool ever waited for the cap: the test did not contend (%+v)", st)
	}
	t.Logf("checkouts %d, share %+v, closed to make room %d", lc.checkouts.Load(), st, lc.closedIdle.Load())
}

// TestShareEvictsIdleForWaitingUser: user A holds every slot idle; user B's
// checkout closes one of A's idle connections and gets a new one instead of
// waiting for A (PgBouncer's eviction).
func TestShareEvictsIdleForWaitingUser(t *testing.T) {
	s, _ := pool.NewShare(2)
	lc := &liveCounter{max: 2}
	o := pool.DefaultOptions()
	o.WaitQueueTimeout = 5 * time.Second
	ps := sharedPools(t, s, lc, 2, o, &mockConnector{})
	a, b := ps[0], ps[1]
	ctx := ctxT(t)
	c1, err := a.CheckOut(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := a.CheckOut(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = a.CheckIn(c1)
	_ = a.CheckIn(c2)
	if n := a.Stats().Available; n != 2 {
		t.Fatalf("A has %d idle connections, want 2", n)
	}
	start := time.Now()
	cb, err := b.CheckOut(ctx)
	if err != nil {
		t.Fatalf("B starved while A held idle connections: %v", err)
	}
	defer b.CheckIn(cb)
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("B waited %v for an eviction", d)
	}
	if n := a.Stats().Available; n != 1 {
		t.Errorf("A has %d idle connections after the eviction, want 1", n)
	}
	if st := s.Stats(); st.Evictions != 1 || st.Used != 2 || st.Waits != 1 {
		t.Errorf("share stats %+v, want 1 eviction, 2 used, 1 wait", st)
	}
	if v := lc.violations; len(v) > 0 {
		t.Errorf("cap violated: %v", v)
	}
}

// TestShareCheckInGoesToWaitingUser: all slots are in use by A; B waits (in
// its own CMAP queue); A's check-in closes the connection instead of keeping
// it idle, and B gets the slot.
func TestShareCheckInGoesToWaitingUser(t *testing.T) {
	s, _ := pool.NewShare(1)
	lc := &liveCounter{max: 1}
	o := pool.DefaultOptions()
	o.WaitQueueTimeout = 5 * time.Second
	ps := sharedPools(t, s, lc, 2, o, &mockConnector{})
	a, b := ps[0], ps[1]
	ctx := ctxT(t)
	ca, err := a.CheckOut(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		c, err := b.CheckOut(ctx)
		if err == nil {
			err = b.CheckIn(c)
		}
		got <- err
	}()
	waitUntil(t, func() bool { return s.Stats().Waiting == 1 && b.Stats().Waiters == 1 }, "B waiting for the share")
	select {
	case err := <-got:
		t.Fatalf("B was served over the cap: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	_ = a.CheckIn(ca)
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("B not served after A's check-in")
	}
	if n := a.Stats().Total; n != 0 {
		t.Errorf("A kept %d connections while B waited", n)
	}
	if st := s.Stats(); st.Evictions != 1 || st.Used != 1 || st.Waiting != 0 {
		t.Errorf("share stats %+v", st)
	}
}

// TestShareWaitQueueTimeout: a checkout waiting for the cap keeps CMAP's
// WaitQueueTimeout and events, and leaves the Share's queue when it fails
// (nobody's idle connection closes for it afterwards).
func TestShareWaitQueueTimeout(t *testing.T) {
	s, _ := pool.NewShare(1)
	lc := &liveCounter{max: 1}
	o := pool.DefaultOptions()
	o.WaitQueueTimeout = 30 * time.Millisecond
	ps := sharedPools(t, s, lc, 2, o, &mockConnector{})
	a := ps[0]
	o.Share, o.Monitor = s, lc
	b, rec := newTestPool(t, &mockConnector{}, o)
	_ = b.Ready()
	ctx := ctxT(t)
	ca, err := a.CheckOut(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.CheckOut(ctx)
	var wqt *pool.WaitQueueTimeoutError
	if !errors.As(err, &wqt) {
		t.Fatalf("B's checkout: %v, want a WaitQueueTimeoutError", err)
	}
	if wqt.SharedMax != 1 || wqt.SharedUsed != 1 || !strings.Contains(err.Error(), "max_db_connections): 1, connections under it: 1") {
		t.Errorf("the timeout does not say the shared cap was reached: %v", err)
	}
	evs := onlyTypes(rec.snapshot(), pool.ConnectionCheckOutFailed)
	if len(evs) != 1 || evs[0].Reason != pool.ReasonTimeout {
		t.Fatalf("B's events %v, want one CheckOutFailed[timeout]", types(evs))
	}
	waitUntil(t, func() bool { return s.Stats().Waiting == 0 }, "B out of the share queue")
	_ = a.CheckIn(ca)
	if n := a.Stats().Available; n != 1 {
		t.Errorf("A's check-in after B gave up: %d idle, want 1 (kept)", n)
	}
}

// TestShareSetMax: raising the cap serves a waiting pool at once; lowering it
// closes idle connections down to the new cap.
func TestShareSetMax(t *testing.T) {
	s, _ := pool.NewShare(1)
	lc := &liveCounter{max: 3}
	o := pool.DefaultOptions()
	o.WaitQueueTimeout = 5 * time.Second
	ps := sharedPools(t, s, lc, 2, o, &mockConnector{})
	a, b := ps[0], ps[1]
	ctx := ctxT(t)
	ca, _ := a.CheckOut(ctx)
	got := make(chan *pool.Conn, 1)
	go func() {
		c, err := b.CheckOut(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- c
	}()
	waitUntil(t, func() bool { return s.Stats().Waiting == 1 }, "B waiting for the share")
	if err := s.SetMax(3); err != nil {
		t.Fatal(err)
	}
	var cb *pool.Conn
	select {
	case cb = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("raising the cap did not serve the waiting pool")
	}
	ca2, _ := a.CheckOut(ctx)
	_ = a.CheckIn(ca)
	_ = a.CheckIn(ca2)
	_ = b.CheckIn(cb)
	if st := s.Stats(); st.Used != 3 {
		t.Fatalf("used %d, want 3", st.Used)
	}
	if err := s.SetMax(1); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool { return s.Stats().Used == 1 }, "used down to the lowered cap")
	if err := s.SetMax(-1); err == nil {
		t.Error("SetMax(-1) accepted")
	}
}

// TestShareNeedsMaintenance: a Share relies on the maintenance goroutine.
func TestShareNeedsMaintenance(t *testing.T) {
	s, _ := pool.NewShare(1)
	o := pool.DefaultOptions()
	o.Share = s
	o.MaintenanceInterval = -1
	if _, err := pool.New("h:1", &mockConnector{}, o); !errors.Is(err, pool.ErrInvalidOptions) {
		t.Fatalf("New: %v, want ErrInvalidOptions", err)
	}
	if _, err := pool.NewShare(-1); err == nil {
		t.Error("NewShare(-1) accepted")
	}
}

// TestShareBusyUserDoesNotStarveAnother: user A keeps more checkouts going
// than the cap, so its own queue never empties; user B's checkouts are still
// served (A gives up connections above an even split), each well within
// WaitQueueTimeout.
func TestShareBusyUserDoesNotStarveAnother(t *testing.T) {
	const cap = 2
	s, _ := pool.NewShare(cap)
	lc := &liveCounter{max: cap}
	o := pool.DefaultOptions()
	o.WaitQueueTimeout = 2 * time.Second
	ps := sharedPools(t, s, lc, 2, o, &mockConnector{})
	a, b := ps[0], ps[1]
	ctx := ctxT(t)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := a.CheckOut(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				time.Sleep(time.Millisecond)
				_ = a.CheckIn(c)
			}
		})
	}
	waitUntil(t, func() bool { return a.Stats().Waiters > 0 }, "A's queue busy")
	var worst time.Duration
	for range 20 {
		start := time.Now()
		c, err := b.CheckOut(ctx)
		if err != nil {
			close(stop)
			wg.Wait()
			t.Fatalf("B starved beside a busy A: %v (share %+v)", err, s.Stats())
		}
		worst = max(worst, time.Since(start))
		time.Sleep(time.Millisecond)
		_ = b.CheckIn(c)
	}
	close(stop)
	wg.Wait()
	t.Logf("B's slowest checkout %v; share %+v", worst, s.Stats())
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if len(lc.violations) > 0 {
		t.Errorf("cap violated: %v", lc.violations[0])
	}
}
