package metrics

import (
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/pool"
)

const (
	famConns    = "mongobouncer_pool_connections"
	famWaiters  = "mongobouncer_pool_wait_queue_length"
	famMax      = "mongobouncer_pool_max_size"
	famUtil     = "mongobouncer_pool_utilization_ratio"
	famCheckout = "mongobouncer_pool_checkout_duration_seconds"
	famFailures = "mongobouncer_pool_checkout_failures_total"
	famCreated  = "mongobouncer_pool_connections_created_total"
	famClosed   = "mongobouncer_pool_connections_closed_total"
	famCleared  = "mongobouncer_pool_cleared_total"
)

// gauges are the pool gauges of one route and server as exported.
type gauges struct{ available, inUse, pending, waiters float64 }

func poolGauges(t *testing.T, m *Metrics, route, server string) gauges {
	t.Helper()
	return gauges{
		available: val(t, m, famConns, "route", route, "server", server, "state", "available"),
		inUse:     val(t, m, famConns, "route", route, "server", server, "state", "in_use"),
		pending:   val(t, m, famConns, "route", route, "server", server, "state", "pending"),
		waiters:   val(t, m, famWaiters, "route", route, "server", server),
	}
}

func ev(typ pool.EventType, addr string, id int64, c pool.Counts) pool.Event {
	return pool.Event{Type: typ, Address: addr, ConnectionID: id, Counts: c}
}

// createdPool returns Metrics and a Monitor of route that has seen
// PoolCreated for addr with the default options.
func createdPool(route, addr string) (*Metrics, pool.Monitor) {
	m := New()
	mon := m.PoolMonitor(route)
	opts := pool.DefaultOptions()
	mon.HandleEvent(pool.Event{Type: pool.PoolCreated, Address: addr, Options: &opts})
	return m, mon
}

