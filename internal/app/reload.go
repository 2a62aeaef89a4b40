package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/auth"
	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/routing"
)

// ErrNoConfigFile is returned by Reload when mongobouncer runs from flags
// alone.
var ErrNoConfigFile = errors.New("no configuration file to reload (started without --config)")

// ErrClosed is returned by Reload once the App has closed its routes.
var ErrClosed = errors.New("mongobouncer is closed")

// reload re-reads the configuration file and applies it without dropping a
// client: changed pool limits and pool modes apply live, added routes
// start, removed routes leave the routing table at once and close once
// their clients have given back every connection, and a route whose
// upstream changed gets a new topology while the old one drains likewise.
// Listener changes are applied by binding new addresses and closing old
// ones; connected clients stay. If the new file is invalid, nothing changes
// and the error, with file and line, is returned.
func (a *App) reload() error {
	a.mu.Lock()
	path := a.cfg.Path
	authType := a.cfg.Global.AuthType
	a.mu.Unlock()
	if path == "" {
		return ErrNoConfigFile
	}
	cfg, err := config.Load(path)
	if err == nil && a.overrides != nil {
		a.overrides(&cfg)
	}
	var routes []config.EffectiveRoute
	if err == nil {
		routes, err = cfg.Routes()
	}
	var users *auth.Users
	if err == nil {
		// A bad auth_file fails the reload: the users in force stay.
		users, err = loadAuthUsers(cfg, authType, a.log)
	}
	if err != nil {
		a.log.Error("reload failed; keeping the running configuration", "error", err)
		return fmt.Errorf("reload: %w", err)
	}
	logConfigWarnings(a.log, cfg)
	if err := a.apply(cfg, routes, users); err != nil {
		a.log.Error("reload failed; keeping the running configuration", "error", err)
		return fmt.Errorf("reload: %w", err)
	}
	return nil
}

