package proxy

// Routes: a database's (or a dedicated listener's) upstream topology, pool
// mode, limits and pause gate, as configuration and reloads set them.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/sdam"
	"github.com/mongobouncer/mongobouncer/internal/topology"
)

// Route sends the commands of one database (or of every database, for the
// "*" route) to one upstream deployment.
type Route struct {
	// Name is the database name, or "*" for the catch-all route.
	Name string
	// Mode is the pool mode the route starts with ("" is transaction);
	// SetPoolMode changes it live (PoolMode reads it). New refuses a mode
	// config does not define.
	Mode PoolMode
	// Topology holds the route's servers and their pools.
	Topology *topology.Topology
	// PassThrough makes the route log in upstream as each client's own
	// user (SCRAM pass-through, passthrough.go): requests check out from
	// their user's pool on each server. The topology must have user pools
	// (topology.Options.UserDialer), and clients must log in with SCRAM.
	PassThrough bool

	// cursors remembers which server opened a cursor, and txns which server
	// runs a transaction. They are used only when the route has more than
	// one server: with one, every command goes to it anyway.
	cursors *affinity[int64, *topology.Server]
	txns    *affinity[command.TxnKey, *topology.Server]

	// ReadPref is the route's default read preference (read_preference,
	// read_preference_tags, max_staleness): used for reads whose command
	// carries none. nil means primary. rpElem is it as the $readPreference
	// element added to those commands.
	ReadPref *sdam.ReadPref
	rpElem   []byte

	// IdleTimeout and MaxMessageSize are the client limits the route
	// starts with; SetClientLimits changes them live. IdleTimeout closes a
	// client idle that long after a request to this route (or, on the
	// route's own listener, from its connection); 0 means the Server's
	// ClientIdleTimeout, negative means never. MaxMessageSize bounds the
	// requests sent to this route; 0 means the Server's MaxMessageSize.
	IdleTimeout    time.Duration
	MaxMessageSize int

	mode   atomic.Pointer[PoolMode] // Mode, live; nil before init
	idle   atomic.Int64             // IdleTimeout, live
	maxMsg atomic.Int64             // MaxMessageSize, live
	// held counts upstream connections checked out through this route and
	// not yet back in a pool (requests in flight and pins), so that a route
	// removed by a reload can drain before its pools close.
	held atomic.Int64
	// noLoop is set once the event loop finds it cannot use this route's
	// upstream connections (TLS, compression): its requests stay on
	// goroutines without a checkout to find out again.
	noLoop atomic.Bool

	gateMu sync.Mutex // guards gate
	// gate is non-nil while the route is paused; Resume closes it.
	gate chan struct{}
}

// init prepares a route for use; routes already initialised are left alone,
// so a reload can hand unchanged routes back.
func (r *Route) init(maxCursors, maxTxns int) {
	if r.cursors != nil {
		return
	}
	r.cursors = newAffinity[int64, *topology.Server](maxCursors, 30*time.Minute)
	r.txns = newAffinity[command.TxnKey, *topology.Server](maxTxns, 30*time.Minute)
	if r.ReadPref != nil && r.ReadPref.Mode == sdam.Primary {
		r.ReadPref = nil
	}
	if elem, err := readPrefDocument(r.ReadPref); err == nil {
		r.rpElem = elem
	} else {
		// Validated with the configuration; never here.
		r.ReadPref = nil
	}
	m := poolMode(r.Mode)
	r.mode.Store(&m)
	r.idle.Store(int64(r.IdleTimeout))
	r.maxMsg.Store(int64(r.MaxMessageSize))
}

// multi reports whether the route's deployment has, or may have, several
// servers: only then do cursors and transactions keep affinity.
func (r *Route) multi() bool { return r.Topology.Multi() }

// PoolMode returns the route's current pool mode.
func (r *Route) PoolMode() PoolMode {
	if m := r.mode.Load(); m != nil {
		return *m
	}
	return poolMode(r.Mode) // a route that New has not seen (tests)
}

// SetPoolMode changes the pool mode for requests from now on; connections
// already pinned stay pinned until their pin would end in the new mode.
// "" is transaction; a mode config does not define changes nothing (config
// validated it).
func (r *Route) SetPoolMode(m PoolMode) {
	m = poolMode(m)
	if m.Valid() {
		r.mode.Store(&m)
	}
}

// SetClientLimits changes the route's IdleTimeout and MaxMessageSize from
// now on (same meanings): idle clients are measured against the new
// timeout at once, and requests read from now on against the new size
// (a dedicated listener's clients connected before keep the size they
// started with as the bound on what is read).
func (r *Route) SetClientLimits(idleTimeout time.Duration, maxMessageSize int) {
	r.idle.Store(int64(idleTimeout))
	r.maxMsg.Store(int64(maxMessageSize))
}

