// Package session is what a client of mongobouncer keeps across its
// requests, under one lock: its pinned upstream connections (one per
// route), the transactions it began and has not ended, where its request
// is (its phase, and the state SHOW CLIENTS shows), who it is (user,
// application name, load-balanced mode) and the cursors a load-balanced
// client opened. Other clients, the admin and a drain read it; the
// client's owner writes it. Sending anything upstream (aborting a
// transaction a client left open) and the server-wide map of which
// session owns a transaction are proxy's.
//
// # Lock order
//
// Session.Mu ("sessMu") is the client's second lock, after its event-loop
// ownership; the whole order is written once, in internal/proxy's package
// doc ("Lock order"), which holds all the client's locks. This package
// takes no other lock while it holds Mu: pins it unpins are checked in
// after Mu is released (CheckIn).
package session

import (
	"sync"
	"sync/atomic"

	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/routing"
	"github.com/mongobouncer/mongobouncer/internal/topology"
)

// Phase is where a client's request is. It decides whether the client is
// busy (its pins may not be released by others), whether a drain waits
// for it, and, with its pins, what SHOW CLIENTS says.
type Phase uint8

const (
	// PhaseIdle: no request.
	PhaseIdle Phase = iota
	// PhaseWaiting: waiting for an upstream connection.
	PhaseWaiting
	// PhaseActive: holding the request's upstream connection.
	PhaseActive
	// PhaseReplying: the connection given back; the reply is being written.
	PhaseReplying
)

// State is where a client is, as SHOW CLIENTS says it.
type State uint32

// The states of SHOW CLIENTS.
const (
	StateIdle State = iota
	StateWaiting
	StateActive
	StatePinned
)

// String returns the SHOW CLIENTS spelling.
func (s State) String() string {
	switch s {
	case StateWaiting:
		return "waiting"
	case StateActive:
		return "active"
	case StatePinned:
		return "pinned"
	}
	return "idle"
}

// Pin is an upstream connection a client keeps across requests: in
// session mode for its whole life, in transaction mode while it has a
// transaction open on that route. Conn nil: the route's pin was given back.
type Pin struct {
	Route *routing.Route
	Srv   *topology.Server
	Conn  *pool.Conn
}

// Session is one client's session. Its zero value is ready. The methods
// whose names end in Locked are called with Mu held; no other lock is
// meant by that suffix.
type Session struct {
	// Mu guards the fields below that are not atomics. Only this
	// package's methods take it, each releasing it by a defer; it is
	// exported so that tests of the proxy's panic recovery can hold it as
	// another goroutine would.
	Mu sync.Mutex
	// appName is the client's application name from its handshake;
	// guarded by Mu.
	appName string
	// user is the login's "user@db", for SHOW CLIENTS; guarded by Mu.
	user string
	// pins holds at most one pin per route; guarded by Mu. Its length
	// changes only by the owner (HasPinSlots reads it without Mu).
	pins []Pin
	// open are the transactions begun through this client that have not
	// ended; they are aborted if the client disconnects. Guarded by Mu.
	open map[command.TxnKey]*routing.Route
	// lbCursors are the cursors a load-balanced client opened and has not
	// finished: a drain waits for them (lbcursor.go). Guarded by Mu.
	lbCursors map[int64]struct{}
	// lbMode is set by the client's first hello when it says loadBalanced
	// (written once under Mu, read without it).
	lbMode atomic.Bool
	// phase is written by the owner under Mu (setPhaseLocked), read by the
	// owner freely (Phase) and by others under Mu.
	phase Phase
	// state is a State, written by setPhaseLocked, read by SHOW CLIENTS
	// without the lock.
	state atomic.Uint32
	// requests counts the client's forwarded requests (SHOW CLIENTS), and
	// lastRoute is the route of the most recent one: atomics, written by
	// the owner, read by others without the lock.
	requests  atomic.Uint64
	lastRoute atomic.Pointer[routing.Route]
}

