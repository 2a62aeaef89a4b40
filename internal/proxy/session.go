package proxy

// Sessions across the server: the transactions a client began, tracked
// across client connections (drivers pin a transaction's server, not its
// connection), and a client's clean-up when it disconnects: open
// transactions aborted upstream, pinned connections given back. The
// session itself (pins, open transactions, phase) is internal/session's.

import (
	"context"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/routing"
	"github.com/mongobouncer/mongobouncer/internal/session"
	"github.com/mongobouncer/mongobouncer/internal/topology"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// beginTxn records a transaction begun through session ss.
func (s *Server) beginTxn(ss *session.Session, route *routing.Route, srv *topology.Server, key command.TxnKey) {
	ss.SetOpen(key, route)
	route.SetTxnServer(key, srv)
	s.setTxnOwner(key, ss)
}

// setTxnOwner notes which client began a transaction, so that a commit that
// arrives on another client connection (drivers pin the server, not the
// connection) can release the first client's pinned connection.
func (s *Server) setTxnOwner(key command.TxnKey, ss *session.Session) {
	s.txnMu.Lock()
	if s.txnOwners == nil {
		s.txnOwners = make(map[command.TxnKey]*session.Session)
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
	return owner.OpenRoute(key)
}

// endTxn ends a transaction wherever it was begun.
func (s *Server) endTxn(key command.TxnKey, by *session.Session) {
	s.txnMu.Lock()
	owner := s.txnOwners[key]
	delete(s.txnOwners, key)
	s.txnMu.Unlock()
	if owner == nil {
		owner = by
	}
	owner.TxnEnded(key)
}

// cleanup runs when the client disconnects: open transactions are aborted
// upstream, then pinned connections go back to their pools.
func (c *client) cleanup() {
	for key, route := range c.sess.TakeOpen() {
		c.abort(route, key)
		c.s.txnMu.Lock()
		if c.s.txnOwners[key] == &c.sess {
			delete(c.s.txnOwners, key)
		}
		c.s.txnMu.Unlock()
		route.ForgetTxn(key)
	}
	session.CheckIn(c.sess.TakePins())
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
	if p, ok := c.sess.Pinned(route); ok {
		srv, pc, pinned = p.Srv, p.Conn, true
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

// dropStalePins returns the pinned connections of routes a reload replaced
// or removed, unless a transaction still needs them, so that the old
// route's pools can drain and close; the client's next request on that
// database uses the new route.
func (c *client) dropStalePins() {
	s := c.s
	session.CheckIn(c.sess.TakeStalePins(func(r *routing.Route) bool { return s.Route(r.Name) != r }))
}
