package session

// Pins and open transactions: which upstream connection a client keeps on
// each route, which transactions it began, and when a pin goes back. The
// pins taken here are given back (CheckIn) after Mu is released.

import (
	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/routing"
	"github.com/mongobouncer/mongobouncer/internal/topology"
)

func (ss *Session) pinLocked(route *routing.Route) *Pin {
	for i := range ss.pins {
		if ss.pins[i].Route == route {
			return &ss.pins[i]
		}
	}
	return nil
}

// hasPinLocked reports whether the client holds any pinned connection.
func (ss *Session) hasPinLocked() bool {
	for _, p := range ss.pins {
		if p.Conn != nil {
			return true
		}
	}
	return false
}

func (ss *Session) hasOpenLocked(route *routing.Route) bool {
	for _, r := range ss.open {
		if r == route {
			return true
		}
	}
	return false
}

// HasPinSlots reports whether the client ever pinned a connection (a pin
// slot, held or given back, for some route). Only the owner, which alone
// adds slots, may call it: it reads without Mu.
func (ss *Session) HasPinSlots() bool { return len(ss.pins) > 0 }

// HasPin reports whether the client holds a pinned connection.
func (ss *Session) HasPin() bool {
	ss.Mu.Lock()
	defer ss.Mu.Unlock()
	return ss.hasPinLocked()
}

// Pinned returns the client's pin for route, if it holds a connection.
func (ss *Session) Pinned(route *routing.Route) (Pin, bool) {
	ss.Mu.Lock()
	defer ss.Mu.Unlock()
	if p := ss.pinLocked(route); p != nil && p.Conn != nil {
		return *p, true
	}
	return Pin{}, false
}

// PinnedElsewhere reports whether the client holds a pinned connection on
// route to a server other than srv.
func (ss *Session) PinnedElsewhere(route *routing.Route, srv *topology.Server) bool {
	p, ok := ss.Pinned(route)
	return ok && p.Srv != srv
}

// SetPin pins pc, of srv, to the client for route.
func (ss *Session) SetPin(route *routing.Route, srv *topology.Server, pc *pool.Conn) {
	ss.Mu.Lock()
	defer ss.Mu.Unlock()
	if p := ss.pinLocked(route); p != nil {
		p.Srv, p.Conn = srv, pc
		return
	}
	ss.pins = append(ss.pins, Pin{Route: route, Srv: srv, Conn: pc})
}

// HasOpen reports whether the client has a transaction open on route.
func (ss *Session) HasOpen(route *routing.Route) bool {
	ss.Mu.Lock()
	defer ss.Mu.Unlock()
	return ss.hasOpenLocked(route)
}

// IsOpen reports whether the client has transaction key open.
func (ss *Session) IsOpen(key command.TxnKey) bool {
	ss.Mu.Lock()
	defer ss.Mu.Unlock()
	_, ok := ss.open[key]
	return ok
}

// OpenRoute returns the route transaction key is open on, or nil.
func (ss *Session) OpenRoute(key command.TxnKey) *routing.Route {
	ss.Mu.Lock()
	defer ss.Mu.Unlock()
	return ss.open[key]
}

// HasPinOrOpen reports whether the client holds a pinned connection or has
// a transaction open.
func (ss *Session) HasPinOrOpen() bool {
	ss.Mu.Lock()
	defer ss.Mu.Unlock()
	return ss.hasPinLocked() || len(ss.open) > 0
}

// SetOpen records transaction key open on route.
func (ss *Session) SetOpen(key command.TxnKey, route *routing.Route) {
	ss.Mu.Lock()
	defer ss.Mu.Unlock()
	if ss.open == nil {
		ss.open = make(map[command.TxnKey]*routing.Route)
	}
	ss.open[key] = route
}

// TxnEnded forgets an open transaction; if no transaction holds the
// client's transaction-mode pin on its route and the client is not busy,
// the connection goes back to the pool now rather than at the client's
// next request.
func (ss *Session) TxnEnded(key command.TxnKey) {
	if back := ss.forgetTxn(key); back.Conn != nil {
		back.Route.CheckIn(back.Conn)
	}
}

