// Package routing holds where a database's commands go and on what terms:
// a Route is one database's (or one dedicated listener's) upstream
// deployment with its pool mode, client limits, pause gate, default read
// preference and the cursor and transaction affinity of a deployment of
// several servers; a Table finds the route of a database. The proxy serves
// clients over routes; app builds them from the configuration and changes
// them on reloads and admin commands.
//
// Locks: a Route's gateMu and each Affinity's mu are leaves (nothing is
// taken while one is held); every other field is immutable or atomic.
package routing

// Route: the settings configuration and reloads set, read live by every
// request, and the count of upstream connections held through it.

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/sdam"
	"github.com/mongobouncer/mongobouncer/internal/topology"
)

// affinityTTL is how long a cursor or transaction is remembered after its
// last command: a client that never ends one does not keep it for ever.
const affinityTTL = 30 * time.Minute

// Route sends the commands of one database (or of every database, for the
// "*" route) to one upstream deployment.
type Route struct {
	// Name is the database name, or "*" for the catch-all route.
	Name string
	// Mode is the pool mode the route starts with ("" is transaction);
	// SetPoolMode changes it live (PoolMode reads it). NewTable refuses a
	// mode config does not define.
	Mode config.PoolMode
	// Topology holds the route's servers and their pools.
	Topology *topology.Topology
	// PassThrough makes the route log in upstream as each client's own
	// user (SCRAM pass-through): requests check out from their user's pool
	// on each server. The topology must have user pools
	// (topology.Options.UserDialer), and clients must log in with SCRAM.
	PassThrough bool

	// cursors remembers which server opened a cursor, and txns which server
	// runs a transaction. They are used only when the route has more than
	// one server: with one, every command goes to it anyway. Set once, by
	// init; each guards itself.
	cursors *Affinity[int64, *topology.Server]
	txns    *Affinity[TxnKey, *topology.Server]

	// ReadPref is the route's default read preference (read_preference,
	// read_preference_tags, max_staleness): used for reads whose command
	// carries none. nil means primary. rpElem is it as the $readPreference
	// element added to those commands; set once, by init.
	ReadPref *sdam.ReadPref
	rpElem   []byte

	// IdleTimeout and MaxMessageSize are the client limits the route
	// starts with; SetClientLimits changes them live. IdleTimeout closes a
	// client idle that long after a request to this route (or, on the
	// route's own listener, from its connection); 0 means the proxy's
	// client_idle_timeout, negative means never. MaxMessageSize bounds the
	// requests sent to this route; 0 means the proxy's max_message_size.
	IdleTimeout    time.Duration
	MaxMessageSize int

	mode   atomic.Pointer[config.PoolMode] // Mode, live; nil before init
	idle   atomic.Int64                    // IdleTimeout, live
	maxMsg atomic.Int64                    // MaxMessageSize, live
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
	r.cursors = NewAffinity[int64, *topology.Server](maxCursors, affinityTTL)
	r.txns = NewAffinity[TxnKey, *topology.Server](maxTxns, affinityTTL)
	if r.ReadPref != nil && r.ReadPref.Mode == sdam.Primary {
		r.ReadPref = nil
	}
	if elem, err := readPrefElement(r.ReadPref); err == nil {
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

// poolMode is m with "" read as transaction, the default.
func poolMode(m config.PoolMode) config.PoolMode {
	if m == "" {
		return config.PoolModeTransaction
	}
	return m
}

// Multi reports whether the route's deployment has, or may have, several
// servers: only then do cursors and transactions keep affinity.
func (r *Route) Multi() bool { return r.Topology.Multi() }

// Cursors is the map of the cursors opened through the route to the
// server that holds each (affinity.go has what the proxy does with it),
// for those who inspect it.
func (r *Route) Cursors() *Affinity[int64, *topology.Server] { return r.cursors }

// PoolMode returns the route's current pool mode.
func (r *Route) PoolMode() config.PoolMode {
	if m := r.mode.Load(); m != nil {
		return *m
	}
	return poolMode(r.Mode) // a route no Table has taken (tests)
}

// SetPoolMode changes the pool mode for requests from now on; connections
// already pinned stay pinned until their pin would end in the new mode.
// "" is transaction; a mode config does not define changes nothing (config
// validated it).
func (r *Route) SetPoolMode(m config.PoolMode) {
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

// IdleLimit returns the live IdleTimeout.
func (r *Route) IdleLimit() time.Duration { return time.Duration(r.idle.Load()) }

// MessageLimit returns the live MaxMessageSize.
func (r *Route) MessageLimit() int { return int(r.maxMsg.Load()) }

// NoLoop reports whether the event loop found it cannot use the route's
// upstream connections; SetNoLoop records that it did.
func (r *Route) NoLoop() bool { return r.noLoop.Load() }

// SetNoLoop records that the event loop cannot use the route's upstream
// connections (TLS, compression), for good.
func (r *Route) SetNoLoop() { r.noLoop.Store(true) }

// DefaultReadPref returns the $readPreference element of the route's
// default read preference, to add to a read that carries none (nil when
// the default is primary).
func (r *Route) DefaultReadPref() []byte { return r.rpElem }

// Held returns the number of upstream connections clients hold through
// this route (in flight or pinned).
func (r *Route) Held() int64 { return r.held.Load() }

// CheckOut takes a connection from p (a server's pool, or a user's) on
// behalf of this route, counted in Held until CheckIn.
func (r *Route) CheckOut(ctx context.Context, p *pool.Pool) (*pool.Conn, error) {
	pc, err := p.CheckOut(ctx)
	if err == nil {
		r.held.Add(1)
	}
	return pc, err
}

// Hold counts in Held a connection checked out for the route otherwise
// than with CheckOut (a queued checkout); CheckIn gives it back.
func (r *Route) Hold() { r.held.Add(1) }

// CheckIn returns a connection checked out for this route to the pool it
// came from (its server's, or a user's).
func (r *Route) CheckIn(pc *pool.Conn) {
	_ = pc.Pool().CheckIn(pc)
	r.held.Add(-1)
}

// Pause stops handing out upstream connections for this route: requests
// that need a new connection wait until Resume; requests in flight, and
// clients that already hold a pinned connection, carry on.
func (r *Route) Pause() {
	r.gateMu.Lock()
	defer r.gateMu.Unlock()
	if r.gate == nil {
		r.gate = make(chan struct{})
	}
}

// Resume lets waiting requests through.
func (r *Route) Resume() {
	r.gateMu.Lock()
	defer r.gateMu.Unlock()
	if r.gate != nil {
		close(r.gate)
		r.gate = nil
	}
}

// Paused reports whether the route is paused.
func (r *Route) Paused() bool {
	r.gateMu.Lock()
	defer r.gateMu.Unlock()
	return r.gate != nil
}

// WaitGate blocks while the route is paused, until Resume (true) or until
// stop is closed (false).
func (r *Route) WaitGate(stop <-chan struct{}) bool {
	r.gateMu.Lock()
	g := r.gate
	r.gateMu.Unlock()
	if g == nil {
		return true
	}
	select {
	case <-g:
		return true
	case <-stop:
		return false
	}
}
