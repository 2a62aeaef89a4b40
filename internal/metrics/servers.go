package metrics

// The upstream servers' series: what each route's servers are now, asked of
// the app at every scrape rather than kept here.

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mongobouncer/mongobouncer/internal/pool"
)

// ServerRole is one upstream server of a route as the topology sees it now:
// the data of mongobouncer_server_info and mongobouncer_server_rtt_seconds.
// internal/app makes them from the topologies, so that metrics imports no
// package above pool.
type ServerRole struct {
	Route  string
	Server string
	// Role is the server's role in lower case ("primary", "secondary",
	// "unknown", ...), the same words showPools uses.
	Role string
	// RTT is the moving average of the monitor's round trips; 0 before the
	// first, when no RTT series is exported.
	RTT time.Duration
	// Limit is the adaptive limit of the route's pool for this server
	// (max_pool_size = "auto"), nil for a fixed-size pool.
	Limit *AdaptiveLimit
	// DB is the server's max_db_connections budget (pool.Share) over the
	// route's pools: mongobouncer_db_connections and its kin.
	DB pool.ShareStats
}

// AdaptiveLimit is the state of one pool's adaptive limit: the data of
// mongobouncer_pool_limit and its companions.
type AdaptiveLimit struct {
	// Limit is how many connections may be checked out at once now.
	Limit int
	// MinRTT is the no-load time a connection is held: the mean of the
	// limiter's last probe at min_pool_size.
	MinRTT time.Duration
	// Gradient is the last update's factor (1 steady, below 1 backing off).
	Gradient float64
	// Drops counts operations that timed out, failed on the network or
	// were refused as overloaded.
	Drops uint64
	// Probes counts the minimum-RTT probes the limiter has ended.
	Probes uint64
}

// ServerSource lists the current upstream servers of every route. It is
// called at every scrape, from the scraping goroutine, without any lock of
// Metrics held, so it may take its caller's own locks.
type ServerSource func() []ServerRole

var (
	descServerInfo = prometheus.NewDesc(Namespace+"_server_info",
		"1 for each upstream server (replica-set member, mongos, ...) a route has now, labelled with its current role; a server whose role changes gets a new series and the old one is gone.",
		[]string{"route", "server", "role"}, nil)
	descServerRTT = prometheus.NewDesc(Namespace+"_server_rtt_seconds",
		"Moving average of the round-trip time of the monitor's hello to each upstream server; absent before the first.",
		[]string{"route", "server"}, nil)
	descPoolLimit = prometheus.NewDesc(Namespace+"_pool_limit",
		`Adaptive limit (max_pool_size = "auto") on the connections of a route's pool for one upstream server that may be checked out at once; absent for a fixed-size pool.`,
		[]string{"route", "server"}, nil)
	descPoolLimitMinRTT = prometheus.NewDesc(Namespace+"_pool_limit_min_rtt_seconds",
		"No-load time an operation holds a connection, as the adaptive limit's last probe (the limit held at min_pool_size) measured it; absent before the first.",
		[]string{"route", "server"}, nil)
	descPoolLimitGradient = prometheus.NewDesc(Namespace+"_pool_limit_gradient",
		"Factor of the adaptive limit's last update: 1.25 x the no-load time over the last window's, within 0.5 to 2; 0.9 after drops.",
		[]string{"route", "server"}, nil)
	descPoolLimitProbes = prometheus.NewDesc(Namespace+"_pool_limit_probes_total",
		"Probes of the adaptive limit: the limit held at min_pool_size for a few operations to measure the no-load time (one as the pool starts, then about every 30 s).",
		[]string{"route", "server"}, nil)
	descPoolLimitDrops = prometheus.NewDesc(Namespace+"_pool_limit_drops_total",
		"Operations the adaptive limit counted as drops: timeouts, network errors and overload refusals (462, SystemOverloadedError).",
		[]string{"route", "server"}, nil)
	descDBMax = prometheus.NewDesc(Namespace+"_db_connections_max",
		"max_db_connections of the route, per upstream server: the cap on the connections of the route's pool and all its user pools together; 0 means no cap.",
		[]string{"route", "server"}, nil)
	descDBConns = prometheus.NewDesc(Namespace+"_db_connections",
		"Connections counted against max_db_connections on each upstream server, over the route's pool and all its user pools (pending, idle and in use).",
		[]string{"route", "server"}, nil)
	descDBWaiting = prometheus.NewDesc(Namespace+"_db_connections_waiting_pools",
		"Pools (the route's or a user's) whose next checkout waits for a max_db_connections slot now.",
		[]string{"route", "server"}, nil)
	descDBWaits = prometheus.NewDesc(Namespace+"_db_connections_waits_total",
		"Times a pool had to wait for a max_db_connections slot.",
		[]string{"route", "server"}, nil)
	descDBEvictions = prometheus.NewDesc(Namespace+"_db_connections_evictions_total",
		"Idle connections of one pool closed so that another pool waiting at max_db_connections gets a slot.",
		[]string{"route", "server"}, nil)
)

