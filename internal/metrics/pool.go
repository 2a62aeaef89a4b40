package metrics

import (
	"cmp"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mongobouncer/mongobouncer/internal/pool"
)

// Connection states as SHOW SERVERS reports them.
const (
	ConnPending   = "pending"
	ConnAvailable = "available"
	ConnInUse     = "in use"
)

// serverKey identifies the pool series of one server of one route.
type serverKey struct{ route, server string }

// serverSeries are the counter and histogram children of one (route,
// server), shared by the pools of that pair (a pool and the one replacing it
// may coexist while the first drains) and resolved once per pool.
type serverSeries struct {
	key serverKey
	// lroute and lserver are key as label values.
	lroute, lserver string
	refs            int // live pool states using these series; guarded by Metrics.mu
	created         prometheus.Counter
	cleared         prometheus.Counter
	// Indexed by failIndex / closeIndex; the last slot is created on first
	// use of a reason the pool package does not define today.
	failures [4]atomic.Pointer[prometheus.Counter]
	closed   [5]atomic.Pointer[prometheus.Counter]
	// checkouts and waitNs total the successful checkouts and their wait,
	// so that readers (the status page) can compute the mean wait over any
	// window from two readings. With waited they are the checkout-duration
	// histogram, exported by checkoutCollector.
	checkouts atomic.Uint64
	waitNs    atomic.Int64
	// waited counts the checkouts that waited (Duration > 0) by the first
	// bucket of checkoutBuckets that holds them, the last slot those beyond
	// every bucket (+Inf). Those that did not wait,
	// almost all on a busy pool, are checkouts minus these: counting them
	// costs the one add on checkouts, where a Prometheus histogram
	// observation costs three atomic updates on lines that every loop
	// thread writes.
	waited [len(checkoutBuckets) + 1]atomic.Uint64
}

// observe counts one successful checkout that waited d (0: it did not).
// checkouts is added to first, so that a reader that loads waited before
// checkouts (checkoutCollector) never sees more waits than checkouts.
func (s *serverSeries) observe(d time.Duration) {
	s.checkouts.Add(1)
	if d <= 0 {
		return
	}
	s.waitNs.Add(int64(d))
	i, _ := slices.BinarySearch(checkoutBuckets[:], d.Seconds())
	s.waited[i].Add(1)
}

var (
	failReasons  = [...]pool.Reason{pool.ReasonTimeout, pool.ReasonConnectionError, pool.ReasonPoolClosed}
	closeReasons = [...]pool.Reason{pool.ReasonStale, pool.ReasonIdle, pool.ReasonError, pool.ReasonPoolClosed}
)

func failIndex(r pool.Reason) int {
	switch r {
	case pool.ReasonTimeout:
		return 0
	case pool.ReasonConnectionError:
		return 1
	case pool.ReasonPoolClosed:
		return 2
	}
	return 3
}

func closeIndex(r pool.Reason) int {
	switch r {
	case pool.ReasonStale:
		return 0
	case pool.ReasonIdle:
		return 1
	case pool.ReasonError:
		return 2
	case pool.ReasonPoolClosed:
		return 3
	}
	return 4
}

// failure returns the checkout-failure counter of reason.
func (s *serverSeries) failure(m *Metrics, r pool.Reason) prometheus.Counter {
	i := failIndex(r)
	if c := s.failures[i].Load(); c != nil {
		return *c
	}
	c := m.checkoutFailures.WithLabelValues(s.lroute, s.lserver, reasonLabel(r, i == len(s.failures)-1))
	s.failures[i].Store(&c)
	return c
}

// closedBy returns the connections-closed counter of reason.
func (s *serverSeries) closedBy(m *Metrics, r pool.Reason) prometheus.Counter {
	i := closeIndex(r)
	if c := s.closed[i].Load(); c != nil {
		return *c
	}
	c := m.connsClosed.WithLabelValues(s.lroute, s.lserver, reasonLabel(r, i == len(s.closed)-1))
	s.closed[i].Store(&c)
	return c
}