// A synthetic lifecycle: every gauge, counter and registry entry follows
// the events, including the corrections for the events whose counts are
// taken before the connection moves on.
func TestPoolMonitorSyntheticLifecycle(t *testing.T) {
	m := New()
	mon := m.PoolMonitor("app")
	const a = "db1:27017"
	opts := pool.DefaultOptions()
	opts.MaxPoolSize = 4
	mon.HandleEvent(pool.Event{Type: pool.PoolCreated, Address: a, Options: &opts})
	mon.HandleEvent(ev(pool.PoolReady, a, 0, pool.Counts{}))
	if g := poolGauges(t, m, "app", a); g != (gauges{}) {
		t.Fatalf("fresh pool gauges %+v", g)
	}
	if v := val(t, m, famMax, "route", "app", "server", a); v != 4 {
		t.Fatalf("max size %v, want 4", v)
	}
	// The known reasons exist from the start, at zero.
	for _, r := range []string{"timeout", "connectionError", "poolClosed"} {
		if v := val(t, m, famFailures, "route", "app", "server", a, "reason", r); v != 0 {
			t.Fatalf("failures %s = %v", r, v)
		}
	}
	for _, r := range []string{"stale", "idle", "error", "poolClosed"} {
		if v := val(t, m, famClosed, "route", "app", "server", a, "reason", r); v != 0 {
			t.Fatalf("closed %s = %v", r, v)
		}
	}

	before := time.Now()
	mon.HandleEvent(ev(pool.ConnectionCheckOutStarted, a, 0, pool.Counts{}))
	if g := poolGauges(t, m, "app", a); g.waiters != 1 {
		t.Fatalf("after CheckOutStarted on an empty pool, waiters %v, want 1 (it joins the queue)", g.waiters)
	}
	mon.HandleEvent(pool.Event{Type: pool.ConnectionCreated, Address: a, ConnectionID: 1, Generation: 0, Counts: pool.Counts{Total: 1, Pending: 1}})
	if g := poolGauges(t, m, "app", a); g != (gauges{pending: 1}) {
		t.Fatalf("after ConnectionCreated %+v", g)
	}
	conns := m.Connections()
	if len(conns) != 1 || conns[0].State != ConnPending || conns[0].ID != 1 || conns[0].Route != "app" || conns[0].Server != a || conns[0].CreatedAt.Before(before) {
		t.Fatalf("registry after create: %+v", conns)
	}
	// Ready's counts still count the connection as pending.
	mon.HandleEvent(ev(pool.ConnectionReady, a, 1, pool.Counts{Total: 1, Pending: 1}))
	if g := poolGauges(t, m, "app", a); g != (gauges{available: 1}) {
		t.Fatalf("after ConnectionReady %+v, want it available", g)
	}
	if c := m.Connections(); c[0].State != ConnAvailable {
		t.Fatalf("registry after ready: %+v", c)
	}
	mon.HandleEvent(pool.Event{Type: pool.ConnectionCheckedOut, Address: a, ConnectionID: 1, Duration: 3 * time.Millisecond, Counts: pool.Counts{Total: 1, InUse: 1}})
	if g := poolGauges(t, m, "app", a); g != (gauges{inUse: 1}) {
		t.Fatalf("after CheckedOut %+v", g)
	}
	if v := val(t, m, famUtil, "route", "app", "server", a); v != 0.25 {
		t.Fatalf("utilization %v, want 1/4", v)
	}
	if n := histCount(t, m, famCheckout, "route", "app", "server", a); n != 1 {
		t.Fatalf("checkout histogram count %d", n)
	}
	time.Sleep(time.Millisecond)
	listed := time.Now()
	c := m.Connections()
	if c[0].State != ConnInUse || c[0].LastUsed.Before(listed) {
		t.Fatalf("registry after checkout: %+v; a connection in use was last used now (%v)", c, listed)
	}
	lastOut := c[0].LastUsed
	if s := m.Stats(); s.WaitAvg < 2900*time.Microsecond || s.WaitAvg > 3100*time.Microsecond || s.WaitP99 != s.WaitAvg {
		t.Fatalf("stats wait avg %v p99 %v, want ~3ms", s.WaitAvg, s.WaitP99)
	}

	// A second checkout waits behind a full pool... of one in use: pretend
	// the pool is at its limit.
	mon.HandleEvent(ev(pool.ConnectionCheckOutStarted, a, 0, pool.Counts{Total: 1, InUse: 1}))
	if g := poolGauges(t, m, "app", a); g.waiters != 1 {
		t.Fatalf("waiters %v, want 1", g.waiters)
	}
	mon.HandleEvent(pool.Event{Type: pool.ConnectionCheckOutFailed, Address: a, Reason: pool.ReasonTimeout, Counts: pool.Counts{Total: 1, InUse: 1}})
	if g := poolGauges(t, m, "app", a); g != (gauges{inUse: 1}) {
		t.Fatalf("after timeout %+v", g)
	}
	if v := val(t, m, famFailures, "route", "app", "server", a, "reason", "timeout"); v != 1 {
		t.Fatalf("timeout failures %v", v)
	}

	// CheckedIn's counts still count the connection as in use.
	time.Sleep(time.Millisecond) // lastUsed must move on a coarse clock too
	mon.HandleEvent(ev(pool.ConnectionCheckedIn, a, 1, pool.Counts{Total: 1, InUse: 1}))
	if g := poolGauges(t, m, "app", a); g != (gauges{available: 1}) {
		t.Fatalf("after CheckedIn %+v, want it available", g)
	}
	if c := m.Connections(); c[0].State != ConnAvailable || !c[0].LastUsed.After(lastOut) {
		t.Fatalf("registry after check-in: %+v (checked out at %v)", c, lastOut)
	}

	mon.HandleEvent(pool.Event{Type: pool.PoolCleared, Address: a, Generation: 1, Counts: pool.Counts{Total: 1, Available: 1}})
	if v := val(t, m, famCleared, "route", "app", "server", a); v != 1 {
		t.Fatalf("cleared %v", v)
	}
	mon.HandleEvent(pool.Event{Type: pool.ConnectionClosed, Address: a, ConnectionID: 1, Reason: pool.ReasonStale, Counts: pool.Counts{}})
	if v := val(t, m, famClosed, "route", "app", "server", a, "reason", "stale"); v != 1 {
		t.Fatalf("closed stale %v", v)
	}
	if c := m.Connections(); len(c) != 0 {
		t.Fatalf("registry after close: %+v", c)
	}
	if v := val(t, m, famCreated, "route", "app", "server", a); v != 1 {
		t.Fatalf("created %v", v)
	}

	// A closed pool with no connection left stops being exported.
	mon.HandleEvent(ev(pool.PoolClosed, a, 0, pool.Counts{}))
	for _, f := range []string{famConns, famWaiters, famMax, famUtil, famCheckout, famFailures, famCreated, famClosed, famCleared} {
		if mf := families(t, m)[f]; mf != nil {
			t.Errorf("%s still exported after the pool closed and drained:\n%s", f, dump(t, m, f))
		}
	}
	// Checkouts failing on the closed pool later find its state and do not
	// bring its series back.
	mon.HandleEvent(ev(pool.ConnectionCheckOutStarted, a, 0, pool.Counts{}))
	mon.HandleEvent(pool.Event{Type: pool.ConnectionCheckOutFailed, Address: a, Reason: pool.ReasonPoolClosed})
	if mf := families(t, m)[famFailures]; mf != nil {
		t.Errorf("failures of a closed pool exported:\n%s", dump(t, m, famFailures))
	}
}