// serverCollector exports the servers of the registered ServerSource at
// scrape time: a server that left its route, or a role that changed, has
// no series to delete, and nothing stale survives a scrape.
type serverCollector struct {
	src *atomic.Pointer[ServerSource]
}

// SetServerSource makes /metrics export src's servers
// (mongobouncer_server_info, mongobouncer_server_rtt_seconds) at every
// scrape. nil exports none; a later call replaces the previous source.
func (m *Metrics) SetServerSource(src ServerSource) {
	if src == nil {
		m.serverSrc.Store(nil)
		return
	}
	m.serverSrc.Store(&src)
}

// Describe implements prometheus.Collector.
func (c serverCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descServerInfo
	ch <- descServerRTT
	ch <- descPoolLimit
	ch <- descPoolLimitMinRTT
	ch <- descPoolLimitGradient
	ch <- descPoolLimitDrops
	ch <- descPoolLimitProbes
	ch <- descDBMax
	ch <- descDBConns
	ch <- descDBWaiting
	ch <- descDBWaits
	ch <- descDBEvictions
}

// Collect implements prometheus.Collector.
func (c serverCollector) Collect(ch chan<- prometheus.Metric) {
	p := c.src.Load()
	if p == nil {
		return
	}
	// A source listing one (route, server) twice would fail the whole
	// scrape with a duplicate series: the first entry wins.
	seen := map[serverKey]bool{}
	for _, s := range (*p)() {
		k := serverKey{labelValue(s.Route), labelValue(s.Server)}
		if seen[k] {
			continue
		}
		seen[k] = true
		ch <- prometheus.MustNewConstMetric(descServerInfo, prometheus.GaugeValue, 1, k.route, k.server, labelValue(s.Role))
		if s.RTT > 0 {
			ch <- prometheus.MustNewConstMetric(descServerRTT, prometheus.GaugeValue, s.RTT.Seconds(), k.route, k.server)
		}
		if l := s.Limit; l != nil {
			ch <- prometheus.MustNewConstMetric(descPoolLimit, prometheus.GaugeValue, float64(l.Limit), k.route, k.server)
			if l.MinRTT > 0 {
				ch <- prometheus.MustNewConstMetric(descPoolLimitMinRTT, prometheus.GaugeValue, l.MinRTT.Seconds(), k.route, k.server)
			}
			ch <- prometheus.MustNewConstMetric(descPoolLimitGradient, prometheus.GaugeValue, l.Gradient, k.route, k.server)
			ch <- prometheus.MustNewConstMetric(descPoolLimitDrops, prometheus.CounterValue, float64(l.Drops), k.route, k.server)
			ch <- prometheus.MustNewConstMetric(descPoolLimitProbes, prometheus.CounterValue, float64(l.Probes), k.route, k.server)
		}
		ch <- prometheus.MustNewConstMetric(descDBMax, prometheus.GaugeValue, float64(s.DB.Max), k.route, k.server)
		ch <- prometheus.MustNewConstMetric(descDBConns, prometheus.GaugeValue, float64(s.DB.Used), k.route, k.server)
		ch <- prometheus.MustNewConstMetric(descDBWaiting, prometheus.GaugeValue, float64(s.DB.Waiting), k.route, k.server)
		ch <- prometheus.MustNewConstMetric(descDBWaits, prometheus.CounterValue, float64(s.DB.Waits), k.route, k.server)
		ch <- prometheus.MustNewConstMetric(descDBEvictions, prometheus.CounterValue, float64(s.DB.Evictions), k.route, k.server)
	}
}