func reasonLabel(r pool.Reason, other bool) string {
	if other {
		return OtherLabel
	}
	return string(r)
}

// acquireSeries returns the series of key, creating their children on first
// use. The caller holds m.mu.
func (m *Metrics) acquireSeriesLocked(key serverKey) *serverSeries {
	s := m.servers[key]
	if s == nil {
		lr, ls := labelValue(key.route), labelValue(key.server)
		s = &serverSeries{
			key:     key,
			lroute:  lr,
			lserver: ls,
			created: m.connsCreated.WithLabelValues(lr, ls),
			cleared: m.poolCleared.WithLabelValues(lr, ls),
		}
		// The known reasons are exported from the start, at 0, so that
		// rate() and alerts see them before the first failure.
		for i, r := range failReasons {
			c := m.checkoutFailures.WithLabelValues(lr, ls, string(r))
			s.failures[i].Store(&c)
		}
		for i, r := range closeReasons {
			c := m.connsClosed.WithLabelValues(lr, ls, string(r))
			s.closed[i].Store(&c)
		}
		m.servers[key] = s
	}
	s.refs++
	return s
}

// releaseSeriesLocked drops one reference to s; the last one deletes its
// series from the registry, so that removed routes and servers stop being
// exported. The caller holds m.mu.
func (m *Metrics) releaseSeriesLocked(s *serverSeries) {
	if s.refs--; s.refs > 0 {
		return
	}
	delete(m.servers, s.key)
	l := prometheus.Labels{"route": s.lroute, "server": s.lserver}
	m.checkoutFailures.DeletePartialMatch(l)
	m.connsCreated.DeletePartialMatch(l)
	m.connsClosed.DeletePartialMatch(l)
	m.poolCleared.DeletePartialMatch(l)
}

// poolState is what one pool's events tell about it: its counts (the pool
// gauges, read at scrape time) and its connections (SHOW SERVERS).
type poolState struct {
	key    serverKey
	series *serverSeries

	// Counts as of the pool's last event (see setCounts), written only by
	// the pool's events (which never run concurrently for one pool) and
	// read by scrapes.
	available, inUse, pending, waiters atomic.Int64
	// maxPoolSize is from PoolCreated's Options or SetPoolLimit; 0 means
	// unlimited.
	maxPoolSize atomic.Int64
	// closed is set by PoolClosed.
	closed atomic.Bool
	// detached is set once the state left Metrics.pools (closed and
	// drained, or replaced); it makes leaving happen once.
	detached atomic.Bool

	// mu serialises changes to conns (ConnectionCreated, ConnectionClosed,
	// PoolClosed); it is never taken on the checkout path.
	mu sync.Mutex
	// conns are the pool's connections by ID, for SHOW SERVERS: a map
	// that is copied on every change and never modified once published,
	// so that a checkout or check-in finds its entry without a lock (the
	// map changes when a connection is created or closed, not when it is
	// used).
	conns atomic.Pointer[map[int64]*connEntry]
}

// connEntry is one upstream connection in the registry. id and createdAt
// are set before the entry is published; the rest is atomic because
// checkouts update it without a lock. lastUsed is its last check-in (its
// creation before the first); Connections reports an in-use connection as
// used now. Times are monotonic offsets from
// Metrics.start (see Metrics.now).
type connEntry struct {
	id         int64
	createdAt  time.Duration
	state      atomic.Uint32 // a connState
	generation atomic.Uint64
	lastUsed   atomic.Int64 // a time.Duration
}

// connState indexes connStates.
type connState uint32

const (
	statePending connState = iota
	stateAvailable
	stateInUse
)

var connStates = [...]string{statePending: ConnPending, stateAvailable: ConnAvailable, stateInUse: ConnInUse}