// A closed pool keeps being exported while in-use connections drain; its
// registry entries go at PoolClosed.
func TestPoolMonitorDrainAfterClose(t *testing.T) {
	const a = "h:1"
	m, mon := createdPool("r", a)
	mon.HandleEvent(pool.Event{Type: pool.ConnectionCreated, Address: a, ConnectionID: 1, Counts: pool.Counts{Total: 1, Pending: 1}})
	mon.HandleEvent(pool.Event{Type: pool.ConnectionCheckedOut, Address: a, ConnectionID: 1, Counts: pool.Counts{Total: 1, InUse: 1}})
	mon.HandleEvent(pool.Event{Type: pool.PoolClosed, Address: a, Counts: pool.Counts{Total: 1, InUse: 1}})
	if c := m.Connections(); len(c) != 0 {
		t.Fatalf("registry after PoolClosed: %+v", c)
	}
	if g := poolGauges(t, m, "r", a); g != (gauges{inUse: 1}) {
		t.Fatalf("draining pool gauges %+v", g)
	}
	// A draining pool has no limit any more: no max size, no utilization.
	if find(t, m, famMax, "route", "r", "server", a) != nil || find(t, m, famUtil, "route", "r", "server", a) != nil {
		t.Fatal("a closed pool exports a max size or utilization")
	}
	mon.HandleEvent(pool.Event{Type: pool.ConnectionCheckedIn, Address: a, ConnectionID: 1, Counts: pool.Counts{Total: 1, InUse: 1}})
	mon.HandleEvent(pool.Event{Type: pool.ConnectionClosed, Address: a, ConnectionID: 1, Reason: pool.ReasonPoolClosed})
	if mf := families(t, m)[famConns]; mf != nil {
		t.Fatalf("drained pool still exported:\n%s", dump(t, m, famConns))
	}
}

// Unlimited pools export max size 0 and no utilization; SetPoolLimit
// changes the limit the ratio uses.
func TestPoolMonitorLimits(t *testing.T) {
	m := New()
	mon := m.PoolMonitor("r")
	opts := pool.DefaultOptions()
	opts.MaxPoolSize = 0
	mon.HandleEvent(pool.Event{Type: pool.PoolCreated, Address: "u:1", Options: &opts})
	mon.HandleEvent(pool.Event{Type: pool.ConnectionCheckedOut, Address: "u:1", Counts: pool.Counts{Total: 3, InUse: 3}})
	if v := val(t, m, famMax, "route", "r", "server", "u:1"); v != 0 {
		t.Fatalf("unlimited max size %v, want 0", v)
	}
	if s := find(t, m, famUtil, "route", "r", "server", "u:1"); s != nil {
		t.Fatalf("utilization exported for an unlimited pool: %v", s)
	}
	m.SetPoolLimit("r", "u:1", 6)
	if v := val(t, m, famUtil, "route", "r", "server", "u:1"); v != 0.5 {
		t.Fatalf("utilization %v after SetPoolLimit(6) with 3 in use, want 0.5", v)
	}
	m.SetPoolLimit("r", "other:1", 1) // no such pool: no effect, no series
	if find(t, m, famMax, "route", "r", "server", "other:1") != nil {
		t.Fatal("SetPoolLimit created a series for an unknown pool")
	}
}

