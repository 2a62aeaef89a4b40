package metrics

import (
	"maps"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// routeSeries are the request series of one route, resolved once so that a
// request costs atomic adds on them and two map reads.
type routeSeries struct {
	m        *Metrics
	name     string
	duration prometheus.Observer
	bytesIn  prometheus.Counter
	bytesOut prometheus.Counter
	errors   prometheus.Counter
	// commands and codes are copy-on-write caches of label children: read
	// without a lock, written under m.mu.
	commands atomic.Pointer[map[string]prometheus.Counter]
	codes    atomic.Pointer[map[int32]prometheus.Counter]
}

// ClientConnected implements proxy.Observer: a client connection was
// accepted.
func (m *Metrics) ClientConnected() {
	m.clientsCurrent.Add(1)
	m.clientsTotal.Add(1)
}

// ClientDisconnected implements proxy.Observer: a client connection ended.
func (m *Metrics) ClientDisconnected() {
	m.clientsCurrent.Add(-1)
}

// UserClientRefused implements proxy.UserLimitObserver: a login was
// refused by max_user_client_conn.
func (m *Metrics) UserClientRefused() { m.userRefused.Inc() }

// ClientTLSRefused implements clienttls.Observer: a client was refused at
// its TLS step; reason is "plain" or "handshake".
func (m *Metrics) ClientTLSRefused(reason string) {
	m.tlsRefused.WithLabelValues(reason).Inc()
}

// ClientLoginTimeout implements proxy.LoginTimeoutObserver: a client was
// closed by client_login_timeout, for reason (a bounded set).
func (m *Metrics) ClientLoginTimeout(reason string) {
	m.loginTimeouts.WithLabelValues(reason).Inc()
}

// ClientPanicked implements proxy.PanicObserver: a panic while serving a
// client was recovered; path is "goroutine" or "loop".
func (m *Metrics) ClientPanicked(path string) {
	m.panics.WithLabelValues(path).Inc()
}

// Request implements proxy.Observer: one forwarded request ended. It counts
// the operation, its bytes and its duration, and the error reply if !ok.
func (m *Metrics) Request(route, command string, bytesIn, bytesOut int, d time.Duration, ok bool) {
	rs := m.route(route)
	rs.command(command).Inc()
	rs.duration.Observe(d.Seconds())
	if bytesIn > 0 {
		rs.bytesIn.Add(float64(bytesIn))
		m.bytesInTotal.Add(uint64(bytesIn))
	}
	if bytesOut > 0 {
		rs.bytesOut.Add(float64(bytesOut))
		m.bytesOutTotal.Add(uint64(bytesOut))
	}
	if !ok {
		rs.errors.Inc()
		m.errorsTotal.Add(1)
	}
	m.opsTotal.Add(1)
	m.queryHist.record(d)
}

// UpstreamError implements proxy.Observer: count one error code. The first
// MaxErrorCodes distinct codes seen by the process get a label of their
// own; later ones are counted as "other", so that a misbehaving upstream
// cannot create series without bound.
func (m *Metrics) UpstreamError(route string, code int32) {
	m.route(route).code(code).Inc()
}

// ForgetRoute drops the request series of a route (for a route removed by
// a reload, once it has drained), so that they stop being exported. A later
// request on that route creates them again, from zero. Pool series go away
// by themselves when the route's pools are closed and drained.
func (m *Metrics) ForgetRoute(route string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	cur := *m.routes.Load()
	if _, ok := cur[route]; !ok {
		return
	}
	next := maps.Clone(cur)
	delete(next, route)
	m.routes.Store(&next)
	l := prometheus.Labels{"route": labelValue(route)}
	m.operations.DeletePartialMatch(l)
	m.requestDuration.DeletePartialMatch(l)
	m.bytesIn.DeletePartialMatch(l)
	m.bytesOut.DeletePartialMatch(l)
	m.requestErrors.DeletePartialMatch(l)
	m.upstreamErrors.DeletePartialMatch(l)
}

// labelValue makes s usable as a label value: Prometheus refuses (panics
// on) invalid UTF-8, and server addresses may one day come from the network
// (replica-set discovery).
func labelValue(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// route returns the series of route, creating them on first sight.
func (m *Metrics) route(name string) *routeSeries {
	if rs := (*m.routes.Load())[name]; rs != nil {
		return rs
	}
	return m.addRoute(name)
}

func (m *Metrics) addRoute(name string) *routeSeries {
	m.mu.Lock()
	defer m.mu.Unlock()
	cur := *m.routes.Load()
	if rs := cur[name]; rs != nil {
		return rs
	}
	if len(cur) >= MaxRoutes {
		// Not cached under name: past the bound every new name takes this
		// slow path, which only a broken caller can cause.
		name = OtherLabel
		if rs := cur[name]; rs != nil {
			return rs
		}
	}
	l := labelValue(name)
	rs := &routeSeries{
		m:        m,
		name:     l,
		duration: m.requestDuration.WithLabelValues(l),
		bytesIn:  m.bytesIn.WithLabelValues(l),
		bytesOut: m.bytesOut.WithLabelValues(l),
		errors:   m.requestErrors.WithLabelValues(l),
	}
	cmds := map[string]prometheus.Counter{}
	rs.commands.Store(&cmds)
	codes := map[int32]prometheus.Counter{}
	rs.codes.Store(&codes)
	next := maps.Clone(cur)
	next[name] = rs
	m.routes.Store(&next)
	return rs
}

// command returns the operations counter of command on this route.
func (rs *routeSeries) command(name string) prometheus.Counter {
	if c := (*rs.commands.Load())[name]; c != nil {
		return c
	}
	m := rs.m
	m.mu.Lock()
	defer m.mu.Unlock()
	cur := *rs.commands.Load()
	if c := cur[name]; c != nil {
		return c
	}
	if len(cur) >= MaxCommandsPerRoute {
		name = OtherLabel
		if c := cur[name]; c != nil {
			return c
		}
	}
	c := m.operations.WithLabelValues(rs.name, labelValue(name))
	next := maps.Clone(cur)
	next[name] = c
	rs.commands.Store(&next)
	return c
}

// code returns the upstream error counter of code on this route.
func (rs *routeSeries) code(code int32) prometheus.Counter {
	if c := (*rs.codes.Load())[code]; c != nil {
		return c
	}
	m := rs.m
	m.mu.Lock()
	defer m.mu.Unlock()
	cur := *rs.codes.Load()
	if c := cur[code]; c != nil {
		return c
	}
	label, ok := m.codes[code]
	if !ok {
		if len(m.codes) < MaxErrorCodes {
			label = strconv.FormatInt(int64(code), 10)
			m.codes[code] = label
		} else {
			label = OtherLabel
		}
	}
	c := m.upstreamErrors.WithLabelValues(rs.name, label)
	// The cache keeps the labelled codes and, up to a bound, codes mapped to
	// "other"; past it they take this slow path each time.
	if len(cur) < 2*MaxErrorCodes {
		next := maps.Clone(cur)
		next[code] = c
		rs.codes.Store(&next)
	}
	return c
}
