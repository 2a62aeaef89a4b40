package metrics

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/testutil/wait"
)

// nopUpstream is an upstream connection without I/O.
type nopUpstream struct{ pool.Upstream }

func (nopUpstream) Close() error { return nil }

// mockConnector establishes nopUpstreams at once, or fails the IDs in fail.
type mockConnector struct {
	fail sync.Map // int64 -> struct{}
}

var errDial = errors.New("mock dial refused")

func (c *mockConnector) Connect(ctx context.Context, _ string, id int64) (pool.Upstream, error) {
	if _, bad := c.fail.Load(id); bad {
		return nil, errDial
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return nopUpstream{}, nil
}

// newRealPool returns a ready pool of route "r" monitored by m.
func newRealPool(t *testing.T, m *Metrics, addr string, conn pool.Connector, maxPoolSize, minPoolSize int) *pool.Pool {
	t.Helper()
	o := pool.DefaultOptions()
	o.MaxPoolSize = maxPoolSize
	o.MinPoolSize = minPoolSize
	o.Monitor = m.PoolMonitor("r")
	p, err := pool.New(addr, conn, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	return p
}

// eventually polls cond for up to 5s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	wait.Until(t, what, 5*time.Second, time.Millisecond, cond)
}

// matchStats asserts that the exported gauges and the registry agree with
// the pool's own Stats.
func matchStats(t *testing.T, m *Metrics, p *pool.Pool) {
	t.Helper()
	st := p.Stats()
	g := poolGauges(t, m, "r", p.Address())
	want := gauges{available: float64(st.Available), inUse: float64(st.InUse), pending: float64(st.Pending), waiters: float64(st.Waiters)}
	if g != want {
		t.Fatalf("gauges %+v, pool Stats %+v", g, st.Counts)
	}
	byState := map[string]int{}
	n := 0
	for _, c := range m.Connections() {
		if c.Server == p.Address() {
			byState[c.State]++
			n++
		}
	}
	if n != st.Total || byState[ConnAvailable] != st.Available || byState[ConnInUse] != st.InUse || byState[ConnPending] != st.Pending {
		t.Fatalf("registry by state %v (total %d), pool Stats %+v", byState, n, st.Counts)
	}
	if st.Options.MaxPoolSize > 0 && st.State != pool.StateClosed {
		if u := val(t, m, famUtil, "route", "r", "server", p.Address()); u != float64(st.InUse)/float64(st.Options.MaxPoolSize) {
			t.Fatalf("utilization %v, pool %d/%d", u, st.InUse, st.Options.MaxPoolSize)
		}
	}
}

// A real pool driven through checkouts, waits, timeouts, failures, a clear
// and a close: after each step the exported gauges equal the pool's Stats,
// and the counters count what happened.
func TestRealPoolMatchesStats(t *testing.T) {
	m := New()
	conn := &mockConnector{}
	p := newRealPool(t, m, "real:27017", conn, 2, 0)
	ctx := context.Background()
	counter := func(fam string, kv ...string) float64 {
		return val(t, m, fam, append([]string{"route", "r", "server", p.Address()}, kv...)...)
	}
	matchStats(t, m, p)

	c1, err := p.CheckOut(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := p.CheckOut(ctx)
	if err != nil {
		t.Fatal(err)
	}
	matchStats(t, m, p)

	// Three waiters behind a full pool.
	type result struct {
		c   *pool.Conn
		err error
	}
	results := make(chan result, 3)
	var cancels []context.CancelFunc
	for i := range 3 {
		wctx, cancel := context.WithCancel(ctx)
		cancels = append(cancels, cancel)
		go func() {
			c, err := p.CheckOut(wctx)
			results <- result{c, err}
		}()
		eventually(t, "a waiter to queue", func() bool { return p.Stats().Waiters == i+1 })
	}
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	matchStats(t, m, p)

	// A check-in goes straight to the oldest waiter.
	if err := p.CheckIn(c1); err != nil {
		t.Fatal(err)
	}
	r := <-results
	if r.err != nil {
		t.Fatal(r.err)
	}
	c1 = r.c
	matchStats(t, m, p)

	// The newest waiter gives up: a timeout failure.
	cancels[2]()
	r = <-results
	var wqt *pool.WaitQueueTimeoutError
	if !errors.As(r.err, &wqt) {
		t.Fatalf("cancelled waiter got %v", r.err)
	}
	matchStats(t, m, p)
	if v := counter(famFailures, "reason", "timeout"); v != 1 {
		t.Fatalf("timeout failures %v", v)
	}

	// A clear evicts the remaining waiter (connectionError) and makes the
	// in-use connections stale: closed at check-in.
	p.Clear(false)
	r = <-results
	var pce *pool.PoolClearedError
	if !errors.As(r.err, &pce) {
		t.Fatalf("evicted waiter got %v", r.err)
	}
	matchStats(t, m, p)
	if v := counter(famCleared); v != 1 {
		t.Fatalf("cleared %v", v)
	}
	if v := counter(famFailures, "reason", "connectionError"); v != 1 {
		t.Fatalf("connectionError failures %v", v)
	}
	for _, c := range []*pool.Conn{c1, c2} {
		if err := p.CheckIn(c); err != nil {
			t.Fatal(err)
		}
	}
	matchStats(t, m, p)
	if v := counter(famClosed, "reason", "stale"); v != 2 {
		t.Fatalf("stale closes %v", v)
	}

	// Checking out of a paused pool fails at once.
	if _, err := p.CheckOut(ctx); err == nil {
		t.Fatal("checkout from a paused pool succeeded")
	}
	if v := counter(famFailures, "reason", "connectionError"); v != 2 {
		t.Fatalf("connectionError failures %v", v)
	}
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}

	// An establishment failure, then an errored connection.
	conn.fail.Store(int64(3), struct{}{})
	if _, err := p.CheckOut(ctx); err == nil {
		t.Fatal("checkout with a failing connector succeeded")
	}
	matchStats(t, m, p)
	if v := counter(famFailures, "reason", "connectionError"); v != 3 {
		t.Fatalf("connectionError failures %v", v)
	}
	c3, err := p.CheckOut(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c3.MarkErrored(errors.New("broken pipe"))
	if err := p.CheckIn(c3); err != nil {
		t.Fatal(err)
	}
	matchStats(t, m, p)
	if v := counter(famClosed, "reason", "error"); v != 2 {
		t.Fatalf("error closes %v (one failed establishment, one errored)", v)
	}

	// Available and in-use connections at close.
	c5, err := p.CheckOut(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c6, err := p.CheckOut(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.CheckIn(c5); err != nil {
		t.Fatal(err)
	}
	matchStats(t, m, p)
	if v := counter(famCreated); v != 6 {
		t.Fatalf("created %v, want 6", v)
	}
	successful := uint64(2 + 1 + 1 + 2) // c1 c2, the waiter, c3, c5 c6
	if n := histCount(t, m, famCheckout, "route", "r", "server", p.Address()); n != successful {
		t.Fatalf("checkout histogram count %d, want %d", n, successful)
	}
	if s := m.Stats(); s.WaitAvg <= 0 || s.WaitP99 < s.WaitAvg/2 {
		t.Fatalf("stats wait avg %v p99 %v", s.WaitAvg, s.WaitP99)
	}

	p.Close()
	if g := poolGauges(t, m, "r", p.Address()); g != (gauges{inUse: 1}) {
		t.Fatalf("closed pool with one in use: %+v", g)
	}
	if v := counter(famClosed, "reason", "poolClosed"); v != 1 {
		t.Fatalf("poolClosed closes %v", v)
	}
	if c := m.Connections(); len(c) != 0 {
		t.Fatalf("registry after close: %+v", c)
	}
	if err := p.CheckIn(c6); err != nil {
		t.Fatal(err)
	}
	if mf := families(t, m)[famConns]; mf != nil {
		t.Fatalf("closed, drained pool still exported:\n%s", dump(t, m, famConns))
	}
}

// Concurrent checkouts on real pools with waits and timeouts, concurrent
// requests and scrapes: at quiescence every gauge equals the pool's Stats
// and the totals add up (and -race finds no race).
func TestRealPoolConcurrent(t *testing.T) {
	m := New()
	conn := &mockConnector{}
	pools := []*pool.Pool{
		newRealPool(t, m, "c1:1", conn, 3, 0),
		newRealPool(t, m, "c2:1", conn, 5, 0),
		// Population by maintenance: waiters take over connections being
		// established for minPoolSize.
		newRealPool(t, m, "c3:1", conn, 4, 3),
	}
	const workers, iters = 8, 300
	var ok, failed atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	deadline := time.Now().Add(10 * time.Second)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := pools[w%len(pools)]
			for i := 0; i < iters && time.Now().Before(deadline); i++ {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%3)*time.Millisecond+100*time.Microsecond)
				c, err := p.CheckOut(ctx)
				cancel()
				if err != nil {
					failed.Add(1)
					continue
				}
				ok.Add(1)
				if i%17 == 0 {
					c.MarkErrored(errDial)
				}
				m.Request("r", "find", 10, 20, time.Duration(i)*time.Microsecond, i%5 != 0)
				_ = p.CheckIn(c)
			}
		}()
	}
	var scrapes sync.WaitGroup
	scrapes.Add(1)
	go func() {
		defer scrapes.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, _ = m.reg.Gather()
			_ = m.Connections()
			_ = m.Stats()
			time.Sleep(time.Millisecond)
		}
	}()
	wg.Wait()
	close(stop)
	scrapes.Wait()

	var created, closed, checkouts float64
	for _, p := range pools {
		eventually(t, "population to finish", func() bool { return p.Stats().Pending == 0 })
		matchStats(t, m, p)
		created += val(t, m, famCreated, "route", "r", "server", p.Address())
		for _, r := range []string{"stale", "idle", "error", "poolClosed"} {
			closed += val(t, m, famClosed, "route", "r", "server", p.Address(), "reason", r)
		}
		checkouts += float64(histCount(t, m, famCheckout, "route", "r", "server", p.Address()))
	}
	var total int
	for _, p := range pools {
		total += p.Stats().Total
	}
	if created-closed != float64(total) {
		t.Fatalf("created %v - closed %v != pools' total %d", created, closed, total)
	}
	if checkouts != float64(ok.Load()) {
		t.Fatalf("checkout histogram counts %v, successful checkouts %d", checkouts, ok.Load())
	}
	var fails float64
	for _, p := range pools {
		for _, r := range []string{"timeout", "connectionError", "poolClosed"} {
			fails += val(t, m, famFailures, "route", "r", "server", p.Address(), "reason", r)
		}
	}
	if fails != float64(failed.Load()) {
		t.Fatalf("failure counters %v, failed checkouts %d", fails, failed.Load())
	}
	if s := m.Stats(); s.Operations != uint64(ok.Load()) || s.BytesIn != 10*s.Operations {
		t.Fatalf("stats %+v after %d requests", s, ok.Load())
	}
	t.Logf("%d checkouts, %d failed, %v created", ok.Load(), failed.Load(), created)
}
