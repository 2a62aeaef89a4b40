// Package metrics is mongobouncer's instrumentation: Prometheus metrics on
// a registry of its own, the totals and latency percentiles of SHOW STATS,
// and the upstream connection registry of SHOW SERVERS.
//
// Pool metrics come only from the pools' CMAP events (PoolMonitor); client
// and request metrics come from the proxy through the proxy.Observer methods
// of *Metrics. Both run on hot paths (a Monitor even under the pool's lock),
// so their steady state is a few atomic operations on label children
// resolved once and cached, without allocation and without a lock. The
// rarer events (a pool's first and last, a connection created or closed, a
// route or error code seen first) take this package's locks, in the order
// written on poolMonitor. docs/metrics.md lists every metric.
package metrics

import (
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Namespace prefixes every metric name.
const Namespace = "mongobouncer"

// Bounds on label cardinality for values that come from outside the
// configuration. Values beyond them are counted under the label "other".
const (
	// MaxRoutes bounds the distinct route labels of the request metrics.
	MaxRoutes = 1024
	// MaxCommandsPerRoute bounds the distinct command labels per route (the
	// proxy already reduces command names to a known set).
	MaxCommandsPerRoute = 256
	// MaxErrorCodes bounds the distinct error codes labelled process-wide:
	// the first MaxErrorCodes codes seen get a label of their own.
	MaxErrorCodes = 64
)

// OtherLabel is the label value for everything beyond a cardinality bound.
const OtherLabel = "other"

var (
	// checkoutBuckets cover a pool checkout from a hot fast path (tens of
	// microseconds through the proxy) to a wait that hits a long
	// waitQueueTimeout.
	checkoutBuckets = [...]float64{
		10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6,
		1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3,
		1, 2.5, 5, 10, 30,
	}
	// requestBuckets cover a request from a cached point read to a long
	// aggregation.
	requestBuckets = []float64{
		50e-6, 100e-6, 250e-6, 500e-6,
		1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3,
		1, 2.5, 5, 10, 30, 60,
	}
)

// Metrics holds every metric of one mongobouncer process. Create it with
// New; all methods are safe for concurrent use.
type Metrics struct {
	reg   *prometheus.Registry
	start time.Time
	log   *slog.Logger

	// Pool series (labels route, server, and reason where named).
	checkoutFailures *prometheus.CounterVec
	connsCreated     *prometheus.CounterVec
	connsClosed      *prometheus.CounterVec
	poolCleared      *prometheus.CounterVec

	// Proxy series.
	operations      *prometheus.CounterVec   // route, command
	requestDuration *prometheus.HistogramVec // route
	bytesIn         *prometheus.CounterVec   // route
	bytesOut        *prometheus.CounterVec   // route
	requestErrors   *prometheus.CounterVec   // route
	upstreamErrors  *prometheus.CounterVec   // route, code
	tlsRefused      *prometheus.CounterVec   // reason
	userRefused     prometheus.Counter       // max_user_client_conn refusals
	auth            authSeries               // failures by reason, lookups by result
	loginTimeouts   *prometheus.CounterVec   // reason
	panics          *prometheus.CounterVec   // path

	// Totals for SHOW STATS; the client ones also back the client metrics.
	clientsCurrent atomic.Int64
	clientsTotal   atomic.Uint64
	opsTotal       atomic.Uint64
	errorsTotal    atomic.Uint64
	bytesInTotal   atomic.Uint64
	bytesOutTotal  atomic.Uint64
	waitHist       latencyHist // successful checkouts (ConnectionCheckedOut.Duration)
	queryHist      latencyHist // requests (Observer.Request's d)

	// serverSrc lists the routes' servers for serverCollector; nil until
	// SetServerSource.
	serverSrc atomic.Pointer[ServerSource]
	// loopSrc gives the event loop's spin counts to loopCollector; nil
	// until SetLoopSpinSource.
	loopSrc atomic.Pointer[LoopSpinSource]
	// loopAdapt gives the event loop's choice of driver to loopCollector;
	// nil before the app sets it.
	loopAdapt atomic.Pointer[LoopAdaptiveSource]

	// routes is the copy-on-write cache of per-route request series: readers
	// load it without a lock; writers copy it under mu.
	routes atomic.Pointer[map[string]*routeSeries]

	mu sync.Mutex // its place in the lock order is on poolMonitor
	// servers are the shared pool series per (route, server), counted by
	// the live pool states that use them. Guarded by mu.
	servers map[serverKey]*serverSeries
	// pools are the live pool states: from PoolCreated (or first sight)
	// until closed and drained, or replaced. Guarded by mu.
	pools map[*poolState]struct{}
	// codes are the error codes that have a label of their own (at most
	// MaxErrorCodes), with that label. Guarded by mu.
	codes map[int32]string
}

// New returns a Metrics with its own registry, holding the Go runtime and
// process collectors besides mongobouncer's metrics.
func New() *Metrics {
	m := &Metrics{
		reg:     prometheus.NewRegistry(),
		start:   time.Now(),
		log:     slog.Default(),
		servers: make(map[serverKey]*serverSeries),
		pools:   make(map[*poolState]struct{}),
		codes:   make(map[int32]string),
	}
	empty := map[string]*routeSeries{}
	m.routes.Store(&empty)
	rs := []string{"route", "server"}
	m.checkoutFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "pool", Name: "checkout_failures_total",
		Help: "Failed connection checkouts (ConnectionCheckOutFailed) by reason: timeout, connectionError, poolClosed.",
	}, []string{"route", "server", "reason"})
	m.connsCreated = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "pool", Name: "connections_created_total",
		Help: "Upstream connections created (ConnectionCreated).",
	}, rs)
	m.connsClosed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "pool", Name: "connections_closed_total",
		Help: "Upstream connections closed (ConnectionClosed) by reason: stale, idle, error, poolClosed.",
	}, []string{"route", "server", "reason"})
	m.poolCleared = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "pool", Name: "cleared_total",
		Help: "Pool clears (ConnectionPoolCleared): every existing connection became stale.",
	}, rs)

	m.operations = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "operations_total",
		Help: "Requests forwarded upstream, by route and command name.",
	}, []string{"route", "command"})
	m.requestDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: Namespace, Name: "request_duration_seconds",
		Help:    "Time from a request's arrival to the end of its reply (the last of an exhaust stream), including the checkout.",
		Buckets: requestBuckets,
	}, []string{"route"})
	m.bytesIn = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "client", Name: "received_bytes_total",
		Help: "Bytes of forwarded requests received from clients, by route.",
	}, []string{"route"})
	m.bytesOut = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "client", Name: "sent_bytes_total",
		Help: "Bytes of replies to forwarded requests sent to clients, by route.",
	}, []string{"route"})
	m.requestErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "request_errors_total",
		Help: "Forwarded requests whose client got an error reply (from the upstream or from mongobouncer), by route.",
	}, []string{"route"})
	m.upstreamErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "upstream", Name: "errors_total",
		Help: "Error codes replied by upstreams or answered by mongobouncer when an upstream failed, by route and code (\"other\" beyond the first 64 codes).",
	}, []string{"route", "code"})

	m.auth = newAuthSeries()
	m.userRefused = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "client", Name: "user_limit_refused_total",
		Help: "Client logins refused because the user had max_user_client_conn clients logged in already.",
	})
	m.tlsRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "client", Name: "tls_refused_total",
		Help: "Client connections refused at their TLS step, by reason: plain (a plain client while tls_mode = \"require\"), handshake (a failed or timed-out TLS handshake).",
	}, []string{"reason"})
	m.loginTimeouts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "client", Name: "login_timeouts_total",
		Help: "Client connections closed by client_login_timeout, by reason: first_message, tls_handshake, not_logged_in, sasl_conversation, partial_message.",
	}, []string{"reason"})

	m.panics = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "panics_total",
		Help: "Panics recovered while serving a client, by path: goroutine (the client's goroutine), loop (the event loop's code for the client). Each ended its client only; the log has its stack.",
	}, []string{"path"})
	// Both series exist from the start, at 0, for alerts on their increase.
	m.panics.WithLabelValues("goroutine")
	m.panics.WithLabelValues("loop")

	clientsCurrent := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: Namespace, Subsystem: "client", Name: "connections",
		Help: "Client connections open now.",
	}, func() float64 { return float64(m.clientsCurrent.Load()) })
	clientsTotal := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Namespace: Namespace, Subsystem: "client", Name: "connections_accepted_total",
		Help: "Client connections accepted since start.",
	}, func() float64 { return float64(m.clientsTotal.Load()) })

	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		checkoutCollector{m}, m.checkoutFailures, m.connsCreated, m.connsClosed, m.poolCleared,
		m.operations, m.requestDuration, m.bytesIn, m.bytesOut, m.requestErrors, m.upstreamErrors,
		m.tlsRefused, m.userRefused, m.loginTimeouts, m.panics, clientsCurrent, clientsTotal, m.auth.failures, m.auth.lookups,
		poolCollector{m}, serverCollector{&m.serverSrc}, loopCollector{&m.loopSrc, &m.loopAdapt},
	)
	return m
}