// Two pools of the same route and server (one replacing the other while it
// drains, each with its own Monitor) are summed; the shared counters
// survive the old pool's end.
func TestPoolMonitorReplacementSums(t *testing.T) {
	m := New()
	oldMon, newMon := m.PoolMonitor("r"), m.PoolMonitor("r")
	const a = "h:1"
	o1, o2 := pool.DefaultOptions(), pool.DefaultOptions()
	o1.MaxPoolSize, o2.MaxPoolSize = 10, 4
	oldMon.HandleEvent(pool.Event{Type: pool.PoolCreated, Address: a, Options: &o1})
	oldMon.HandleEvent(pool.Event{Type: pool.ConnectionCreated, Address: a, ConnectionID: 1, Counts: pool.Counts{Total: 1, Pending: 1}})
	oldMon.HandleEvent(pool.Event{Type: pool.ConnectionCheckedOut, Address: a, ConnectionID: 1, Counts: pool.Counts{Total: 1, InUse: 1}})
	newMon.HandleEvent(pool.Event{Type: pool.PoolCreated, Address: a, Options: &o2})
	newMon.HandleEvent(pool.Event{Type: pool.ConnectionCreated, Address: a, ConnectionID: 1, Counts: pool.Counts{Total: 1, Pending: 1}})
	newMon.HandleEvent(pool.Event{Type: pool.ConnectionCheckedOut, Address: a, ConnectionID: 1, Counts: pool.Counts{Total: 1, InUse: 1}})
	oldMon.HandleEvent(pool.Event{Type: pool.PoolClosed, Address: a, Counts: pool.Counts{Total: 1, InUse: 1}})

	if g := poolGauges(t, m, "r", a); g.inUse != 2 {
		t.Fatalf("in use %v, want both pools' 2", g.inUse)
	}
	// Only the live pool's limit counts.
	if v := val(t, m, famUtil, "route", "r", "server", a); v != 0.5 {
		t.Fatalf("utilization %v, want 2/4", v)
	}
	if v := val(t, m, famCreated, "route", "r", "server", a); v != 2 {
		t.Fatalf("created %v, want 2", v)
	}
	if c := m.Connections(); len(c) != 1 {
		t.Fatalf("registry: %+v, want only the new pool's connection", c)
	}
	oldMon.HandleEvent(pool.Event{Type: pool.ConnectionClosed, Address: a, ConnectionID: 1, Reason: pool.ReasonPoolClosed})
	if g := poolGauges(t, m, "r", a); g.inUse != 1 {
		t.Fatalf("in use %v after the old pool drained, want 1", g.inUse)
	}
	if v := val(t, m, famCreated, "route", "r", "server", a); v != 2 {
		t.Fatalf("created %v after the old pool drained, want 2 (series kept)", v)
	}
	if v := val(t, m, famClosed, "route", "r", "server", a, "reason", "poolClosed"); v != 1 {
		t.Fatalf("closed poolClosed %v", v)
	}
}

// One Monitor serves every server of a route; a PoolCreated for an address
// it already tracks replaces that pool.
func TestPoolMonitorServersAndRecreate(t *testing.T) {
	m := New()
	mon := m.PoolMonitor("r")
	opts := pool.DefaultOptions()
	for _, a := range []string{"a:1", "b:1"} {
		mon.HandleEvent(pool.Event{Type: pool.PoolCreated, Address: a, Options: &opts})
	}
	mon.HandleEvent(pool.Event{Type: pool.ConnectionCreated, Address: "b:1", ConnectionID: 7, Counts: pool.Counts{Total: 1, Pending: 1}})
	if g := poolGauges(t, m, "r", "b:1"); g.pending != 1 {
		t.Fatalf("b pending %v", g.pending)
	}
	if g := poolGauges(t, m, "r", "a:1"); g != (gauges{}) {
		t.Fatalf("a gauges %+v", g)
	}
	c := m.Connections()
	if len(c) != 1 || c[0].Server != "b:1" || c[0].ID != 7 {
		t.Fatalf("registry %+v", c)
	}
	mon.HandleEvent(pool.Event{Type: pool.PoolCreated, Address: "b:1", Options: &opts})
	if g := poolGauges(t, m, "r", "b:1"); g != (gauges{}) {
		t.Fatalf("recreated b gauges %+v", g)
	}
	if c := m.Connections(); len(c) != 0 {
		t.Fatalf("registry after recreate %+v", c)
	}
	if v := val(t, m, famCreated, "route", "r", "server", "b:1"); v != 1 {
		t.Fatalf("created %v: the counter must survive a replacement", v)
	}
	// A Monitor that never saw PoolCreated still tracks the pool (unknown
	// limit: treated as unlimited).
	mon2 := m.PoolMonitor("late")
	mon2.HandleEvent(pool.Event{Type: pool.ConnectionCheckedOut, Address: "c:1", ConnectionID: 1, Counts: pool.Counts{Total: 1, InUse: 1}})
	if g := poolGauges(t, m, "late", "c:1"); g.inUse != 1 {
		t.Fatalf("late monitor gauges %+v", g)
	}
}