// Start records the start of a forwarded request on route: one more
// request, route the most recent one, and the client active.
func (ss *Session) Start(route *routing.Route) {
	ss.requests.Add(1)
	if ss.lastRoute.Load() != route {
		ss.lastRoute.Store(route)
	}
	ss.SetPhase(PhaseActive)
}

// Undo takes back Start for a request that is to be started over: the
// count is one less and the client idle.
func (ss *Session) Undo() {
	ss.requests.Add(^uint64(0))
	ss.SetPhase(PhaseIdle)
}

// Requests returns how many requests the client has forwarded.
func (ss *Session) Requests() uint64 { return ss.requests.Load() }

// LastRoute returns the route of the client's most recent request, or nil.
func (ss *Session) LastRoute() *routing.Route { return ss.lastRoute.Load() }

// State returns what SHOW CLIENTS says of the client.
func (ss *Session) State() State { return State(ss.state.Load()) }

// LoadBalanced reports whether the client's hello said loadBalanced.
func (ss *Session) LoadBalanced() bool { return ss.lbMode.Load() }

// SetHelloInfo records the application name and the load-balanced mode
// the client's first hello gave.
func (ss *Session) SetHelloInfo(name string, loadBalanced bool) {
	ss.Mu.Lock()
	defer ss.Mu.Unlock()
	ss.appName = name
	ss.lbMode.Store(loadBalanced)
}

// SetUser records who the client logged in as, for SHOW CLIENTS.
func (ss *Session) SetUser(user string) {
	ss.Mu.Lock()
	defer ss.Mu.Unlock()
	ss.user = user
}

// Info is what SHOW CLIENTS shows of a session besides its state and
// request count.
type Info struct {
	AppName      string
	User         string
	LoadBalanced bool
	// PinnedServer is the address of a server the client holds a pinned
	// connection to, "" for none.
	PinnedServer string
}

// Describe returns the session's Info.
func (ss *Session) Describe() Info {
	ss.Mu.Lock()
	defer ss.Mu.Unlock()
	in := Info{AppName: ss.appName, User: ss.user, LoadBalanced: ss.lbMode.Load()}
	for _, p := range ss.pins {
		if p.Conn != nil {
			in.PinnedServer = p.Srv.Address()
			break
		}
	}
	return in
}

// Phase returns where the client's request is. Only the owner, which alone
// writes the phase, may call it.
func (ss *Session) Phase() Phase { return ss.phase }

// SetPhase moves the client's request to p. Only the owner calls it.
func (ss *Session) SetPhase(p Phase) {
	ss.Mu.Lock()
	defer ss.Mu.Unlock()
	ss.setPhaseLocked(p)
}

// setPhaseLocked is the one place a client's phase changes.
func (ss *Session) setPhaseLocked(p Phase) {
	ss.phase = p
	ss.stateLocked()
}

// stateLocked sets the SHOW CLIENTS state from the phase and the pins.
func (ss *Session) stateLocked() {
	st := StateIdle
	switch ss.phase {
	case PhaseWaiting:
		st = StateWaiting
	case PhaseActive, PhaseReplying:
		st = StateActive
	default:
		if ss.hasPinLocked() {
			st = StatePinned
		}
	}
	if State(ss.state.Load()) != st {
		ss.state.Store(uint32(st))
	}
}

// busyLocked reports whether the client's request holds or waits for a
// connection: its pins are then not others' to release.
func (ss *Session) busyLocked() bool {
	return ss.phase == PhaseWaiting || ss.phase == PhaseActive
}

// Busy reports whether the client has a request in flight, a transaction
// open, or a load-balanced cursor a drain waits for.
func (ss *Session) Busy() bool {
	ss.Mu.Lock()
	defer ss.Mu.Unlock()
	return ss.phase != PhaseIdle || len(ss.open) > 0 || len(ss.lbCursors) > 0
}