// entry returns connection id's entry, or nil.
func (st *poolState) entry(id int64) *connEntry {
	if m := st.conns.Load(); m != nil {
		return (*m)[id]
	}
	return nil
}

// updateConnsLocked publishes a copy of the registry changed by f. The
// caller holds st.mu.
func (st *poolState) updateConnsLocked(f func(map[int64]*connEntry)) {
	var next map[int64]*connEntry
	if cur := st.conns.Load(); cur != nil {
		next = maps.Clone(*cur)
	}
	if next == nil {
		next = make(map[int64]*connEntry)
	}
	f(next)
	st.conns.Store(&next)
}

// setCounts records the pool's counts from e. Counts are a snapshot taken
// under the pool's lock, so the last event's counts are the pool's, with
// three exceptions the pool documents or implies, corrected here:
// ConnectionCheckedIn and ConnectionReady carry the counts from before the
// connection moves on (when it becomes available no other event follows;
// when it is closed or handed to a waiter, ConnectionClosed or
// ConnectionCheckedOut follows and sets the counts again), and
// ConnectionCheckOutStarted carries them from before the checkout joins the
// wait queue (when it does not wait, the CheckedOut or CheckOutFailed that
// follows at once sets the counts again). What stays inexact until the
// pool's next event is described in docs/metrics.md.
func (st *poolState) setCounts(t pool.EventType, c pool.Counts) {
	switch t {
	case pool.ConnectionCheckedIn:
		c.InUse--
		c.Available++
	case pool.ConnectionReady:
		c.Pending--
		c.Available++
	case pool.ConnectionCheckOutStarted:
		c.Waiters++
	}
	// A checkout cycle changes two or three of the four; an atomic store
	// costs several times the load that spares it.
	storeChanged(&st.available, c.Available)
	storeChanged(&st.inUse, c.InUse)
	storeChanged(&st.pending, c.Pending)
	storeChanged(&st.waiters, c.Waiters)
}

func storeChanged(a *atomic.Int64, v int) {
	if a.Load() != int64(v) {
		a.Store(int64(v))
	}
}

// poolMonitor is the pool.Monitor of the pools of one route.
//
// It runs under its pool's lock (pool.Monitor), and takes metrics' own
// locks there; the lock order, outermost first, is:
//
//  1. A pool's lock (held by the pool while it calls HandleEvent).
//  2. poolMonitor.mu, in attach: a pool's first event, once per pool.
//  3. Metrics.mu, in attach and in detach (the last event of a closed,
//     drained pool); alone, in the scrape collectors, SetPoolLimit and
//     the Observer's first sight of a route or an error code.
//  4. poolState.mu, alone under the pool's lock: a connection created or
//     closed, a pool closed (the registry's copy-on-write).
//
// Prometheus' own vector locks are taken, innermost, when a counter's
// child is first resolved (failure, closedBy). Nothing in this package
// calls into a pool, so no pool lock is ever taken under these. Checkouts
// and check-ins, the steady state, take none of them: atomics only.
type poolMonitor struct {
	m     *Metrics
	route string
	// states holds the state of each server's pool, by address:
	// copy-on-write, read without a lock by events, written under mu.
	states atomic.Pointer[map[string]*poolState]
	// last is the state of the most recent event, which is where the
	// next one almost always goes (a route has one server, or few):
	// comparing its address spares a map lookup on every event.
	last atomic.Pointer[poolState]
	mu   sync.Mutex
}

// PoolMonitor returns the pool.Monitor for the pools of route (one pool per
// server): give it in pool.Options.Monitor. The server label is the event's
// Address.
//
// A Monitor tells pools apart by address only: a pool created for an
// address replaces the Monitor's previous pool of that address. A pool
// that replaces another of the same server while that one still drains (a
// reload that changes a route's connection string) needs a Monitor of its
// own: call PoolMonitor again for the new pools. The gauges of pools of the
// same route and server are then summed.
//
// Like every Monitor it runs under its pool's lock and never calls back
// into the pool; a checkout or check-in is atomic updates only, and the
// rarer events take metrics' own locks (the order is on poolMonitor).
func (m *Metrics) PoolMonitor(route string) pool.Monitor {
	pm := &poolMonitor{m: m, route: route}
	empty := map[string]*poolState{}
	pm.states.Store(&empty)
	return pm
}