// apply moves the running pooler to cfg. Everything that can fail (new
// topologies, new listeners) is done before anything running changes.
func (a *App) apply(cfg config.Config, want []config.EffectiveRoute, users *auth.Users) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return ErrClosed
	}

	var changes []string
	next := map[string]*route{}
	var built []*route
	fail := func(err error) error {
		for _, r := range built {
			r.topo.Close()
		}
		return err
	}
	// The client certificate files are read again, and a route's
	// upstream TLS files too: a certificate replaced under the same path
	// applies to new connections.
	// The digest first: a file replaced in between is then found
	// changed by the watch, not missed.
	cdigest := clientTLSDigest(cfg.Global)
	ctls, err := clientTLS(cfg.Global)
	if err != nil {
		return err
	}
	for _, er := range want {
		old := a.routes[er.Name]
		filesChanged := false
		if old != nil && sameTopology(old.eff, er) {
			if filesChanged = old.tlsDigest != tlsFilesDigest(er.Conn); !filesChanged {
				next[er.Name] = old
				continue
			}
		}
		r, err := a.buildRoute(er)
		if err != nil {
			return fail(err)
		}
		built = append(built, r)
		next[er.Name] = r
		switch {
		case old == nil:
			changes = append(changes, "added route "+er.Name)
		case filesChanged:
			changes = append(changes, "new upstream TLS files for route "+er.Name)
		default:
			changes = append(changes, "new upstream for route "+er.Name)
		}
	}

	// Listeners: bind what is new first, so a taken port aborts the reload.
	wantL := wantedListeners(cfg, want)
	keep := map[string]bool{}
	var bound []string
	for _, w := range wantL {
		key := listenKey(w.addr, w.route)
		keep[key] = true
		if _, ok := a.listeners[key]; ok {
			continue
		}
		if err := a.bind(w.addr, w.route); err != nil {
			for _, k := range bound {
				a.listeners[k].l.Close()
				delete(a.listeners, k)
			}
			return fail(err)
		}
		bound = append(bound, key)
		changes = append(changes, "listening on "+w.addr)
	}

	// From here on nothing fails.
	order := make([]string, 0, len(want))
	for _, er := range want {
		order = append(order, er.Name)
	}
	removed, err := a.switchRoutes(order, next, cfg.Global.ShutdownTimeout)
	if err != nil {
		return fail(err) // cannot happen: routes are valid and distinct
	}
	for _, name := range removed {
		changes = append(changes, "removed route "+name)
	}
	for _, er := range want {
		r := next[er.Name]
		if r.eff.PoolMode != er.PoolMode {
			r.live.SetPoolMode(er.PoolMode)
			changes = append(changes, fmt.Sprintf("route %s: pool_mode %s", er.Name, er.PoolMode))
		}
		lim := limitsOf(er)
		if lim != limitsOf(r.eff) || er.MaxUserConnections != r.eff.MaxUserConnections {
			for _, s := range r.topo.Servers() {
				if err := s.SetPoolLimits(lim, er.MaxUserConnections); err != nil {
					a.log.Warn("reload: pool limits not applied", "route", er.Name, "server", s.Address(), "error", err)
					continue
				}
				a.metrics.SetPoolLimit(er.Name, s.Address(), lim.MaxPoolSize)
			}
			changes = append(changes, fmt.Sprintf("route %s: pool limits %+v, max_user_connections %d", er.Name, lim, er.MaxUserConnections))
		}
		if er.ClientIdleTimeout != r.eff.ClientIdleTimeout || er.MaxMessageSize != r.eff.MaxMessageSize {
			r.live.SetClientLimits(routeIdleTimeout(er), er.MaxMessageSize)
			changes = append(changes, fmt.Sprintf("route %s: client_idle_timeout %s, max_message_size %d", er.Name, er.ClientIdleTimeout, er.MaxMessageSize))
		}
		if er.MaxDBConnections != r.eff.MaxDBConnections {
			if err := r.topo.SetMaxDBConnections(er.MaxDBConnections); err != nil {
				a.log.Warn("reload: max_db_connections not applied", "route", er.Name, "error", err) // cannot happen: validated
			}
			changes = append(changes, fmt.Sprintf("route %s: max_db_connections %d", er.Name, er.MaxDBConnections))
		}
		r.eff = er
	}
	for key, l := range a.listeners {
		if !keep[key] {
			l.l.Close()
			delete(a.listeners, key)
			changes = append(changes, "stopped listening on "+l.l.Addr().String())
		}
	}
	g := cfg.Global
	a.server.SetClientLimits(maxClients(g.MaxClientConn), g.ClientIdleTimeout)
	a.server.SetUserClientLimit(g.MaxUserClientConn)
	if g.MaxUserClientConn != a.cfg.Global.MaxUserClientConn {
		changes = append(changes, fmt.Sprintf("max_user_client_conn %d", g.MaxUserClientConn))
	}
	a.server.SetLoginTimeout(g.ClientLoginTimeout)
	a.server.SetHelloMaxAwait(g.HelloMaxAwait)
	if g.HelloMaxAwait != a.cfg.Global.HelloMaxAwait {
		changes = append(changes, "hello_max_await "+g.HelloMaxAwait.String())
	}
	if g.ClientLoginTimeout != a.cfg.Global.ClientLoginTimeout {
		changes = append(changes, "client_login_timeout "+g.ClientLoginTimeout.String())
	}
	a.server.SetPreLoginMessageSize(g.MaxPreLoginMessageSize)
	if err := a.server.SetTLS(ctls); err != nil {
		a.log.Warn("reload: client TLS not applied", "error", err) // cannot happen: clientTLS gives a config
	}
	a.clientTLSDigest = cdigest
	// The files in force are the reload's now: a failure the watch logged
	// before is news again if it comes back.
	clear(a.tlsWatch.failed)
	if g.TLSWatchInterval != a.cfg.Global.TLSWatchInterval {
		a.kickTLSWatch()
		changes = append(changes, "tls_watch_interval "+g.TLSWatchInterval.String())
	}
	if g.TLSMode != a.cfg.Global.TLSMode || g.TLSCertFile != a.cfg.Global.TLSCertFile || g.TLSKeyFile != a.cfg.Global.TLSKeyFile || g.TLSCAFile != a.cfg.Global.TLSCAFile {
		changes = append(changes, fmt.Sprintf("client tls_mode %s", ctls.Mode))
	}
	if a.level != nil && g.LogLevel != a.cfg.Global.LogLevel {
		a.level.Set(g.LogLevel.Level())
		changes = append(changes, "log_level "+string(g.LogLevel))
	}
	if g.LogFormat != a.cfg.Global.LogFormat {
		a.log.Warn("reload: log_format changes need a restart", "running", string(a.cfg.Global.LogFormat), "file", string(g.LogFormat))
	}
	run := a.cfg.Global
	keepRunning(a.log, "event_loop", &cfg.Global.EventLoop, run.EventLoop)
	keepRunning(a.log, "event_loop_threads", &cfg.Global.EventLoopThreads, run.EventLoopThreads)
	keepRunning(a.log, "event_loop_io", &cfg.Global.EventLoopIO, run.EventLoopIO)
	keepRunning(a.log, "event_loop_spin", &cfg.Global.EventLoopSpin, run.EventLoopSpin)
	keepRunning(a.log, "admin_listen", &cfg.Global.AdminListen, run.AdminListen)
	keepRunning(a.log, "so_reuseport", &cfg.Global.SoReuseport, run.SoReuseport)
	keepRunning(a.log, "auth_type", &cfg.Global.AuthType, run.AuthType)
	keepRunning(a.log, "auth_max_lookups", &cfg.Global.AuthMaxLookups, run.AuthMaxLookups)
	keepRunning(a.log, "max_scram_iterations", &cfg.Global.MaxSCRAMIterations, run.MaxSCRAMIterations)
	if a.auth != nil {
		a.auth.Users.Update(users, adminIDs(cfg.Global.AdminUsers))
		if a.authLookup != nil {
			a.authLookup.setConfig(cfg, want)
			setCacheConfig(a.auth.Users, cfg.Global)
		}
		changes = append(changes, fmt.Sprintf("auth_file: %d users", users.Len()))
	}
	a.routes = next
	a.cfg = cfg
	a.fds = fdBudget(cfg, want, a.fds.Limit)
	if a.fds.Short() {
		checkFDs(a.log, a.fds)
	}
	if len(changes) == 0 {
		changes = []string{"no changes"}
	}
	a.log.Info("configuration reloaded", "file", cfg.Path, "changes", strings.Join(changes, "; "))
	return nil
}

