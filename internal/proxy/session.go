package proxy

// Session state: what a client keeps across requests. Its pinned upstream
// connections (session mode, and transaction mode while a transaction is
// open), the transactions it began (tracked across client connections,
// since drivers pin a transaction's server, not its connection), and the
// clean-up when it disconnects: open transactions aborted upstream, pinned
// connections given back.

import (
	"context"
	"sync"
	"sync/atomic"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/routing"
	"github.com/mongobouncer/mongobouncer/internal/topology"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// session is what a client keeps across requests, and what other clients
// and the server's admin and drain read of it. sessMu guards every field;
// the client's owner (its goroutine, or the loop thread holding its
// endpoint's Mu) writes them under it. See doc.go for the lock order: a
// session's sessMu comes after its client's endpoint Mu, and no other
// session's is taken under it. The methods whose names end in Locked hold
// sessMu; no other lock is meant by that suffix.
type session struct {
	sessMu sync.Mutex
	// appName is the client's application name from its handshake.
	appName string
	// user is the login's "user@db", for SHOW CLIENTS.
	user string
	// pins holds at most one pinned connection per route.
	pins []pin
	// open are the transactions begun through this client that have not
	// ended; they are aborted if the client disconnects.
	open map[command.TxnKey]*routing.Route
	// lbCursors are the cursors a load-balanced client opened here and has
	// not finished: a drain waits for them (lbcursor.go).
	lbCursors map[int64]struct{}
	// lbMode is set by the client's first hello when it says loadBalanced
	// (written once under sessMu, read by whoever serves the client
	// without it).
	lbMode atomic.Bool
	// phase is where the client's request is: written by the owner under
	// sessMu (setPhaseLocked), read by the owner freely and by others under
	// sessMu.
	phase phase
	// state is a clientState, written by setPhaseLocked, read by SHOW
	// CLIENTS from other goroutines without the lock.
	state atomic.Uint32
	// requests counts the client's forwarded requests (SHOW CLIENTS), and
	// lastRoute is the route of the most recent one, whose
	// client_idle_timeout applies to the client (idleTimeout): atomics,
	// written by the owner, read by others without the lock.
	requests  atomic.Uint64
	lastRoute atomic.Pointer[routing.Route]
}

// useRoute records route as the client's most recent one.
func (ss *session) useRoute(route *routing.Route) {
	if ss.lastRoute.Load() != route {
		ss.lastRoute.Store(route)
	}
}

// setHelloInfo records the application name and the load-balanced mode
// the client's first hello gave, for SHOW CLIENTS.
func (ss *session) setHelloInfo(name string, loadBalanced bool) {
	ss.sessMu.Lock()
	defer ss.sessMu.Unlock()
	ss.appName = name
	ss.lbMode.Store(loadBalanced)
}

// setUser records who the client logged in as, for SHOW CLIENTS.
func (ss *session) setUser(user string) {
	ss.sessMu.Lock()
	defer ss.sessMu.Unlock()
	ss.user = user
}

// pin is an upstream connection a client keeps across requests: in session
// mode for its whole life, in transaction mode while it has a transaction
// open on that route.
type pin struct {
	route *routing.Route
	srv   *topology.Server
	conn  *pool.Conn
}

func (ss *session) pinLocked(route *routing.Route) *pin {
	for i := range ss.pins {
		if ss.pins[i].route == route {
			return &ss.pins[i]
		}
	}
	return nil
}

func (ss *session) pinServer(route *routing.Route) *topology.Server {
	ss.sessMu.Lock()
	defer ss.sessMu.Unlock()
	if p := ss.pinLocked(route); p != nil && p.conn != nil {
		return p.srv
	}
	return nil
}

// setPin pins pc, of srv, to the client for route.
func (ss *session) setPin(route *routing.Route, srv *topology.Server, pc *pool.Conn) {
	ss.sessMu.Lock()
	defer ss.sessMu.Unlock()
	ss.setPinLocked(route, srv, pc)
}

func (ss *session) setPinLocked(route *routing.Route, srv *topology.Server, pc *pool.Conn) {
	if p := ss.pinLocked(route); p != nil {
		p.srv, p.conn = srv, pc
		return
	}
	ss.pins = append(ss.pins, pin{route: route, srv: srv, conn: pc})
}

func (ss *session) hasOpen(route *routing.Route) bool {
	ss.sessMu.Lock()
	defer ss.sessMu.Unlock()
	return ss.hasOpenLocked(route)
}

func (ss *session) hasOpenLocked(route *routing.Route) bool {
	for _, r := range ss.open {
		if r == route {
			return true
		}
	}
	return false
}

// hasPinLocked reports whether the client holds any pinned connection.
func (ss *session) hasPinLocked() bool {
	for _, p := range ss.pins {
		if p.conn != nil {
			return true
		}
	}
	return false
}

// beginTxn records a transaction begun through session ss.
func (s *Server) beginTxn(ss *session, route *routing.Route, srv *topology.Server, key command.TxnKey) {
	ss.setOpen(key, route)
	route.SetTxnServer(key, srv)
	s.setTxnOwner(key, ss)
}

// setOpen records transaction key open on route.
func (ss *session) setOpen(key command.TxnKey, route *routing.Route) {
	ss.sessMu.Lock()
	defer ss.sessMu.Unlock()
	if ss.open == nil {
		ss.open = make(map[command.TxnKey]*routing.Route)
	}
	ss.open[key] = route
}

// setTxnOwner notes which client began a transaction, so that a commit that
// arrives on another client connection (drivers pin the server, not the
// connection) can release the first client's pinned connection.
func (s *Server) setTxnOwner(key command.TxnKey, ss *session) {
	s.txnMu.Lock()
	if s.txnOwners == nil {
		s.txnOwners = make(map[command.TxnKey]*session)
	}
	s.txnOwners[key] = ss
	s.txnMu.Unlock()
}

// txnRoute returns the route an open transaction began on, or nil.
func (s *Server) txnRoute(key command.TxnKey) *routing.Route {
	s.txnMu.Lock()
	owner := s.txnOwners[key]
	s.txnMu.Unlock()
	if owner == nil {
		return nil
	}
	owner.sessMu.Lock()
	defer owner.sessMu.Unlock()
	return owner.open[key]
}

// endTxn ends a transaction wherever it was begun.
func (s *Server) endTxn(key command.TxnKey, by *session) {
	s.txnMu.Lock()
	owner := s.txnOwners[key]
	delete(s.txnOwners, key)
	s.txnMu.Unlock()
	if owner == nil {
		owner = by
	}
	owner.txnEnded(key)
}

// txnEnded forgets an open transaction; if no transaction holds this
// client's transaction-mode pin and the client is idle, the connection goes
// back to the pool now rather than at the client's next request.
func (ss *session) txnEnded(key command.TxnKey) {
	if back := ss.forgetTxn(key); back.conn != nil {
		back.route.CheckIn(back.conn)
	}
}

// forgetTxn is txnEnded's part under sessMu: it returns the pin to give
// back, if any.
func (ss *session) forgetTxn(key command.TxnKey) (back pin) {
	ss.sessMu.Lock()
	defer ss.sessMu.Unlock()
	route, ok := ss.open[key]
	if !ok {
		return pin{}
	}
	delete(ss.open, key)
	if !ss.busyLocked() && route.PoolMode() != ModeSession && !ss.hasOpenLocked(route) {
		if p := ss.pinLocked(route); p != nil && p.conn != nil {
			back = *p
			p.conn = nil
			ss.stateLocked() // pinned no more, perhaps
		}
	}
	return back
}

// cleanup runs when the client disconnects: open transactions are aborted
// upstream, then pinned connections go back to their pools.
func (c *client) cleanup() {
	for key, route := range c.sess.takeOpen() {
		c.abort(route, key)
		c.s.txnMu.Lock()
		if c.s.txnOwners[key] == &c.sess {
			delete(c.s.txnOwners, key)
		}
		c.s.txnMu.Unlock()
		route.ForgetTxn(key)
	}
	for _, p := range c.sess.takePins() {
		if p.conn != nil {
			p.route.CheckIn(p.conn)
		}
	}
}

// takeOpen takes the client's open transactions, for cleanup.
func (ss *session) takeOpen() map[command.TxnKey]*routing.Route {
	ss.sessMu.Lock()
	defer ss.sessMu.Unlock()
	open := ss.open
	ss.open = nil
	return open
}

// takePins takes the client's pins, for cleanup.
func (ss *session) takePins() []pin {
	ss.sessMu.Lock()
	defer ss.sessMu.Unlock()
	pins := ss.pins
	ss.pins = nil
	return pins
}

// abort sends abortTransaction for a transaction the client left open, on
// its pinned connection if it has one, else on a connection to the server
// that runs it.
func (c *client) abort(route *routing.Route, key command.TxnKey) {
	ctx, cancel := context.WithTimeout(context.Background(), c.s.opts.CommandTimeout)
	defer cancel()
	var srv *topology.Server
	var pc *pool.Conn
	pinned := false
	if p, ok := c.sess.pinned(route); ok {
		srv, pc, pinned = p.srv, p.conn, true
	}
	if pc == nil {
		srv = route.TxnServer(key)
		if srv == nil {
			s, err := route.Topology.SelectServer(ctx, topology.Criteria{})
			if err != nil {
				c.log.Warn("cannot abort transaction of disconnected client", "route", route.Name, "error", err)
				return
			}
			srv = s
		}
		// As the client's user: the transaction is that user's upstream.
		p, err := c.login.poolFor(c.s, route, srv)
		if err == nil {
			pc, err = route.CheckOut(ctx, p)
		}
		if err != nil {
			c.log.Warn("cannot abort transaction of disconnected client", "route", route.Name, "server", srv.Address(), "error", err)
			return
		}
	}
	_, err := pc.Upstream().RoundTrip(ctx, "admin", abortCommand(key))
	if err != nil && upstream.IsNetworkError(err) {
		pc.MarkErrored(err)
	}
	if err != nil && upstream.IsNetworkError(err) {
		// The transaction stays open upstream until it expires there.
		c.log.Warn("cannot abort transaction of disconnected client", "route", route.Name, "server", srv.Address(), "error", err)
	} else {
		c.log.Debug("aborted transaction of disconnected client", "route", route.Name, "server", srv.Address(), "error", err)
	}
	if !pinned {
		route.CheckIn(pc)
	}
}

// pinned returns the client's pin for route, if it holds a connection.
func (ss *session) pinned(route *routing.Route) (pin, bool) {
	ss.sessMu.Lock()
	defer ss.sessMu.Unlock()
	if p := ss.pinLocked(route); p != nil && p.conn != nil {
		return *p, true
	}
	return pin{}, false
}

// abortCommand builds {abortTransaction: 1, lsid: {id}, txnNumber, autocommit: false}.
func abortCommand(key command.TxnKey) bsoncore.Document {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendInt32Element(d, "abortTransaction", 1)
	lidx, d2 := bsoncore.AppendDocumentElementStart(d, "lsid")
	d2 = bsoncore.AppendBinaryElement(d2, "id", 4, key.LSID[:])
	d, _ = bsoncore.AppendDocumentEnd(d2, lidx)
	d = bsoncore.AppendInt64Element(d, "txnNumber", key.Txn)
	d = bsoncore.AppendBooleanElement(d, "autocommit", false)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// isOpen reports whether the client has transaction key open.
func (ss *session) isOpen(key command.TxnKey) bool {
	ss.sessMu.Lock()
	defer ss.sessMu.Unlock()
	_, ok := ss.open[key]
	return ok
}

// dropStalePins returns the pinned connections of routes a reload replaced
// or removed, unless a transaction still needs them, so that the old
// route's pools can drain and close; the client's next request on that
// database uses the new route.
func (c *client) dropStalePins() {
	checkInPins(c.sess.takeStalePins(c.s))
}

// takeStalePins is dropStalePins's part under sessMu: the pins of routes
// s no longer serves as they were.
func (ss *session) takeStalePins(s *Server) []pin {
	ss.sessMu.Lock()
	defer ss.sessMu.Unlock()
	return ss.takePinsLocked(func(p *pin) bool { return s.Route(p.route.Name) != p.route })
}

// takePinsLocked unpins and returns the pinned connections of routes with
// no transaction open for which drop says so; the caller checks them in
// (checkInPins) once it has released ss.sessMu.
func (ss *session) takePinsLocked(drop func(*pin) bool) []pin {
	var back []pin
	for i := range ss.pins {
		if p := &ss.pins[i]; p.conn != nil && !ss.hasOpenLocked(p.route) && drop(p) {
			back = append(back, *p)
			p.conn = nil
		}
	}
	return back
}

// checkInPins gives connections taken by takePinsLocked back to their pools.
func checkInPins(back []pin) {
	for _, p := range back {
		p.route.CheckIn(p.conn)
	}
}

// hasPinOrOpen reports whether the client holds a pinned connection or has
// a transaction open: such a client stays on its goroutine.
func (ss *session) hasPinOrOpen() bool {
	ss.sessMu.Lock()
	defer ss.sessMu.Unlock()
	return ss.hasPinLocked() || len(ss.open) > 0
}