// now returns the time since New on the monotonic clock: one clock read,
// where time.Now makes two (wall and monotonic), which matters under the
// pool's lock on a checkout. Wall times are derived from it as start+now.
func (m *Metrics) now() time.Duration { return time.Since(m.start) }

// Registerer returns the registry, so that other parts of the process can
// add collectors that Handler then serves.
func (m *Metrics) Registerer() prometheus.Registerer { return m.reg }

// Gatherer returns the registry for reading the metrics in process.
func (m *Metrics) Gatherer() prometheus.Gatherer { return m.reg }

// Handler serves the registry in the Prometheus exposition formats. A
// collector that fails does not fail the scrape: the rest is served and the
// error logged.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		ErrorLog:      promLogger{m.log},
		ErrorHandling: promhttp.ContinueOnError,
		// Scrapes are cheap, but a flood of them must not pile up.
		MaxRequestsInFlight: 4,
		Timeout:             10 * time.Second,
	})
}

// promLogger adapts slog to promhttp's logger.
type promLogger struct{ l *slog.Logger }

func (p promLogger) Println(v ...any) {
	p.l.Warn("metrics scrape failed", "error", fmt.Sprint(v...))
}

// Totals are the process totals since New: the data of SHOW STATS. The
// admin package has its own type for them; internal/app maps one to the
// other, so that metrics imports neither admin nor proxy.
type Totals struct {
	Uptime         time.Duration
	ClientsCurrent int
	ClientsTotal   uint64
	Operations     uint64
	Errors         uint64 // requests whose client got an error reply
	BytesIn        uint64
	BytesOut       uint64
	WaitAvg        time.Duration // checkout wait of successful checkouts
	WaitP99        time.Duration
	QueryAvg       time.Duration // Observer.Request durations
	QueryP99       time.Duration
}

// Stats returns the totals since New for SHOW STATS: clients, operations,
// error replies, bytes, and the mean and p99 of the checkout wait (successful
// checkouts) and of the query time (Observer.Request durations). The means and
// p99s come from log-linear histograms and are within 1.6% of the exact
// values.
func (m *Metrics) Stats() Totals {
	w := m.waitHist.summary()
	q := m.queryHist.summary()
	return Totals{
		Uptime:         time.Since(m.start),
		ClientsCurrent: int(m.clientsCurrent.Load()),
		ClientsTotal:   m.clientsTotal.Load(),
		Operations:     m.opsTotal.Load(),
		Errors:         m.errorsTotal.Load(),
		BytesIn:        m.bytesInTotal.Load(),
		BytesOut:       m.bytesOutTotal.Load(),
		WaitAvg:        w.avg,
		WaitP99:        w.p99,
		QueryAvg:       q.avg,
		QueryP99:       q.p99,
	}
}
