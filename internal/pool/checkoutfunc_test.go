package pool_test

import (
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/pool"
)

// result is what a CheckOutFunc callback received; calls counts the calls, which
// must be exactly one.
type result struct {
	mu    sync.Mutex
	calls int
	conn  *pool.Conn
	err   error
	ch    chan struct{}
}

func newResult() *result { return &result{ch: make(chan struct{}, 1)} }

func (r *result) done(c *pool.Conn, err error) {
	r.mu.Lock()
	r.calls++
	r.conn, r.err = c, err
	r.mu.Unlock()
	select {
	case r.ch <- struct{}{}:
	default:
	}
}

// wait returns the result, failing the test if none comes.
func (r *result) wait(t *testing.T) (*pool.Conn, error) {
	t.Helper()
	select {
	case <-r.ch:
	case <-time.After(5 * time.Second):
		t.Fatal("CheckOutFunc never called back")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.conn, r.err
}

func (r *result) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

// CheckOutFunc returns what it can at once, queues the rest in order with
// CheckOut's waiters, and calls back exactly once per queued checkout, with the
// same events as CheckOut.
func TestCheckOutFuncQueuesInOrder(t *testing.T) {
	o := pool.DefaultOptions()
	o.MaxPoolSize = 1
	p, rec := newTestPool(t, &mockConnector{}, o)
	r0 := newResult()
	if _, queued, err := p.CheckOutFunc(r0.done); queued || !errors.As(err, new(*pool.PoolClearedError)) {
		t.Fatalf("paused pool: queued %v, err %v", queued, err)
	}
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	// An empty pool: the checkout queues, a connection is made for it and
	// delivered through the callback.
	c1, queued, err := p.CheckOutFunc(r0.done)
	if err != nil || c1 != nil || !queued {
		t.Fatalf("empty pool: %v %v %v", c1, queued, err)
	}
	c1, err = r0.wait(t)
	if err != nil || c1 == nil {
		t.Fatalf("delivered %v %v", c1, err)
	}
	// The pool is full: a CheckOut waiter, then a CheckOutFunc one, then
	// another CheckOut waiter, are served in that order.
	var order []string
	var mu sync.Mutex
	note := func(s string) { mu.Lock(); order = append(order, s); mu.Unlock() }
	got := make(chan *pool.Conn, 2)
	checkOut := func(name string) {
		c, err := p.CheckOut(ctxT(t))
		if err != nil {
			t.Error(err)
		}
		note(name)
		got <- c
	}
	go checkOut("first")
	waitUntil(t, func() bool { return p.Stats().Waiters == 1 }, "first waiter")
	r1 := newResult()
	if c, queued, err := p.CheckOutFunc(r1.done); c != nil || !queued || err != nil {
		t.Fatalf("full pool: %v %v %v", c, queued, err)
	}
	go checkOut("third")
	waitUntil(t, func() bool { return p.Stats().Waiters == 3 }, "three waiters")

	if err := p.CheckIn(c1); err != nil {
		t.Fatal(err)
	}
	c := <-got
	if r1.count() != 0 {
		t.Fatal("the callback waiter overtook the first waiter")
	}
	if err := p.CheckIn(c); err != nil {
		t.Fatal(err)
	}
	c2, err := r1.wait(t)
	if err != nil || c2 == nil {
		t.Fatalf("second: %v %v", c2, err)
	}
	note("second")
	if err := p.CheckIn(c2); err != nil {
		t.Fatal(err)
	}
	if err := p.CheckIn(<-got); err != nil {
		t.Fatal(err)
	}
	if len(order) != 3 || order[0] != "first" || order[1] != "second" || order[2] != "third" {
		t.Fatalf("served in order %v", order)
	}
	if r0.count() != 1 || r1.count() != 1 {
		t.Fatalf("callbacks: %d and %d calls", r0.count(), r1.count())
	}
	// Each checkout: started, then checked out.
	if s, o := rec.count(pool.ConnectionCheckOutStarted), rec.count(pool.ConnectionCheckedOut); s != 5 || o != 4 {
		t.Fatalf("%d started, %d checked out: %v", s, o, types(rec.snapshot()))
	}
	// An available connection is returned at once, without a callback.
	r2 := newResult()
	c3, queued, err := p.CheckOutFunc(r2.done)
	if c3 == nil || queued || err != nil {
		t.Fatalf("available connection: %v %v %v", c3, queued, err)
	}
	if err := p.CheckIn(c3); err != nil {
		t.Fatal(err)
	}
	if r2.count() != 0 {
		t.Fatal("callback called for a checkout served at once")
	}
	rec.checkInvariants(t)
}

// A queued CheckOutFunc fails through its callback on WaitQueueTimeout, on a
// clear, on Close and when the connection made for it cannot be established.
func TestCheckOutFuncFailures(t *testing.T) {
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
	r := newResult()
	start := time.Now()
	if _, queued, err := p.CheckOutFunc(r.done); !queued || err != nil {
		t.Fatal(queued, err)
	}
	_, err = r.wait(t)
	var wqt *pool.WaitQueueTimeoutError
	if !errors.As(err, &wqt) || !wqt.Timeout() || time.Since(start) < o.WaitQueueTimeout {
		t.Fatalf("timeout: %v after %v", err, time.Since(start))
	}
	if s := p.Stats(); s.Waiters != 0 {
		t.Fatalf("timed-out waiter left queued: %+v", s.Counts)
	}
	failed := onlyTypes(rec.snapshot(), pool.ConnectionCheckOutFailed)
	if len(failed) != 1 || failed[0].Reason != pool.ReasonTimeout {
		t.Fatalf("failures %v", failed)
	}

	// Cleared while queued (no timeout now, so only the clear ends it).
	_ = p.SetLimits(pool.Limits{MaxPoolSize: 1, MaxConnecting: 2})
	r = newResult()
	if _, queued, err := p.CheckOutFunc(r.done); !queued || err != nil {
		t.Fatal(queued, err)
	}
	p.Clear(false)
	if _, err := r.wait(t); !errors.As(err, new(*pool.PoolClearedError)) {
		t.Fatalf("clear: %v", err)
	}
	if err := p.CheckIn(c); err != nil {
		t.Fatal(err)
	}

	// Closed while queued.
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	c, err = p.CheckOut(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	r = newResult()
	if _, queued, err := p.CheckOutFunc(r.done); !queued || err != nil {
		t.Fatal(queued, err)
	}
	p.Close()
	if _, err := r.wait(t); !errors.As(err, new(*pool.PoolClosedError)) {
		t.Fatalf("close: %v", err)
	}
	_ = p.CheckIn(c)

	// The connection made for the checkout fails to establish.
	boom := errors.New("boom")
	p2, _ := newTestPool(t, &mockConnector{fail: func(int64) error { return boom }}, pool.DefaultOptions())
	if err := p2.Ready(); err != nil {
		t.Fatal(err)
	}
	r = newResult()
	if _, queued, err := p2.CheckOutFunc(r.done); !queued || err != nil {
		t.Fatal(queued, err)
	}
	if _, err := r.wait(t); !errors.Is(err, boom) {
		t.Fatalf("establishment failure: %v", err)
	}
	if r.count() != 1 {
		t.Fatalf("%d calls", r.count())
	}
}

// Many CheckOutFunc and CheckOut callers on a small pool, with timeouts as short
// as the work: every checkout ends exactly once, with a connection or a timeout,
// and the pool ends with every connection back. Run with -race, this also checks
// that recycled waiters are never touched by a timer of an earlier use.
func TestCheckOutFuncStress(t *testing.T) {
	o := pool.DefaultOptions()
	o.MaxPoolSize = 3
	o.WaitQueueTimeout = 2 * time.Millisecond
	p, rec := newTestPool(t, &mockConnector{}, o)
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	const workers, each = 8, 300
	var served, timedOut, other atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			use := func(c *pool.Conn) {
				served.Add(1)
				if rng.IntN(4) == 0 {
					time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
				}
				if err := p.CheckIn(c); err != nil {
					t.Error(err)
				}
			}
			classify := func(err error) {
				if errors.As(err, new(*pool.WaitQueueTimeoutError)) {
					timedOut.Add(1)
				} else {
					other.Add(1)
					t.Error(err)
				}
			}
			for range each {
				if rng.IntN(2) == 0 {
					c, err := p.CheckOut(ctxT(t))
					if err != nil {
						classify(err)
						continue
					}
					use(c)
					continue
				}
				r := newResult()
				c, queued, err := p.CheckOutFunc(r.done)
				switch {
				case err != nil:
					classify(err)
					continue
				case queued:
					c, err = r.wait(t)
					if err != nil {
						classify(err)
						continue
					}
				}
				use(c)
				if queued {
					// A late second call would show here.
					time.Sleep(time.Duration(rng.IntN(50)) * time.Microsecond)
					if n := r.count(); n != 1 {
						t.Errorf("callback called %d times", n)
					}
				}
			}
		}()
	}
	wg.Wait()
	if n := served.Load() + timedOut.Load() + other.Load(); n != workers*each {
		t.Fatalf("%d of %d checkouts ended", n, workers*each)
	}
	if served.Load() == 0 || timedOut.Load() == 0 {
		t.Logf("served %d, timed out %d: the mix did not exercise both", served.Load(), timedOut.Load())
	}
	s := p.Stats()
	if s.InUse != 0 || s.Waiters != 0 || s.Total > o.MaxPoolSize {
		t.Fatalf("pool after the storm: %+v", s.Counts)
	}
	rec.checkInvariants(t)
}
