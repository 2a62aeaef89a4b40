package pool

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// stressUpstream counts its closes.
type stressUpstream struct {
	Upstream // never used by the pool but for Close
	closes   atomic.Int32
}

func (u *stressUpstream) Close() error {
	u.closes.Add(1)
	return nil
}

// stressConnector is slow at random and fails at random.
type stressConnector struct {
	mu  sync.Mutex
	ups []*stressUpstream
}

func (s *stressConnector) Connect(ctx context.Context, _ string, id int64) (Upstream, error) {
	if d := time.Duration(rand.IntN(1000)) * time.Microsecond; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
	if rand.IntN(100) < 3 {
		return nil, fmt.Errorf("connection %d refused", id)
	}
	u := &stressUpstream{}
	s.mu.Lock()
	s.ups = append(s.ups, u)
	s.mu.Unlock()
	return u, nil
}

// invariantMonitor checks the pool's internal consistency at every event. It runs
// under p.mu (Monitor contract), so it may read the pool's guarded fields.
type invariantMonitor struct {
	p      atomic.Pointer[Pool]
	events atomic.Int64
	mu     sync.Mutex
	errs   []string
}

func (m *invariantMonitor) fail(format string, args ...any) {
	m.mu.Lock()
	if len(m.errs) < 20 {
		m.errs = append(m.errs, fmt.Sprintf(format, args...))
	}
	m.mu.Unlock()
}

func (m *invariantMonitor) HandleEvent(e Event) {
	m.events.Add(1)
	p := m.p.Load()
	if p == nil {
		return // PoolCreated, inside New
	}
	c := e.Counts
	if c.Total != c.Available+c.Pending+c.InUse {
		m.fail("%v: counts %+v do not add up", e.Type, c)
	}
	if max := p.opts.MaxPoolSize; max > 0 && len(p.conns) > max {
		m.fail("%v: %d connections > maxPoolSize %d", e.Type, len(p.conns), max)
	}
	if p.pending > p.opts.MaxConnecting {
		m.fail("%v: %d pending > maxConnecting %d", e.Type, p.pending, p.opts.MaxConnecting)
	}
	var pending, inUse, avail int
	for id, cn := range p.conns {
		if cn.id != id {
			m.fail("conn map key %d holds conn %d", id, cn.id)
		}
		switch cn.state {
		case connPending:
			pending++
			if w := cn.owner; w != nil && (w.state != waiterBound || w.pending != cn) {
				m.fail("%v: pending conn %d owned by a waiter in state %d", e.Type, cn.id, w.state)
			}
		case connInUse:
			inUse++
		case connAvailable:
			avail++
		default:
			m.fail("%v: conn %d in the pool with state %d", e.Type, cn.id, cn.state)
		}
	}
	if pending != p.pending || inUse != p.inUse {
		m.fail("%v: counted pending %d inUse %d, pool says %d %d", e.Type, pending, inUse, p.pending, p.inUse)
	}
	// Every available connection is in idle exactly once, and nothing else is (the one
	// being closed by this very event excepted: it has left both).
	seen := map[*Conn]bool{}
	for _, cn := range p.idle {
		if seen[cn] {
			m.fail("%v: conn %d twice in the available stack", e.Type, cn.id)
		}
		seen[cn] = true
		if cn.state != connAvailable || p.conns[cn.id] != cn {
			m.fail("%v: available stack holds conn %d in state %d", e.Type, cn.id, cn.state)
		}
	}
	if len(p.idle) > avail {
		m.fail("%v: %d in available stack, %d available", e.Type, len(p.idle), avail)
	}
	for _, cn := range p.unclaimed {
		if cn.state != connPending || cn.owner != nil {
			m.fail("%v: unclaimed conn %d state %d owner %v", e.Type, cn.id, cn.state, cn.owner != nil)
		}
	}
	n := 0
	for w := p.queue.head; w != nil; w = w.next {
		n++
		if w.state != waiterQueued {
			m.fail("%v: queued waiter in state %d", e.Type, w.state)
		}
	}
	if n != p.queue.n {
		m.fail("%v: queue length %d, counted %d", e.Type, p.queue.n, n)
	}
	if p.state != StateReady && n > 0 {
		m.fail("%v: %d waiters in a %v pool", e.Type, n, p.state)
	}
}

// TestStress hammers pools with 200 goroutines doing random checkouts, check-ins,
// scoped uses, clears, readies and (once per round) a close, checking the pool's
// invariants at every event, exclusive ownership of every handed-out connection, and
// that every goroutine and socket is gone after Close. Bounded in rounds, per-worker
// operations and time.
func TestStress(t *testing.T) {
	const (
		workers     = 200
		rounds      = 3
		roundLength = 600 * time.Millisecond
		maxOps      = 3000
	)
	if testing.Short() {
		t.Skip("stress test")
	}
	for round := range rounds {
		stressRound(t, round, workers, roundLength, maxOps)
		if t.Failed() {
			return
		}
	}
}