// forgetTxn is TxnEnded's part under Mu: the pin to give back, if any.
func (ss *Session) forgetTxn(key command.TxnKey) (back Pin) {
	ss.Mu.Lock()
	defer ss.Mu.Unlock()
	route, ok := ss.open[key]
	if !ok {
		return Pin{}
	}
	delete(ss.open, key)
	if !ss.busyLocked() && route.PoolMode() != config.PoolModeSession && !ss.hasOpenLocked(route) {
		if p := ss.pinLocked(route); p != nil && p.Conn != nil {
			back = *p
			p.Conn = nil
			ss.stateLocked() // pinned no more, perhaps
		}
	}
	return back
}

// TakeOpen takes the client's open transactions, for its clean-up.
func (ss *Session) TakeOpen() map[command.TxnKey]*routing.Route {
	ss.Mu.Lock()
	defer ss.Mu.Unlock()
	open := ss.open
	ss.open = nil
	return open
}

// TakePins takes all the client's pins, for its clean-up.
func (ss *Session) TakePins() []Pin {
	ss.Mu.Lock()
	defer ss.Mu.Unlock()
	pins := ss.pins
	ss.pins = nil
	return pins
}

// TakeStalePins unpins and returns the pinned connections of routes for
// which stale says so (a reload replaced or removed them), unless a
// transaction still needs them; the caller checks them in (CheckIn).
func (ss *Session) TakeStalePins(stale func(*routing.Route) bool) []Pin {
	ss.Mu.Lock()
	defer ss.Mu.Unlock()
	return ss.takePinsLocked(func(p *Pin) bool { return stale(p.Route) })
}

// takePinsLocked unpins and returns the pinned connections of routes with
// no transaction open for which drop says so.
func (ss *Session) takePinsLocked(drop func(*Pin) bool) []Pin {
	var back []Pin
	for i := range ss.pins {
		if p := &ss.pins[i]; p.Conn != nil && !ss.hasOpenLocked(p.Route) && drop(p) {
			back = append(back, *p)
			p.Conn = nil
		}
	}
	return back
}

// CheckIn gives connections taken from a session back to their pools.
func CheckIn(back []Pin) {
	for _, p := range back {
		if p.Conn != nil {
			p.Route.CheckIn(p.Conn)
		}
	}
}

// Replying is the end of a request's hold on pc, once its reply is in
// hand: the client is replying, and keeps pc pinned if it was (pinned) and
// a session-mode route or an open transaction still needs it. It reports
// whether pc stays pinned; if not, the caller checks it in.
func (ss *Session) Replying(route *routing.Route, pc *pool.Conn, pinned bool) bool {
	ss.Mu.Lock()
	defer ss.Mu.Unlock()
	if pinned && route.PoolMode() != config.PoolModeSession && !ss.hasOpenLocked(route) {
		if p := ss.pinLocked(route); p != nil && p.Conn == pc {
			p.Conn = nil
			pinned = false
		}
	}
	ss.setPhaseLocked(PhaseReplying)
	return pinned
}

// UnpinReplying unpins pc, a connection that failed, and the client is
// replying; the caller checks pc in.
func (ss *Session) UnpinReplying(route *routing.Route, pc *pool.Conn) {
	ss.Mu.Lock()
	defer ss.Mu.Unlock()
	if p := ss.pinLocked(route); p != nil && p.Conn == pc {
		p.Conn = nil
	}
	ss.setPhaseLocked(PhaseReplying)
}

// Idle ends the client's request: it is idle, and the transaction-mode pins
// no transaction holds (one ended through another client while this one
// was busy) are returned, to be checked in (CheckIn).
func (ss *Session) Idle() []Pin {
	ss.Mu.Lock()
	defer ss.Mu.Unlock()
	back := ss.takePinsLocked(func(p *Pin) bool { return p.Route.PoolMode() != config.PoolModeSession })
	ss.setPhaseLocked(PhaseIdle)
	return back
}
