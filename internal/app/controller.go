package app

import (
	"fmt"
	"sort"

	"github.com/mongobouncer/mongobouncer/internal/admin"
	"github.com/mongobouncer/mongobouncer/internal/clienttls"
	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/metrics"
	"github.com/mongobouncer/mongobouncer/internal/proxy"
	"github.com/mongobouncer/mongobouncer/internal/routing"
	"github.com/mongobouncer/mongobouncer/internal/topology"
)

var _ admin.Controller = (*App)(nil)

// The proxy reports to metrics as its Observer; the assertion lives here
// because metrics may not import proxy.
var _ proxy.Observer = (*metrics.Metrics)(nil)
var _ clienttls.Observer = (*metrics.Metrics)(nil)
var _ proxy.LoginTimeoutObserver = (*metrics.Metrics)(nil)
var _ proxy.PanicObserver = (*metrics.Metrics)(nil)

// sortedRoutes returns copies of the running routes, taken under the lock
// (a reload updates their settings), by name with the catch-all last.
func (a *App) sortedRoutes() []route {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]route, 0, len(a.routes))
	for _, r := range a.routes {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool {
		ni, nj := out[i].eff.Name, out[j].eff.Name
		if (ni == "*") != (nj == "*") {
			return nj == "*"
		}
		return ni < nj
	})
	return out
}

// pick returns the routes an admin command names: one, or all for "".
func (a *App) pick(name string) ([]route, error) {
	all := a.sortedRoutes()
	if name == "" {
		return all, nil
	}
	for _, r := range all {
		if r.eff.Name == name {
			return []route{r}, nil
		}
	}
	return nil, fmt.Errorf("%w %q", admin.ErrUnknownRoute, name)
}

// Pools describes every pool (SHOW POOLS): one per route and server, with
// the server's role, RTT and last error.
func (a *App) Pools() []admin.PoolInfo {
	var out []admin.PoolInfo
	for _, r := range a.sortedRoutes() {
		for _, s := range r.topo.Servers() {
			out = append(out, a.poolInfo(r, s))
			// A pass-through route's user pools, a row each: the admin
			// output may name users (the metrics do not).
			for _, up := range s.UserPools() {
				pi := a.poolInfo(r, s)
				st := up.Stats
				pi.User, pi.State, pi.Generation = up.User.String(), st.State.String(), st.Generation
				pi.Total, pi.Available, pi.InUse, pi.Pending, pi.Waiters = st.Total, st.Available, st.InUse, st.Pending, st.Waiters
				pi.MaxPoolSize, pi.MinPoolSize, pi.Checkouts, pi.CheckoutWait = st.Options.MaxPoolSize, st.Options.MinPoolSize, 0, 0
				pi.Limit = limitOf(st)
				out = append(out, pi)
			}
		}
	}
	return out
}

// Clients describes every connected client (SHOW CLIENTS).
func (a *App) Clients() []admin.ClientInfo {
	cs := a.server.Clients()
	out := make([]admin.ClientInfo, len(cs))
	for i, c := range cs {
		out[i] = admin.ClientInfo{ID: c.ID, Addr: c.Addr, AppName: c.AppName, User: c.User, Listener: c.Listener,
			ConnectedAt: c.ConnectedAt, State: admin.ClientState(c.State), PinnedServer: c.PinnedServer,
			Requests: c.Requests, LoadBalanced: c.LoadBalanced}
	}
	return out
}

// Servers describes every upstream connection (SHOW SERVERS), with its
// server's role now.
func (a *App) Servers() []admin.ServerConnInfo {
	return serverConnInfos(a.metrics.Connections(), a.rolesByServer())
}

// Stats returns totals since start (SHOW STATS).
func (a *App) Stats() admin.StatsInfo {
	st := statsInfo(a.metrics.Stats())
	for _, r := range a.sortedRoutes() {
		for _, s := range r.topo.Servers() {
			db := s.Share().Stats()
			st.DBWaits += db.Waits
			st.DBEvictions += db.Evictions
		}
	}
	st.UserClientRefused = a.server.UserClientRefused()
	return st
}