// HandleEvent implements pool.Monitor.
func (pm *poolMonitor) HandleEvent(e pool.Event) {
	st := pm.last.Load()
	if st == nil || st.key.server != e.Address {
		st = (*pm.states.Load())[e.Address]
	}
	if st == nil || e.Type == pool.PoolCreated {
		st = pm.attach(e)
	}
	if pm.last.Load() != st {
		pm.last.Store(st)
	}
	s := st.series
	switch e.Type {
	case pool.PoolCleared:
		s.cleared.Inc()
	case pool.PoolClosed:
		st.closed.Store(true)
		st.mu.Lock()
		st.conns.Store(nil)
		st.mu.Unlock()
	case pool.ConnectionCreated:
		s.created.Inc()
		now := pm.m.now()
		c := &connEntry{id: e.ConnectionID, createdAt: now}
		c.generation.Store(e.Generation)
		c.lastUsed.Store(int64(now))
		st.mu.Lock()
		st.updateConnsLocked(func(m map[int64]*connEntry) { m[e.ConnectionID] = c })
		st.mu.Unlock()
	case pool.ConnectionReady:
		if c := st.entry(e.ConnectionID); c != nil {
			// In load-balancer mode the generation is known only now.
			c.generation.Store(e.Generation)
			c.state.Store(uint32(stateAvailable))
		}
	case pool.ConnectionClosed:
		s.closedBy(pm.m, e.Reason).Inc()
		st.mu.Lock()
		if st.entry(e.ConnectionID) != nil {
			st.updateConnsLocked(func(m map[int64]*connEntry) { delete(m, e.ConnectionID) })
		}
		st.mu.Unlock()
	case pool.ConnectionCheckOutFailed:
		s.failure(pm.m, e.Reason).Inc()
	case pool.ConnectionCheckedOut:
		s.observe(e.Duration)
		pm.m.waitHist.record(e.Duration)
		// No clock read: while in use, a connection's last use is now
		// (Connections), and the check-in records when it ended.
		if c := st.entry(e.ConnectionID); c != nil {
			c.state.Store(uint32(stateInUse))
		}
	case pool.ConnectionCheckedIn:
		if c := st.entry(e.ConnectionID); c != nil {
			c.state.Store(uint32(stateAvailable))
			c.lastUsed.Store(int64(pm.m.now()))
		}
	}
	st.setCounts(e.Type, e.Counts)
	if e.Counts.Total == 0 && st.closed.Load() && !st.detached.Load() {
		pm.m.detach(st)
	}
}

// attach starts tracking the pool of e.Address: on PoolCreated, or on the
// first event of a pool whose PoolCreated this Monitor did not see.
func (pm *poolMonitor) attach(e pool.Event) *poolState {
	pm.mu.Lock()
	defer pm.mu.Unlock()
	cur := *pm.states.Load()
	old := cur[e.Address]
	if old != nil && e.Type != pool.PoolCreated {
		return old // another event attached it meanwhile
	}
	st := &poolState{key: serverKey{pm.route, e.Address}}
	if e.Options != nil {
		st.maxPoolSize.Store(int64(e.Options.MaxPoolSize))
	}
	m := pm.m
	m.mu.Lock()
	st.series = m.acquireSeriesLocked(st.key)
	m.pools[st] = struct{}{}
	if old != nil && old.detached.CompareAndSwap(false, true) {
		delete(m.pools, old)
		m.releaseSeriesLocked(old.series)
	}
	m.mu.Unlock()
	next := maps.Clone(cur)
	next[e.Address] = st
	pm.states.Store(&next)
	return st
}

