package app

// This file turns what the topologies know of each server (its type, state,
// round-trip time and last error) into what the operator sees: the role in
// showPools, showServers, the status page and /metrics, and /readyz's rule
// and reasons. It only reads topology's exported API.

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/mongobouncer/mongobouncer/internal/admin"
	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/metrics"
	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/topology"
)

// role names what d's server is now, in admin's words: its SDAM type while
// it is usable, admin.RoleUnknown while it is not (Kind keeps the last
// type seen, which would name a dead primary "primary").
func role(d topology.Description) string {
	if d.State != topology.Usable {
		return admin.RoleUnknown
	}
	switch d.Kind {
	case topology.KindRSPrimary:
		return admin.RolePrimary
	case topology.KindRSSecondary:
		return admin.RoleSecondary
	case topology.KindRSArbiter:
		return admin.RoleArbiter
	case topology.KindMongos:
		return admin.RoleMongos
	case topology.KindStandalone:
		return admin.RoleStandalone
	case topology.KindLoadBalancer:
		return admin.RoleLoadBalancer
	case topology.KindRSOther:
		return admin.RoleOther
	case topology.KindRSGhost:
		return admin.RoleGhost
	}
	return admin.RoleUnknown
}

// maxErrorText bounds an error's text in showPools (the status page keeps
// minutes of samples of it) and in /readyz.
const maxErrorText = 512

// errorText is err's message for an operator: "" for nil, on one line, no
// longer than maxErrorText bytes, and with cs's secrets masked. Upstream
// errors are not expected to carry credentials, but a server's error
// message is not ours to trust, and showPools goes to dashboards.
func errorText(err error, cs config.ConnString) string {
	if err == nil {
		return ""
	}
	s := strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, err.Error())
	for _, secret := range secrets(cs) {
		s = strings.ReplaceAll(s, secret, "xxxxx")
	}
	if len(s) > maxErrorText {
		s = strings.ToValidUTF8(s[:maxErrorText], "") + "…"
	}
	return s
}

// secrets lists cs's secret values, and their percent-encoded forms, as
// they could appear in a message.
func secrets(cs config.ConnString) []string {
	var out []string
	add := func(v string) {
		if v == "" {
			return
		}
		out = append(out, v)
		for _, enc := range []string{url.QueryEscape(v), url.PathEscape(v)} {
			if enc != v {
				out = append(out, enc)
			}
		}
	}
	add(cs.Password)
	add(cs.TLSCertificateKeyFilePassword)
	for _, v := range cs.AuthMechanismProperties {
		add(v)
	}
	return out
}

// rootCause is the innermost error of err's chain, which says what
// happened without the layers that say where ("connection refused" rather
// than "upstream: connect to host:port (dial): dial tcp ...: connect:
// connection refused"): /readyz already names the server.
func rootCause(err error) error {
	for {
		next := errors.Unwrap(err)
		if next == nil || next.Error() == "" {
			return err
		}
		err = next
	}
}

// rttMs is d in milliseconds, to the microsecond.
func rttMs(d time.Duration) float64 {
	return math.Round(d.Seconds()*1e6) / 1e3
}

// poolInfo describes one server of route r and its pool for showPools and
// the status page.
func (a *App) poolInfo(r route, s *topology.Server) admin.PoolInfo {
	d := s.Description()
	st := s.Pool().Stats()
	checkouts, wait := a.metrics.CheckoutTotals(r.eff.Name, s.Address())
	db := s.Share().Stats()
	return admin.PoolInfo{
		Route: r.eff.Name, Server: s.Address(), Mode: string(r.live.PoolMode()),
		State: st.State.String(), Paused: r.live.Paused(), Usable: d.State == topology.Usable,
		Generation: st.Generation, Total: st.Total, Available: st.Available, InUse: st.InUse,
		Pending: st.Pending, Waiters: st.Waiters,
		MaxPoolSize: st.Options.MaxPoolSize, MinPoolSize: st.Options.MinPoolSize, Limit: limitOf(st),
		Checkouts: checkouts, CheckoutWait: wait,
		Role: role(d), RTTMs: rttMs(s.RTT()), LastError: errorText(d.LastError, r.eff.Conn),
		MaxDBConnections: db.Max, DBConnections: db.Used, DBWaits: db.Waits, DBEvictions: db.Evictions,
	}
}

// serverRoles lists every route's servers for /metrics (the
// metrics.ServerSource), read at each scrape.
func (a *App) serverRoles() []metrics.ServerRole {
	var out []metrics.ServerRole
	for _, r := range a.sortedRoutes() {
		for _, s := range r.topo.Servers() {
			sr := metrics.ServerRole{Route: r.eff.Name, Server: s.Address(), Role: role(s.Description()), RTT: s.RTT(),
				DB: s.Share().Stats()}
			if l := s.Pool().Stats().Limiter; l != nil {
				sr.Limit = &metrics.AdaptiveLimit{Limit: l.Limit, MinRTT: l.MinRTT, Gradient: l.Gradient, Drops: l.Drops, Probes: l.Probes}
			}
			out = append(out, sr)
		}
	}
	return out
}

// rolesByServer maps route and server address to the server's role, for
// showServers' rows.
func (a *App) rolesByServer() map[[2]string]string {
	out := map[[2]string]string{}
	for _, r := range a.sortedRoutes() {
		for _, s := range r.topo.Servers() {
			out[[2]string{r.eff.Name, s.Address()}] = role(s.Description())
		}
	}
	return out
}

// routeWritable reports whether t can serve a primary read (or a write)
// now: topology's own selection finds a server that takes writes (a
// replica-set primary, a mongos, a load balancer, or the server of a Single
// topology), Usable with a ready pool. The rule lives in the topology alone.
func routeWritable(t *topology.Topology) bool {
	for _, s := range t.WritableServers() {
		if s.Pool().Stats().State == pool.StateReady {
			return true
		}
	}
	return false
}

// notWritableReason is /readyz's line for a route routeWritable refused:
// each server with its role and, where it says why the server is not used,
// its error or its pool's state.
//
//	route "x": no primary: 127.0.0.1:1 secondary, 127.0.0.1:2 unknown (connection refused)
func notWritableReason(r route) string {
	servers := r.topo.Servers()
	if len(servers) == 0 {
		return fmt.Sprintf("route %q: no primary: no servers", r.eff.Name)
	}
	writable := r.topo.WritableServers()
	parts := make([]string, 0, len(servers))
	for _, s := range servers {
		d := s.Description()
		p := s.Address() + " " + role(d)
		switch st := s.Pool().Stats().State; {
		case d.State != topology.Usable && d.LastError != nil:
			p += " (" + errorText(rootCause(d.LastError), r.eff.Conn) + ")"
		case slices.Contains(writable, s) && st != pool.StateReady:
			p += " (pool " + st.String() + ")"
		}
		parts = append(parts, p)
	}
	return fmt.Sprintf("route %q: no primary: %s", r.eff.Name, strings.Join(parts, ", "))
}

// limitOf is a pool's adaptive limit for showPools and the status page, 0
// for a fixed-size pool.
func limitOf(st pool.Stats) int {
	if st.Limiter == nil {
		return 0
	}
	return st.Limiter.Limit
}