// serverConnInfos maps metrics' connection snapshots to admin's: metrics
// must not import admin (packages import downward), so app translates.
// roles are the servers' roles by route and address; a connection whose
// server is no longer its route's (it drains from a replaced topology or a
// removed member) is RoleUnknown.
func serverConnInfos(cs []metrics.ServerConn, roles map[[2]string]string) []admin.ServerConnInfo {
	if cs == nil {
		return nil // keep "no connections" as null in the admin JSON, as before
	}
	out := make([]admin.ServerConnInfo, len(cs))
	for i, c := range cs {
		out[i] = admin.ServerConnInfo{Route: c.Route, Server: c.Server, ID: c.ID, State: c.State,
			Generation: c.Generation, CreatedAt: c.CreatedAt, LastUsed: c.LastUsed, Role: admin.RoleUnknown}
		if r, ok := roles[[2]string{c.Route, c.Server}]; ok {
			out[i].Role = r
		}
	}
	return out
}

// statsInfo maps metrics' totals to admin's SHOW STATS snapshot.
func statsInfo(t metrics.Totals) admin.StatsInfo {
	return admin.StatsInfo{Uptime: t.Uptime, ClientsCurrent: t.ClientsCurrent, ClientsTotal: t.ClientsTotal,
		Operations: t.Operations, Errors: t.Errors, BytesIn: t.BytesIn, BytesOut: t.BytesOut,
		WaitAvg: t.WaitAvg, WaitP99: t.WaitP99, QueryAvg: t.QueryAvg, QueryP99: t.QueryP99}
}

// Ready reports whether every route can serve a primary read now
// (routeWritable), and for each route that cannot, what its servers are.
// A max_client_conn that the open-file limit cannot hold adds a warning
// line without failing readiness: the pooler serves every client it can,
// and an orchestrator that took it out of rotation for a configuration
// problem would turn a limit reached at peak into an outage now.
func (a *App) Ready() (bool, []string) {
	var why []string
	for _, r := range a.sortedRoutes() {
		if !routeWritable(r.topo) {
			why = append(why, notWritableReason(r))
		}
	}
	if a.server.Draining() || a.stopping.Load() {
		// stopping: also during shutdown_delay, before the drain.
		why = append(why, "shutting down")
	}
	ready := len(why) == 0
	a.mu.Lock()
	fds := a.fds
	a.mu.Unlock()
	if fds.Short() {
		why = append(why, fds.Warning())
	}
	return ready, why
}

// Pause stops handing out connections for a route, or for all ("").
func (a *App) Pause(name string) error {
	if err := a.setGate(name, (*routing.Route).Pause); err != nil {
		return err
	}
	a.log.Info("paused", "route", name)
	return nil
}

// Resume undoes Pause.
func (a *App) Resume(name string) error {
	if err := a.setGate(name, (*routing.Route).Resume); err != nil {
		return err
	}
	a.log.Info("resumed", "route", name)
	return nil
}

// setGate pauses or resumes (act) the running route name, or all (""),
// under a.mu, which a reload's switchRoutes holds too: a pause that acted
// on routes picked before a reload replaced them would close the gate of
// a route that has left the table, after switchRoutes looked at it, where
// no resume reaches it (a request that chose that route before the switch
// would wait at its gate until shutdown), and leave the route now
// configured unpaused; a resume so lost would leave the new one paused.
func (a *App) setGate(name string, act func(*routing.Route)) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var rs []*routing.Route
	for n, r := range a.routes {
		if name == "" || n == name {
			rs = append(rs, r.live)
		}
	}
	if len(rs) == 0 && name != "" {
		return fmt.Errorf("%w %q", admin.ErrUnknownRoute, name)
	}
	if testHookSetGate != nil {
		testHookSetGate()
	}
	for _, r := range rs {
		act(r) // gateMu is a leaf
	}
	return nil
}

// testHookSetGate, when set, runs as setGate is about to act (tests).
var testHookSetGate func()