// Reasons the pool package does not define are counted as "other".
func TestPoolMonitorUnknownReason(t *testing.T) {
	m := New()
	mon := m.PoolMonitor("r")
	mon.HandleEvent(pool.Event{Type: pool.ConnectionCheckOutFailed, Address: "a:1", Reason: "brandNew"})
	mon.HandleEvent(pool.Event{Type: pool.ConnectionClosed, Address: "a:1", Reason: "brandNew"})
	if v := val(t, m, famFailures, "route", "r", "server", "a:1", "reason", OtherLabel); v != 1 {
		t.Fatalf("other failures %v", v)
	}
	if v := val(t, m, famClosed, "route", "r", "server", "a:1", "reason", OtherLabel); v != 1 {
		t.Fatalf("other closes %v", v)
	}
}

// Connections are ordered by route, server and ID.
func TestConnectionsOrder(t *testing.T) {
	m := New()
	for _, r := range []string{"b", "a"} {
		mon := m.PoolMonitor(r)
		for _, s := range []string{"y:1", "x:1"} {
			for _, id := range []int64{3, 1, 2} {
				mon.HandleEvent(pool.Event{Type: pool.ConnectionCreated, Address: s, ConnectionID: id})
			}
		}
	}
	c := m.Connections()
	if len(c) != 12 {
		t.Fatalf("%d connections", len(c))
	}
	for i := 1; i < len(c); i++ {
		p, q := c[i-1], c[i]
		if p.Route > q.Route || (p.Route == q.Route && (p.Server > q.Server || (p.Server == q.Server && p.ID >= q.ID))) {
			t.Fatalf("not ordered at %d: %+v then %+v", i, p, q)
		}
	}
}

func poolCreated(addr string, maxPoolSize int) pool.Event {
	o := pool.DefaultOptions()
	o.MaxPoolSize = maxPoolSize
	return pool.Event{Type: pool.PoolCreated, Address: addr, Options: &o}
}

// CheckoutTotals sums the successful checkouts and their waits of one
// (route, server), for windowed means computed by readers.
func TestCheckoutTotals(t *testing.T) {
	const a = "db1:27017"
	m, mon := createdPool("app", a)
	mon.HandleEvent(ev(pool.PoolReady, a, 0, pool.Counts{}))
	if n, w := m.CheckoutTotals("app", a); n != 0 || w != 0 {
		t.Fatalf("fresh totals %d %v", n, w)
	}
	mon.HandleEvent(ev(pool.ConnectionCreated, a, 1, pool.Counts{Total: 1, Pending: 1}))
	mon.HandleEvent(ev(pool.ConnectionReady, a, 1, pool.Counts{Total: 1, Pending: 1}))
	for _, d := range []time.Duration{2 * time.Millisecond, 4 * time.Millisecond} {
		e := ev(pool.ConnectionCheckedOut, a, 1, pool.Counts{Total: 1, InUse: 1})
		e.Duration = d
		mon.HandleEvent(e)
		mon.HandleEvent(ev(pool.ConnectionCheckedIn, a, 1, pool.Counts{Total: 1, InUse: 1}))
	}
	// A failed checkout is not a successful one.
	f := ev(pool.ConnectionCheckOutFailed, a, 0, pool.Counts{Total: 1, Available: 1})
	f.Reason, f.Duration = pool.ReasonTimeout, time.Second
	mon.HandleEvent(f)
	if n, w := m.CheckoutTotals("app", a); n != 2 || w != 6*time.Millisecond {
		t.Fatalf("totals %d %v, want 2 and 6ms", n, w)
	}
	if n, w := m.CheckoutTotals("app", "other:27017"); n != 0 || w != 0 {
		t.Fatalf("unknown server totals %d %v", n, w)
	}
}