// detach stops exporting a pool that is closed and has no connection left.
// The Monitor keeps its state so that later events (checkouts failing on
// the closed pool) still find it; they count on series no longer exported.
func (m *Metrics) detach(st *poolState) {
	if !st.detached.CompareAndSwap(false, true) {
		return
	}
	m.mu.Lock()
	delete(m.pools, st)
	m.releaseSeriesLocked(st.series)
	m.mu.Unlock()
}

// SetPoolLimit records a pool's new maxPoolSize (0 = unlimited) after a
// live change (pool.SetLimits on reload), for the utilization ratio; the
// pool emits no event for it. server is the pool's address as in its
// events.
func (m *Metrics) SetPoolLimit(route, server string, maxPoolSize int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for st := range m.pools {
		if st.key == (serverKey{route, server}) && !st.closed.Load() {
			st.maxPoolSize.Store(int64(maxPoolSize))
		}
	}
}

// livePools returns the live pool states.
func (m *Metrics) livePools() []*poolState {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Collect(maps.Keys(m.pools))
}

// ServerConn is one upstream connection: the data of SHOW SERVERS. The
// admin package has its own type for it; internal/app maps one to the other.
type ServerConn struct {
	Route      string
	Server     string
	ID         int64
	State      string // ConnPending, ConnAvailable or ConnInUse
	Generation uint64
	CreatedAt  time.Time
	LastUsed   time.Time
}

// Connections returns the upstream connections of every live pool, for
// SHOW SERVERS, ordered by route, server and ID. A connection is listed from
// ConnectionCreated until ConnectionClosed or its pool's PoolClosed. LastUsed
// is its last check-in (its creation before the first), and now while it is
// in use.
func (m *Metrics) Connections() []ServerConn {
	var out []ServerConn
	now := m.now()
	for _, st := range m.livePools() {
		conns := st.conns.Load()
		if conns == nil {
			continue
		}
		for _, c := range *conns {
			state := connState(c.state.Load())
			used := time.Duration(c.lastUsed.Load())
			if state == stateInUse {
				used = now
			}
			out = append(out, ServerConn{
				Route:      st.key.route,
				Server:     st.key.server,
				ID:         c.id,
				State:      connStates[state],
				Generation: c.generation.Load(),
				CreatedAt:  m.start.Add(c.createdAt),
				LastUsed:   m.start.Add(used),
			})
		}
	}
	slices.SortFunc(out, func(a, b ServerConn) int {
		return cmp.Or(cmp.Compare(a.Route, b.Route), cmp.Compare(a.Server, b.Server), cmp.Compare(a.ID, b.ID))
	})
	return out
}

// poolCollector exports the pool gauges from the live pool states at scrape
// time. Pools of the same route and server are summed.
type poolCollector struct{ m *Metrics }

var (
	descPoolConns = prometheus.NewDesc(Namespace+"_pool_connections",
		"Upstream connections by state: available (idle in the pool), in_use (checked out), pending (being established).",
		[]string{"route", "server", "state"}, nil)
	descPoolWaiters = prometheus.NewDesc(Namespace+"_pool_wait_queue_length",
		"Checkouts waiting in the pool's wait queue.", []string{"route", "server"}, nil)
	descPoolMax = prometheus.NewDesc(Namespace+"_pool_max_size",
		"The pool's maxPoolSize; 0 means unlimited.", []string{"route", "server"}, nil)
	descPoolUtil = prometheus.NewDesc(Namespace+"_pool_utilization_ratio",
		"Connections in use divided by maxPoolSize; not exported for unlimited pools.", []string{"route", "server"}, nil)
)

// Describe implements prometheus.Collector.
func (c poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descPoolConns
	ch <- descPoolWaiters
	ch <- descPoolMax
	ch <- descPoolUtil
}