// Reconnect clears the pools of a route, or of all (""), so that every
// connection is replaced: in-use ones finish their request and are closed
// at check-in, idle ones are closed, new requests get new connections. A
// pool whose server is usable is made ready again at once, so requests do
// not wait for the next heartbeat.
func (a *App) Reconnect(name string) error {
	rs, err := a.pick(name)
	if err != nil {
		return err
	}
	for _, r := range rs {
		for _, s := range r.topo.Servers() {
			p := s.Pool()
			p.Clear(false)
			if s.State() == topology.Usable {
				_ = p.Ready()
			}
		}
	}
	a.log.Info("reconnect: pools cleared", "route", name)
	return nil
}

// Config returns the effective configuration, secrets redacted.
func (a *App) Config() map[string]any {
	a.mu.Lock()
	cfg := a.cfg
	a.mu.Unlock()
	g := cfg.Global
	out := map[string]any{
		"path":                     cfg.Path,
		"listen":                   g.Listen,
		"admin_listen":             g.AdminListen,
		"max_client_conn":          g.MaxClientConn,
		"max_user_client_conn":     g.MaxUserClientConn,
		"log_level":                string(g.LogLevel),
		"log_format":               string(g.LogFormat),
		"shutdown_timeout":         g.ShutdownTimeout.String(),
		"shutdown_delay":           g.ShutdownDelay.String(),
		"hello_max_await":          g.HelloMaxAwait.String(),
		"upstream_command_timeout": g.UpstreamCommandTimeout.String(),
		"event_loop":               g.EventLoop,
		"event_loop_threads":       g.EventLoopThreads,
		"event_loop_io":            string(g.EventLoopIO),
		"event_loop_spin":          g.EventLoopSpin.String(),
		"auth_type":                string(g.AuthType),
		"auth_file":                cfg.AuthFilePath(),
		"auth_user":                g.AuthUser,
		"auth_user_service_routes": g.AuthUserServiceRoutes,
		"auth_max_lookups":         g.AuthMaxLookups,
		"admin_users":              append([]string{}, g.AdminUsers...),
		"auth_cache_ttl":           g.AuthCacheTTL.String(),
		"auth_lookups_per_peer":    g.AuthLookupsPerPeer,
		"max_scram_iterations":     g.MaxSCRAMIterations,
		"tls_mode":                 string(g.TLSMode),
		"tls_cert_file":            g.TLSCertFile,
		"tls_key_file":             g.TLSKeyFile,
		"tls_ca_file":              g.TLSCAFile,
		"tls_handshake_timeout":    g.TLSHandshakeTimeout.String(),
		"tls_watch_interval":       g.TLSWatchInterval.String(),
		"user_pool_idle_timeout":   g.UserPoolIdleTimeout.String(),
		"client_login_timeout":     g.ClientLoginTimeout.String(),
		"so_reuseport":             g.SoReuseport,
	}
	out["max_prelogin_message_size"] = g.MaxPreLoginMessageSize
	routes := map[string]any{}
	for _, r := range a.sortedRoutes() {
		e := r.eff
		routes[e.Name] = map[string]any{
			"connection_string":        e.Conn.Redacted(),
			"listen":                   e.Listen,
			"pool_mode":                string(r.live.PoolMode()),
			"max_pool_size":            showPoolSize(e.Pool),
			"max_pool_size_ceiling":    e.MaxPoolSizeCeiling,
			"min_pool_size":            e.MinPoolSize,
			"max_idle_time":            e.MaxIdleTime.String(),
			"max_connecting":           e.MaxConnecting,
			"wait_queue_timeout":       e.WaitQueueTimeout.String(),
			"heartbeat_interval":       e.HeartbeatInterval.String(),
			"connect_timeout":          e.ConnectTimeout.String(),
			"server_selection_timeout": e.ServerSelectionTimeout.String(),
			"client_idle_timeout":      e.ClientIdleTimeout.String(),
			"max_message_size":         e.MaxMessageSize,
			"app_name":                 e.AppName,
			"pass_through":             e.PassThrough,
			"max_user_connections":     e.MaxUserConnections,
			"max_db_connections":       e.MaxDBConnections,
		}
	}
	out["databases"] = routes
	return out
}

// showPoolSize is max_pool_size as SHOW CONFIG gives it: a number, or "auto".
func showPoolSize(p config.Pool) any {
	if p.AutoPoolSize() {
		return "auto"
	}
	return p.MaxPoolSize
}
