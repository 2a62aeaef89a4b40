package metrics

// Client authentication series: failed logins by reason and auth_user
// lookups by result, reported by the auth package's Observer (wired by
// internal/app), so that a flood of logins or of lookups shows.

import "github.com/prometheus/client_golang/prometheus"

// maxAuthLabels bounds the distinct reason and result labels: the auth
// package reports a handful of fixed values; anything past the bound is
// counted as "other".
const maxAuthLabels = 16

// authSeries are the two counters, registered by New.
type authSeries struct {
	failures *prometheus.CounterVec // reason
	lookups  *prometheus.CounterVec // result
	// labels are the label children resolved so far, per vector; guarded
	// by Metrics.mu.
	labels map[*prometheus.CounterVec]map[string]prometheus.Counter
}

func newAuthSeries() authSeries {
	return authSeries{
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: "auth", Name: "failures_total",
			Help: "Failed client logins, by reason: bad_proof (a wrong password), unknown_user, restricted (authenticationRestrictions), lookup_failed (the auth_user lookup could not answer), malformed.",
		}, []string{"reason"}),
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Subsystem: "auth", Name: "lookups_total",
			Help: "auth_user lookups of users upstream, by result: found, not_found, error (the upstream could not be asked), busy (no lookup slot within the timeout), peer_busy (no slot for the client's address).",
		}, []string{"result"}),
		labels: map[*prometheus.CounterVec]map[string]prometheus.Counter{},
	}
}

// authCounter returns v's child for label, "other" past maxAuthLabels.
func (m *Metrics) authCounter(v *prometheus.CounterVec, label string) prometheus.Counter {
	m.mu.Lock()
	defer m.mu.Unlock()
	byLabel := m.auth.labels[v]
	if byLabel == nil {
		byLabel = map[string]prometheus.Counter{}
		m.auth.labels[v] = byLabel
	}
	if c, ok := byLabel[label]; ok {
		return c
	}
	if len(byLabel) >= maxAuthLabels {
		label = OtherLabel
		if c, ok := byLabel[label]; ok {
			return c
		}
	}
	c := v.WithLabelValues(label)
	byLabel[label] = c
	return c
}

// AuthFailed implements auth.Observer: one failed client login.
func (m *Metrics) AuthFailed(reason string) { m.authCounter(m.auth.failures, reason).Inc() }

// AuthLookup implements auth.Observer: one auth_user lookup, or one
// refused a slot.
func (m *Metrics) AuthLookup(result string) { m.authCounter(m.auth.lookups, result).Inc() }