// Collect implements prometheus.Collector.
func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	type agg struct {
		available, inUse, pending, waiters int64
		max                                int64
		live, unlimited                    bool
	}
	sums := map[serverKey]*agg{}
	for _, st := range c.m.livePools() {
		a := sums[st.key]
		if a == nil {
			a = &agg{}
			sums[st.key] = a
		}
		a.available += st.available.Load()
		a.inUse += st.inUse.Load()
		a.pending += st.pending.Load()
		a.waiters += st.waiters.Load()
		// A draining pool's limit no longer bounds anything.
		if !st.closed.Load() {
			a.live = true
			mx := st.maxPoolSize.Load()
			a.max += mx
			a.unlimited = a.unlimited || mx <= 0
		}
	}
	for key, a := range sums {
		k := serverKey{labelValue(key.route), labelValue(key.server)}
		ch <- prometheus.MustNewConstMetric(descPoolConns, prometheus.GaugeValue, float64(a.available), k.route, k.server, "available")
		ch <- prometheus.MustNewConstMetric(descPoolConns, prometheus.GaugeValue, float64(a.inUse), k.route, k.server, "in_use")
		ch <- prometheus.MustNewConstMetric(descPoolConns, prometheus.GaugeValue, float64(a.pending), k.route, k.server, "pending")
		ch <- prometheus.MustNewConstMetric(descPoolWaiters, prometheus.GaugeValue, float64(a.waiters), k.route, k.server)
		if !a.live {
			continue
		}
		if a.unlimited {
			ch <- prometheus.MustNewConstMetric(descPoolMax, prometheus.GaugeValue, 0, k.route, k.server)
			continue
		}
		ch <- prometheus.MustNewConstMetric(descPoolMax, prometheus.GaugeValue, float64(a.max), k.route, k.server)
		ch <- prometheus.MustNewConstMetric(descPoolUtil, prometheus.GaugeValue, float64(a.inUse)/float64(a.max), k.route, k.server)
	}
}

// checkoutCollector exports the checkout-duration histogram of every
// (route, server) series from serverSeries' counters.
type checkoutCollector struct{ m *Metrics }

var descCheckout = prometheus.NewDesc(Namespace+"_pool_checkout_duration_seconds",
	"Time from the start of a successful connection checkout to ConnectionCheckedOut; 0 for a checkout served at once.",
	[]string{"route", "server"}, nil)

// Describe implements prometheus.Collector.
func (c checkoutCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descCheckout }

// Collect implements prometheus.Collector.
func (c checkoutCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	series := slices.Collect(maps.Values(c.m.servers))
	c.m.mu.Unlock()
	for _, s := range series {
		// waited before checkouts: see serverSeries.observe.
		var waited [len(checkoutBuckets) + 1]uint64
		var n uint64
		for i := range waited {
			waited[i] = s.waited[i].Load()
			n += waited[i]
		}
		count := s.checkouts.Load()
		buckets := make(map[float64]uint64, len(checkoutBuckets))
		cum := count - n // the checkouts that did not wait, in the first bucket
		for i, le := range checkoutBuckets {
			cum += waited[i]
			buckets[le] = cum
		}
		ch <- prometheus.MustNewConstHistogram(descCheckout, count, time.Duration(s.waitNs.Load()).Seconds(), buckets, s.lroute, s.lserver)
	}
}

// CheckoutTotals returns the number of successful checkouts from the pools
// of (route, server) and their total wait, since those series were created.
// Two readings give the mean wait over the time between them.
func (m *Metrics) CheckoutTotals(route, server string) (checkouts uint64, wait time.Duration) {
	m.mu.Lock()
	s := m.servers[serverKey{route: route, server: server}]
	m.mu.Unlock()
	if s == nil {
		return 0, 0
	}
	return s.checkouts.Load(), time.Duration(s.waitNs.Load())
}