// The checkout histogram is built from counters: checkouts that did not
// wait (Duration 0) land in the first bucket, those that waited in theirs,
// waits beyond the last bucket only in +Inf; sum and count include all.
func TestCheckoutHistogram(t *testing.T) {
	const a = "db1:27017"
	m, mon := createdPool("app", a)
	mon.HandleEvent(ev(pool.ConnectionCreated, a, 1, pool.Counts{Total: 1, Pending: 1}))
	for _, d := range []time.Duration{0, 0, 0, 3 * time.Millisecond, 10 * time.Microsecond, 40 * time.Second} {
		e := ev(pool.ConnectionCheckedOut, a, 1, pool.Counts{Total: 1, InUse: 1})
		e.Duration = d
		mon.HandleEvent(e)
	}
	h := find(t, m, famCheckout, "route", "app", "server", a).GetHistogram()
	if h.GetSampleCount() != 6 {
		t.Fatalf("count %d, want 6", h.GetSampleCount())
	}
	if sum := h.GetSampleSum(); sum < 40.00300 || sum > 40.00302 {
		t.Fatalf("sum %v, want 40.00301", sum)
	}
	want := map[float64]uint64{10e-6: 4, 25e-6: 4, 1e-3: 4, 2.5e-3: 4, 5e-3: 5, 10: 5, 30: 5}
	got := map[float64]uint64{}
	prev := uint64(0)
	for _, b := range h.GetBucket() {
		if b.GetCumulativeCount() < prev {
			t.Fatalf("buckets not cumulative: %v", h.GetBucket())
		}
		prev = b.GetCumulativeCount()
		got[b.GetUpperBound()] = b.GetCumulativeCount()
	}
	if len(got) != len(checkoutBuckets) {
		t.Fatalf("%d buckets, want %d", len(got), len(checkoutBuckets))
	}
	for le, n := range want {
		if got[le] != n {
			t.Errorf("bucket le=%v: %d, want %d", le, got[le], n)
		}
	}
}

// Checkouts update the connection registry without a lock: events of two
// servers interleaved (each pool's own events in order, as pools emit
// them) must land on their own server while SHOW SERVERS reads the
// registry concurrently (the race detector checks the latter).
func TestRegistryInterleavedServersConcurrentReads(t *testing.T) {
	m := New()
	mon := m.PoolMonitor("r")
	opts := pool.DefaultOptions()
	addrs := []string{"a:1", "b:1"}
	for _, a := range addrs {
		mon.HandleEvent(pool.Event{Type: pool.PoolCreated, Address: a, Options: &opts})
		mon.HandleEvent(ev(pool.ConnectionCreated, a, 1, pool.Counts{Total: 1, Pending: 1}))
		mon.HandleEvent(ev(pool.ConnectionReady, a, 1, pool.Counts{Total: 1, Pending: 1}))
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, c := range m.Connections() {
				if c.State != ConnAvailable && c.State != ConnInUse {
					t.Errorf("connection %d of %s in state %q", c.ID, c.Server, c.State)
					return
				}
			}
		}
	}()
	cycle := func(a string, checkIn bool) {
		mon.HandleEvent(ev(pool.ConnectionCheckOutStarted, a, 0, pool.Counts{Total: 1, Available: 1}))
		mon.HandleEvent(ev(pool.ConnectionCheckedOut, a, 1, pool.Counts{Total: 1, InUse: 1}))
		if checkIn {
			mon.HandleEvent(ev(pool.ConnectionCheckedIn, a, 1, pool.Counts{Total: 1, InUse: 1}))
		}
	}
	for i := range 2000 {
		cycle(addrs[i%2], true)
	}
	cycle("a:1", false) // a:1 ends checked out, b:1 checked in
	cycle("b:1", true)
	close(stop)
	<-done
	got := map[string]string{}
	for _, c := range m.Connections() {
		got[c.Server] = c.State
	}
	if got["a:1"] != ConnInUse || got["b:1"] != ConnAvailable {
		t.Fatalf("registry states %v", got)
	}
	if ga, gb := poolGauges(t, m, "r", "a:1"), poolGauges(t, m, "r", "b:1"); ga.inUse != 1 || ga.available != 0 || gb.available != 1 || gb.inUse != 0 {
		t.Fatalf("gauges a %+v b %+v", ga, gb)
	}
}
