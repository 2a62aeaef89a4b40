package proxy

// Session state: what a client keeps across requests. Its pinned upstream
// connections (session mode, and transaction mode while a transaction is
// open), the transactions it began (tracked across client connections,
// since drivers pin a transaction's server, not its connection), and the
// clean-up when it disconnects: open transactions aborted upstream, pinned
// connections given back.

import (
	"context"
	"time"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/topology"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// pin is an upstream connection a client keeps across requests: in session
// mode for its whole life, in transaction mode while it has a transaction
// open on that route.
type pin struct {
	route *Route
	srv   *topology.Server
	conn  *pool.Conn
}

func (c *client) pinLocked(route *Route) *pin {
	for i := range c.pins {
		if c.pins[i].route == route {
			return &c.pins[i]
		}
	}
	return nil
}

func (c *client) pinServer(route *Route) *topology.Server {
	c.sessMu.Lock()
	defer c.sessMu.Unlock()
	if p := c.pinLocked(route); p != nil && p.conn != nil {
		return p.srv
	}
	return nil
}

// setPin pins pc, of srv, to the client for route.
func (c *client) setPin(route *Route, srv *topology.Server, pc *pool.Conn) {
	c.sessMu.Lock()
	defer c.sessMu.Unlock()
	c.setPinLocked(route, srv, pc)
}

func (c *client) setPinLocked(route *Route, srv *topology.Server, pc *pool.Conn) {
	if p := c.pinLocked(route); p != nil {
		p.srv, p.conn = srv, pc
		return
	}
	c.pins = append(c.pins, pin{route: route, srv: srv, conn: pc})
}

func (c *client) hasOpen(route *Route) bool {
	c.sessMu.Lock()
	defer c.sessMu.Unlock()
	return c.hasOpenLocked(route)
}

func (c *client) hasOpenLocked(route *Route) bool {
	for _, r := range c.open {
		if r == route {
			return true
		}
	}
	return false
}

// hasPinLocked reports whether the client holds any pinned connection.
func (c *client) hasPinLocked() bool {
	for _, p := range c.pins {
		if p.conn != nil {
			return true
		}
	}
	return false
}

// beginTxn records a transaction begun through this client.
func (c *client) beginTxn(route *Route, srv *topology.Server, key txnKey) {
	c.setOpen(key, route)
	if route.multi() {
		route.txns.put(key, srv, time.Now())
	}
	c.s.setTxnOwner(key, c)
}

// setOpen records transaction key open on route.
func (c *client) setOpen(key txnKey, route *Route) {
	c.sessMu.Lock()
	defer c.sessMu.Unlock()
	if c.open == nil {
		c.open = make(map[txnKey]*Route)
	}
	c.open[key] = route
}

// setTxnOwner notes which client began a transaction, so that a commit that
// arrives on another client connection (drivers pin the server, not the
// connection) can release the first client's pinned connection.
func (s *Server) setTxnOwner(key txnKey, c *client) {
	s.txnMu.Lock()
	if s.txnOwners == nil {
		s.txnOwners = make(map[txnKey]*client)
	}
	s.txnOwners[key] = c
	s.txnMu.Unlock()
}

// txnRoute returns the route an open transaction began on, or nil.
func (s *Server) txnRoute(key txnKey) *Route {
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
func (s *Server) endTxn(key txnKey, by *client) {
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
func (c *client) txnEnded(key txnKey) {
	if back := c.forgetTxn(key); back.conn != nil {
		back.route.checkIn(back.conn)
	}
}

// forgetTxn is txnEnded's part under sessMu: it returns the pin to give
// back, if any.
func (c *client) forgetTxn(key txnKey) (back pin) {
	c.sessMu.Lock()
	defer c.sessMu.Unlock()
	route, ok := c.open[key]
	if !ok {
		return pin{}
	}
	delete(c.open, key)
	if !c.busyLocked() && route.PoolMode() != ModeSession && !c.hasOpenLocked(route) {
		if p := c.pinLocked(route); p != nil && p.conn != nil {
			back = *p
			p.conn = nil
			c.stateLocked() // pinned no more, perhaps
		}
	}
	return back
}

// cleanup runs when the client disconnects: open transactions are aborted
// upstream, then pinned connections go back to their pools.
func (c *client) cleanup() {
	for key, route := range c.takeOpen() {
		c.abort(route, key)
		c.s.txnMu.Lock()
		if c.s.txnOwners[key] == c {
			delete(c.s.txnOwners, key)
		}
		c.s.txnMu.Unlock()
		if route.multi() {
			route.txns.delete(key)
		}
	}
	for _, p := range c.takePins() {
		if p.conn != nil {
			p.route.checkIn(p.conn)
		}
	}
}

// takeOpen takes the client's open transactions, for cleanup.
func (c *client) takeOpen() map[txnKey]*Route {
	c.sessMu.Lock()
	defer c.sessMu.Unlock()
	open := c.open
	c.open = nil
	return open
}

// takePins takes the client's pins, for cleanup.
func (c *client) takePins() []pin {
	c.sessMu.Lock()
	defer c.sessMu.Unlock()
	pins := c.pins
	c.pins = nil
	return pins
}

// abort sends abortTransaction for a transaction the client left open, on
// its pinned connection if it has one, else on a connection to the server
// that runs it.
func (c *client) abort(route *Route, key txnKey) {
	ctx, cancel := context.WithTimeout(context.Background(), c.s.opts.CommandTimeout)
	defer cancel()
	var srv *topology.Server
	var pc *pool.Conn
	pinned := false
	if p, ok := c.pinned(route); ok {
		srv, pc, pinned = p.srv, p.conn, true
	}
	if pc == nil {
		if route.multi() {
			srv, _ = route.txns.get(key, time.Now())
		}
		if srv == nil {
			s, err := route.Topology.SelectServer(ctx, topology.Criteria{})
			if err != nil {
				c.log.Warn("cannot abort transaction of disconnected client", "route", route.Name, "error", err)
				return
			}
			srv = s
		}
		// As the client's user: the transaction is that user's upstream.
		p, err := c.poolFor(route, srv)
		if err == nil {
			pc, err = route.checkOut(ctx, p)
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
		route.checkIn(pc)
	}
}

// pinned returns the client's pin for route, if it holds a connection.
func (c *client) pinned(route *Route) (pin, bool) {
	c.sessMu.Lock()
	defer c.sessMu.Unlock()
	if p := c.pinLocked(route); p != nil && p.conn != nil {
		return *p, true
	}
	return pin{}, false
}

// abortCommand builds {abortTransaction: 1, lsid: {id}, txnNumber, autocommit: false}.
func abortCommand(key txnKey) bsoncore.Document {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendInt32Element(d, "abortTransaction", 1)
	lidx, d2 := bsoncore.AppendDocumentElementStart(d, "lsid")
	d2 = bsoncore.AppendBinaryElement(d2, "id", 4, key.lsid[:])
	d, _ = bsoncore.AppendDocumentEnd(d2, lidx)
	d = bsoncore.AppendInt64Element(d, "txnNumber", key.txn)
	d = bsoncore.AppendBooleanElement(d, "autocommit", false)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// isOpen reports whether the client has transaction key open.
func (c *client) isOpen(key txnKey) bool {
	c.sessMu.Lock()
	defer c.sessMu.Unlock()
	_, ok := c.open[key]
	return ok
}

// dropStalePins returns the pinned connections of routes a reload replaced
// or removed, unless a transaction still needs them, so that the old
// route's pools can drain and close; the client's next request on that
// database uses the new route.
func (c *client) dropStalePins() {
	checkInPins(c.takeStalePins())
}

// takeStalePins is dropStalePins's part under sessMu.
func (c *client) takeStalePins() []pin {
	c.sessMu.Lock()
	defer c.sessMu.Unlock()
	return c.takePinsLocked(func(p *pin) bool { return c.s.Route(p.route.Name) != p.route })
}

// takePinsLocked unpins and returns the pinned connections of routes with
// no transaction open for which drop says so; the caller checks them in
// (checkInPins) once it has released c.sessMu.
func (c *client) takePinsLocked(drop func(*pin) bool) []pin {
	var back []pin
	for i := range c.pins {
		if p := &c.pins[i]; p.conn != nil && !c.hasOpenLocked(p.route) && drop(p) {
			back = append(back, *p)
			p.conn = nil
		}
	}
	return back
}

// checkInPins gives connections taken by takePinsLocked back to their pools.
func checkInPins(back []pin) {
	for _, p := range back {
		p.route.checkIn(p.conn)
	}
}

// hasPinOrOpen reports whether the client holds a pinned connection or has
// a transaction open: such a client stays on its goroutine.
func (c *client) hasPinOrOpen() bool {
	c.sessMu.Lock()
	defer c.sessMu.Unlock()
	return c.hasPinLocked() || len(c.open) > 0
}