func stressRound(t *testing.T, round, workers int, length time.Duration, maxOps int) {
	conn := &stressConnector{}
	mon := &invariantMonitor{}
	var self atomic.Pointer[Pool]
	o := DefaultOptions()
	o.MaxPoolSize = 10
	o.MinPoolSize = 3
	o.MaxConnecting = 2
	o.MaxIdleTime = 5 * time.Millisecond
	o.MaintenanceInterval = 2 * time.Millisecond
	o.WaitQueueTimeout = 20 * time.Millisecond
	o.Monitor = mon
	o.OnBackgroundError = func(error) {
		if p := self.Load(); p != nil && rand.IntN(4) == 0 {
			p.Clear(false)
		}
	}
	p, err := New(fmt.Sprintf("stress.test:%d", 27017+round), conn, o)
	if err != nil {
		t.Fatal(err)
	}
	mon.p.Store(p)
	self.Store(p)
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}

	var owned sync.Map // *Conn -> *atomic.Bool: held by a worker right now
	hold := func(c *Conn) bool {
		v, _ := owned.LoadOrStore(c, new(atomic.Bool))
		return v.(*atomic.Bool).CompareAndSwap(false, true)
	}
	release := func(c *Conn) {
		v, _ := owned.Load(c)
		v.(*atomic.Bool).Store(false)
	}
	var ops, served atomic.Int64
	deadline := time.Now().Add(length)
	closeAt := time.Duration(float64(length) * (0.5 + rand.Float64()*0.4))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		time.Sleep(closeAt)
		p.Close()
	}()
	use := func(c *Conn) {
		if !hold(c) {
			t.Errorf("connection %d handed to two owners at once", c.ID())
			return
		}
		if rand.IntN(4) == 0 {
			time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
		}
		if rand.IntN(20) == 0 {
			c.MarkErrored(errors.New("i/o error"))
		}
		release(c)
	}
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < maxOps && time.Now().Before(deadline); i++ {
				ops.Add(1)
				switch r := rand.IntN(1000); {
				case r < 3:
					p.Clear(rand.IntN(2) == 0)
				case r < 60:
					_ = p.Ready()
				case r < 200:
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(1+rand.IntN(30))*time.Millisecond)
					err := p.Use(ctx, func(c *Conn) error { use(c); return nil })
					cancel()
					checkStressErr(t, w, err)
				default:
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(1+rand.IntN(30))*time.Millisecond)
					c, err := p.CheckOut(ctx)
					cancel()
					if err != nil {
						checkStressErr(t, w, err)
						if errors.As(err, new(*PoolClosedError)) {
							return
						}
						continue
					}
					served.Add(1)
					use(c)
					if err := p.CheckIn(c); err != nil {
						t.Errorf("worker %d: check-in: %v", w, err)
					}
				}
			}
		}()
	}
	wg.Wait()
	p.Close()
	waitGroupTimeout(t, &p.wg, 10*time.Second)

	mon.mu.Lock()
	for _, e := range mon.errs {
		t.Errorf("round %d: %s", round, e)
	}
	mon.mu.Unlock()
	s := p.Stats()
	if s.Total != 0 || s.Pending != 0 || s.InUse != 0 || s.Available != 0 || s.Waiters != 0 {
		t.Errorf("round %d: pool not empty after close: %+v", round, s.Counts)
	}
	conn.mu.Lock()
	for i, u := range conn.ups {
		if n := u.closes.Load(); n != 1 {
			t.Errorf("round %d: upstream %d closed %d times", round, i, n)
		}
	}
	nUps := len(conn.ups)
	conn.mu.Unlock()
	t.Logf("round %d: %d ops, %d checkouts served, %d connections established, %d events, closed at %v",
		round, ops.Load(), served.Load(), nUps, mon.events.Load(), closeAt)
	if served.Load() == 0 {
		t.Errorf("round %d: no checkout was ever served", round)
	}
}

// checkStressErr accepts the errors a checkout may legitimately return under the
// stress test's chaos and reports anything else.
func checkStressErr(t *testing.T, w int, err error) {
	if err == nil {
		return
	}
	switch {
	case errors.As(err, new(*PoolClosedError)),
		errors.As(err, new(*PoolClearedError)),
		errors.As(err, new(*WaitQueueTimeoutError)),
		errors.As(err, new(*ConnectionError)):
		return
	}
	t.Errorf("worker %d: unexpected error %T: %v", w, err, err)
}

func waitGroupTimeout(t *testing.T, wg *sync.WaitGroup, d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("pool goroutines still running %v after Close", d)
	}
}
