// systemd notifications (Type=notify): READY=1 once the listeners serve,
// RELOADING=1 and READY=1 around each reload, STOPPING=1 when the drain
// begins, and STATUS= with clients, pools and routes at each of those and
// every StatusInterval in between. The protocol is internal/sdnotify.

package app

import (
	"fmt"
	"strconv"
	"time"
)

// DefaultStatusInterval is how often STATUS= is refreshed between state
// changes when Options.StatusInterval is 0: often enough for `systemctl
// status` to be current, rarely enough to cost nothing.
const DefaultStatusInterval = 10 * time.Second

// Reload re-reads the configuration file and applies it (reload). Under
// systemd it is framed by RELOADING=1 and READY=1, whether it succeeds or
// not: after a failed reload the running configuration is still served,
// and STATUS= says the reload failed until one succeeds. Reloads run one
// at a time, so the notifications pair up.
func (a *App) Reload() error {
	a.reloadMu.Lock()
	defer a.reloadMu.Unlock()
	if a.notify == nil {
		err := a.reload()
		a.reloadFailed.Store(err != nil)
		return err
	}
	_ = a.notify.Reloading(a.statusLine() + ", reloading")
	err := a.reload()
	a.reloadFailed.Store(err != nil)
	if a.stopping.Load() {
		// READY=1 would tell systemd the service is up again while it
		// drains (an admin reload command served during the drain).
		_ = a.notify.Status(a.statusLine())
	} else {
		_ = a.notify.Ready(a.statusLine())
	}
	return err
}

// notifyReady sends READY=1 and starts the periodic STATUS=; Start calls
// it once the listeners serve. Upstream readiness is not waited for: a
// pooler whose upstream is down at boot still starts (its clients get
// errors they can retry, /readyz says why), where waiting would have
// systemd kill it at TimeoutStartSec. STATUS= shows how many routes are
// ready.
func (a *App) notifyReady() {
	if a.notify == nil {
		return
	}
	_ = a.notify.Ready(a.statusLine())
	every := a.statusEvery
	if every <= 0 {
		every = DefaultStatusInterval
	}
	a.statusStop = make(chan struct{})
	a.statusDone = make(chan struct{})
	go func() {
		defer close(a.statusDone)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-a.statusStop:
				return
			case <-tick.C:
				_ = a.notify.Status(a.statusLine())
			}
		}
	}()
}

// notifyStopping sends STOPPING=1 once, when the shutdown begins.
func (a *App) notifyStopping() {
	if a.stopping.Swap(true) {
		return
	}
	if a.notify != nil {
		_ = a.notify.Stopping(a.statusLine())
	}
}

// stopStatus ends the periodic STATUS= and waits for it; closeRest calls
// it before the routes it reports on are closed.
func (a *App) stopStatus() {
	a.statusStopOnce.Do(func() {
		if a.statusStop != nil {
			close(a.statusStop)
			<-a.statusDone
		}
	})
}

// statusLine is the STATUS= text, one short line:
//
//	clients 12/10000, pools 3, routes 2/2 ready
//
// with ", last reload failed" and ", draining" when they apply. pools
// counts the servers of every route (one shared pool each).
func (a *App) statusLine() string {
	routes := a.sortedRoutes()
	pools, ready := 0, 0
	for _, r := range routes {
		pools += len(r.topo.Servers())
		if routeWritable(r.topo) {
			ready++
		}
	}
	clients, draining := 0, false
	if a.server != nil {
		clients, draining = a.server.ClientCount(), a.server.Draining()
	}
	a.mu.Lock()
	limit := "unlimited"
	if n := a.cfg.Global.MaxClientConn; n > 0 {
		limit = strconv.Itoa(n)
	}
	a.mu.Unlock()
	s := fmt.Sprintf("clients %d/%s, pools %d, routes %d/%d ready", clients, limit, pools, ready, len(routes))
	if a.reloadFailed.Load() {
		s += ", last reload failed"
	}
	if a.stopping.Load() || draining {
		s += ", draining"
	}
	return s
}