// Held returns the number of upstream connections clients hold through
// this route (in flight or pinned).
func (r *Route) Held() int64 { return r.held.Load() }

// Pause stops handing out upstream connections for this route: requests
// that need a new connection wait until Resume; requests in flight, and
// clients that already hold a pinned connection, carry on.
func (r *Route) Pause() {
	r.gateMu.Lock()
	if r.gate == nil {
		r.gate = make(chan struct{})
	}
	r.gateMu.Unlock()
}

// Resume lets waiting requests through.
func (r *Route) Resume() {
	r.gateMu.Lock()
	if r.gate != nil {
		close(r.gate)
		r.gate = nil
	}
	r.gateMu.Unlock()
}

// Paused reports whether the route is paused.
func (r *Route) Paused() bool {
	r.gateMu.Lock()
	defer r.gateMu.Unlock()
	return r.gate != nil
}

// errShuttingDown ends a wait at the pause gate when the server shuts down.
var errShuttingDown = errors.New("mongobouncer is shutting down")

// errRouteReplaced fails a request that waited at a paused route which a
// reload then replaced or removed.
var errRouteReplaced = errors.New("the route was reconfigured while the request waited at its pause")

// waitGate blocks while the route is paused, until Resume or shutdown.
func (r *Route) waitGate(stop <-chan struct{}) error {
	r.gateMu.Lock()
	g := r.gate
	r.gateMu.Unlock()
	if g == nil {
		return nil
	}
	select {
	case <-g:
		return nil
	case <-stop:
		return errShuttingDown
	}
}

// checkOut takes a connection from p (a server's pool, or a user's) on
// behalf of this route.
func (r *Route) checkOut(ctx context.Context, p *pool.Pool) (*pool.Conn, error) {
	pc, err := p.CheckOut(ctx)
	if err == nil {
		r.held.Add(1)
	}
	return pc, err
}

// checkIn returns a connection the route's request checked out to the
// pool it came from (its server's, or a user's).
func (r *Route) checkIn(pc *pool.Conn) {
	_ = pc.Pool().CheckIn(pc)
	r.held.Add(-1)
}

// routing is an immutable routing table; a reload swaps in a new one.
type routing struct {
	byName   map[string]*Route
	wildcard *Route
	all      []*Route
}

func newRouting(routes []*Route, maxCursors, maxTxns int) (*routing, error) {
	if len(routes) == 0 {
		return nil, errors.New("proxy: no routes")
	}
	t := &routing{byName: make(map[string]*Route, len(routes))}
	for _, r := range routes {
		if r == nil || r.Topology == nil {
			return nil, fmt.Errorf("proxy: route %q has no topology", routeName(r))
		}
		if _, dup := t.byName[r.Name]; dup || (r.Name == "*" && t.wildcard != nil) {
			return nil, fmt.Errorf("proxy: route %q is defined twice", r.Name)
		}
		if !poolMode(r.Mode).Valid() {
			return nil, fmt.Errorf("proxy: route %q: pool mode %q: must be one of session, transaction, statement", r.Name, r.Mode)
		}
		r.init(maxCursors, maxTxns)
		if r.Name == "*" {
			t.wildcard = r
		} else {
			t.byName[r.Name] = r
		}
		t.all = append(t.all, r)
	}
	return t, nil
}

func routeName(r *Route) string {
	if r == nil {
		return "<nil>"
	}
	return r.Name
}

// SetRoutes replaces the routing table (configuration reload). Routes that
// stay must be passed as the same *Route values; clients holding a removed
// route's connections keep them until they release them (see Route.Held).
func (s *Server) SetRoutes(routes []*Route) error {
	t, err := newRouting(routes, s.opts.MaxCursors, s.opts.MaxTransactions)
	if err != nil {
		return err
	}
	s.table.Store(t)
	return nil
}

// Routes returns the current routes.
func (s *Server) Routes() []*Route {
	return append([]*Route(nil), s.table.Load().all...)
}

// Route returns the route named name ("*" for the catch-all), or nil.
func (s *Server) Route(name string) *Route {
	t := s.table.Load()
	if name == "*" {
		return t.wildcard
	}
	return t.byName[name]
}

// routeFor finds the route of a database name given as bytes; the map
// lookup with a converted key does not allocate.
func (s *Server) routeFor(db []byte) *Route {
	t := s.table.Load()
	if r, ok := t.byName[string(db)]; ok {
		return r
	}
	return t.wildcard
}