// switchRoutes puts next (by name, served in the order of order) in the
// place of a.routes in the proxy's routing table, and drains every running
// route that next replaces or leaves out (drainTimeout: shutdown_timeout).
// It returns the names of the routes left out. The caller holds a.mu and
// sets a.routes to next; a reload and the TLS file watch share it, so that
// a route rebuilt for rotated TLS files is switched exactly as on reload.
func (a *App) switchRoutes(order []string, next map[string]*route, drainTimeout time.Duration) (removed []string, err error) {
	proxyRoutes := make([]*routing.Route, 0, len(order))
	for _, name := range order {
		proxyRoutes = append(proxyRoutes, next[name].live)
	}
	// A paused route stays paused when a reload replaces it (the
	// runbook's pause, switch upstream, reload, resume).
	for name, old := range a.routes {
		if r, ok := next[name]; ok && r != old && old.live.Paused() {
			r.live.Pause()
		}
	}
	if err := a.server.SetRoutes(proxyRoutes); err != nil {
		return nil, err
	}
	// Requests waiting at the pause of a route that left the table are let
	// go: they fail retryably, and the driver's retry takes the route now
	// configured.
	for name, old := range a.routes {
		if next[name] != old && old.live.Paused() {
			old.live.Resume()
		}
	}
	for name, old := range a.routes {
		if next[name] != old {
			_, still := next[name]
			if !still {
				removed = append(removed, name)
			}
			a.drain(old, drainTimeout, !still)
		}
	}
	return removed, nil
}

// limitsOf returns the pool limits of a route. max_pool_size = "auto" is an
// adaptive pool whose cap is max_pool_size_ceiling.
func limitsOf(er config.EffectiveRoute) pool.Limits {
	size, auto := er.MaxPoolSize, er.AutoPoolSize()
	if auto {
		size = er.MaxPoolSizeCeiling
	}
	return pool.Limits{MaxPoolSize: size, MinPoolSize: er.MinPoolSize, MaxConnecting: er.MaxConnecting,
		MaxIdleTime: er.MaxIdleTime, WaitQueueTimeout: er.WaitQueueTimeout, Adaptive: auto}
}

// drain closes a route that left the routing table once its clients have
// given back every upstream connection, or after timeout (shutdown_timeout:
// 0 closes at once), or when the App closes (closeRest), whichever comes
// first. removed says the route is gone for good (not replaced), so its
// request metrics go too.
func (a *App) drain(r *route, timeout time.Duration, removed bool) {
	a.draining.Add(1)
	go func() {
		defer a.draining.Done()
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for r.live.Held() > 0 {
			select {
			case <-ctx.Done():
				a.log.Warn("route drain timed out; closing its pools with connections still in use", "route", r.eff.Name,
					"held", r.live.Held(), "shutdown_timeout", timeout)
				r.topo.Close()
				return
			case <-a.stopDrains:
				// The App is closing every route anyway: waiting longer
				// than the shutdown's own bound would hold the exit.
				a.log.Warn("closing a draining route at shutdown with connections still in use", "route", r.eff.Name, "held", r.live.Held())
				r.topo.Close()
				return
			case <-tick.C:
			}
		}
		r.topo.Close()
		if removed {
			// Unless a later reload added the route back meanwhile: its
			// metrics are the new route's now.
			a.mu.Lock()
			_, back := a.routes[r.eff.Name]
			a.mu.Unlock()
			if !back {
				a.metrics.ForgetRoute(r.eff.Name)
			}
		}
		a.log.Info("route drained and closed", "route", r.eff.Name)
	}()
}

// keepRunning handles a restart-only setting: when the file changes it, it
// warns and puts the running value back in the new configuration, so that
// SHOW CONFIG and later reloads compare against what is really running.
func keepRunning[T comparable](log *slog.Logger, key string, file *T, running T) {
	if *file == running {
		return
	}
	log.Warn("reload: "+key+" changes need a restart", "running", running, "file", *file)
	*file = running
}

// logConfigWarnings logs what the connection strings warn about: values
// the connection-string spec says to ignore rather than refuse. Each names
// file:line and never quotes a secret.
func logConfigWarnings(log *slog.Logger, cfg config.Config) {
	for _, w := range cfg.Warnings() {
		log.Warn("configuration warning", "problem", w.Error())
	}
}
