package proxy

// The request state machine: every decision a forwarded request needs,
// written once for the two drivers that do its I/O, relay.go (a goroutine
// per client, blocking calls) and loop_client_linux.go (the event loop,
// non-blocking calls and callbacks).
//
//	begin ─► target ─► checkOut ─► checkedOut ─► (send) ─► onReply ─► release ─► (write) ─► end
//	                               │                      │
//	                               └──────► fail ◄────────┘ (the failure exit)
//
// A driver calls these steps in this order and does nothing else that
// changes the request's state: the client's phase (busy, SHOW CLIENTS
// state) changes only in setPhase, called from here.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/routing"
	"github.com/mongobouncer/mongobouncer/internal/session"
	"github.com/mongobouncer/mongobouncer/internal/topology"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// exchange is the forwarded request of one client (at most one at a time).
// It is owned by whoever serves the client: its goroutine, or the loop
// thread holding the client's ownMu.
type exchange struct {
	// s, sess and login are what the exchange uses of its client: the
	// server, the session (pins, transactions, phase) and the login (a
	// pass-through route's pool); id names the client in logs.
	s     *Server
	sess  *session.Session
	login *login
	id    int64
	req   command.Request // the parsed command
	// body is the command document the request carries.
	body bsoncore.Document
	// route, srv and pc are where the request goes; pinned says pc is the
	// client's pin. need is the server affinity requires, if any.
	route  *routing.Route
	srv    *topology.Server
	need   *topology.Server
	pc     *pool.Conn
	pinned bool
	// pool is the pool the request checks out from: srv's, or on a
	// pass-through route its user's (poolFor).
	pool  *pool.Pool
	key   command.TxnKey
	inTxn bool
	// killIDs are the cursors of a killCursors on a multi-server route.
	killIDs []int64
	// addRP says to add the route's default $readPreference to the
	// command (see criteria).
	addRP bool
	// reqID is the client's requestID; replies counts upstream replies
	// relayed; retried is set once a cleared pool's checkout was retried.
	reqID   int32
	replies int
	retried bool
	// Accounting for the Observer.
	start    time.Duration
	bytesIn  int
	bytesOut int
	ok       bool
}

// routeOf chooses the route of a request: a dedicated listener's route,
// the route an open transaction began on (commitTransaction and
// abortTransaction name admin, which may be routed elsewhere or nowhere),
// or the route of its database. nil means no route serves it.
func (s *Server) routeOf(only string, req *command.Request) *routing.Route {
	if only != "" {
		return s.Route(only)
	}
	if key, inTxn := req.Key(); inTxn && !req.StartTxn {
		if r := s.txnRoute(key); r != nil {
			return r
		}
	}
	return s.routeFor(req.DB)
}

// begin starts forwarding the parsed request (x.req, whose command is
// body) of msgLen bytes to route: prepare, then started.
func (x *exchange) begin(route *routing.Route, body bsoncore.Document, msgLen int, reqID int32) {
	x.prepare(route, body, msgLen, reqID)
	x.started()
}

// prepare sets the exchange up for the parsed request (x.req) of msgLen
// bytes to route, recording nothing about it yet: the loop prepares, asks
// target whether it can serve the request without blocking, and only then
// starts it (or forgets it, and the goroutine begins it again).
func (x *exchange) prepare(route *routing.Route, body bsoncore.Document, msgLen int, reqID int32) {
	x.body = body
	x.route, x.srv, x.need, x.pc, x.pinned, x.pool = route, nil, nil, nil, false, nil
	x.key, x.inTxn = x.req.Key()
	x.killIDs, x.addRP = nil, false
	if x.req.Info.Kind == command.KillCursors && (route.Multi() || x.sess.LoadBalanced()) {
		x.killIDs = command.CursorIDs(body)
	}
	x.reqID, x.replies, x.retried = reqID, 0, false
	x.start = monoNow()
	x.bytesIn, x.bytesOut, x.ok = msgLen, 0, false
}

// started records that the prepared request began: it counts, its route
// is the client's latest, and the client is active.
func (x *exchange) started() {
	x.sess.Start(x.route)
}

// forget drops a prepared request that never started.
func (x *exchange) forget() {
	x.route, x.srv, x.need, x.pc, x.pinned = nil, nil, nil, nil, false
}

// targetKind is what target decided.
type targetKind uint8

const (
	// targetCheckOut: check a connection out of x.srv's pool (checkOut).
	targetCheckOut targetKind = iota
	// targetPin: the request uses the client's pin, x.pc.
	targetPin
	// targetGoroutine: only the goroutine driver can go on (wait false).
	targetGoroutine
)

// target decides where the request goes. The server affinity needs (the
// one of a cursor or a transaction), else the one the read preference
// selects, is needed; the client's pin for the route serves the request
// when it is on that server; else the needed server, or the one selection
// picks, is checked out from, once the route lets requests through (its
// pause) and unless a reload replaced the route meanwhile. x.addRP says
// to add the route's default read preference to the command.
//
// wait says the driver may block: the goroutine's selection waits up to
// server_selection_timeout, and it waits at the route's pause. The loop
// must not block: with wait false the decision is the same, but wherever
// only the goroutine can go on (no server is selectable now, an invalid
// read preference to answer, a command to rewrite, a pinned client, a
// paused route) target answers targetGoroutine, having changed nothing of
// the client's, and never an error. An error fails the request.
func (x *exchange) target(wait bool) (targetKind, error) {
	route := x.route
	need := x.affinity()
	crit, addRP, err := criteria(route, &x.req, x.body)
	if err != nil || (addRP && !wait) {
		if !wait {
			return targetGoroutine, nil
		}
		return 0, err
	}
	x.addRP = addRP
	if need == nil && crit.ReadPref != nil {
		// The server the read preference chose is needed as affinity's
		// would be: a pin elsewhere (session mode) is not used for it.
		if need, err = x.selectServer(crit, wait); need == nil {
			return targetGoroutine, err
		}
	}
	if x.usePin(need, wait) {
		if !wait {
			return targetGoroutine, nil
		}
		return targetPin, nil
	}
	srv := need
	if srv == nil {
		if srv, err = x.selectServer(crit, wait); srv == nil {
			return targetGoroutine, err
		}
	}
	x.srv = srv
	if !wait {
		if route.Paused() {
			return targetGoroutine, nil
		}
		return targetCheckOut, nil
	}
	if !route.WaitGate(x.s.stopping) {
		return 0, errShuttingDown
	}
	if x.s.Route(route.Name) != route {
		// A reload replaced or removed the route while the request waited
		// at its pause (and carried the pause over): the driver's retry
		// takes the route now configured.
		return 0, errRouteReplaced
	}
	return targetCheckOut, nil
}

// selectServer picks a server of the route that meets crit. With wait it
// waits for one up to server_selection_timeout (an error then); without,
// it returns nil at once when none meets crit now.
func (x *exchange) selectServer(crit topology.Criteria, wait bool) (*topology.Server, error) {
	if !wait {
		return x.route.Topology.TrySelectServer(crit), nil
	}
	return x.route.Topology.SelectServer(context.Background(), crit)
}

// affinity returns the server that must serve the request (the one that
// owns its cursor or its transaction), or nil. Only a route with several
// servers keeps affinity: with one, everything goes to it anyway.
func (x *exchange) affinity() *topology.Server {
	route, req := x.route, &x.req
	var srv *topology.Server
	switch {
	case req.Info.Kind == command.GetMore:
		srv = route.CursorServer(req.CursorID)
	case req.Info.Kind == command.KillCursors && len(x.killIDs) > 0:
		// Drivers kill one cursor per command; several would all belong to
		// the server of the first, as they come from one cursor's namespace.
		srv = route.CursorServer(x.killIDs[0])
	case x.inTxn && !req.StartTxn:
		srv = route.TxnServer(x.key)
	}
	if srv != nil {
		// A server that left the topology and came back is a new Server
		// with a new pool, and still holds the cursor or transaction: follow
		// its address, not the closed pool of the Server that left.
		if cur := route.Topology.ServerByAddress(srv.Address()); cur != nil {
			srv = cur
		}
	}
	return srv
}

// usePin reports whether the client has a pinned connection for the route
// on the server the request needs (need, any when nil); with take, it
// takes it for the request.
func (x *exchange) usePin(need *topology.Server, take bool) bool {
	x.need = need
	p, ok := x.sess.Pinned(x.route)
	ok = ok && (need == nil || need == p.Srv)
	if ok && take {
		x.srv, x.pc, x.pinned = p.Srv, p.Conn, true
		x.holding()
	}
	return ok
}

// holding records what holding the request's connection begins: a
// transaction started by this request.
func (x *exchange) holding() {
	if x.inTxn && x.req.StartTxn {
		x.s.beginTxn(x.sess, x.route, x.srv, x.key)
	}
}

// checkedOut takes the result of a checkout from x.srv's pool. retry says
// to check out once more: the pool was cleared and is ready again already
// (a graceful reconnect, or a heartbeat that followed at once), which
// spares the client an error. Otherwise a nil error means the request
// holds pc, pinned to the client when the pool mode says so.
func (x *exchange) checkedOut(pc *pool.Conn, err error) (retry bool, _ error) {
	route, srv := x.route, x.srv
	if err != nil && !x.retried && clearedAndReady(err, x.pool) {
		x.retried = true
		return true, nil
	}
	if err == nil && pc.Upstream().AwaitsStray(x.reqID) {
		// A late reply to an earlier moreToCome request with this very ID
		// (clients reuse low IDs) may still come on pc, and would pass for
		// this request's: pc is closed, and the checkout tried again.
		pc.MarkErrored(errAmbiguousRequestID)
		_ = pc.Pool().CheckIn(pc)
		return true, nil
	}
	if x.sess.Phase() != session.PhaseActive {
		x.sess.SetPhase(session.PhaseActive)
	}
	if err != nil {
		if x.pool != nil {
			srv.HandlePoolError(x.pool, err, nil)
		}
		if route.PassThrough {
			x.login.passThroughFailed(x.s, err)
		}
		return false, err
	}
	route.Hold()
	x.pc = pc
	mode := route.PoolMode()
	pinNow := mode == ModeSession || (mode == ModeTransaction && (x.req.StartTxn || (x.inTxn && x.sess.HasOpen(route))))
	if pinNow && (x.need == nil || !route.Multi() || !x.sess.PinnedElsewhere(route, srv)) {
		x.sess.SetPin(route, srv, pc)
		x.pinned = true
	}
	x.holding()
	return false, nil
}

// checkOut asks the request's pool (poolFor: srv's, or on a pass-through
// route its user's) for a connection. One that can be had at once, or an
// error that fails the checkout at once, is returned; otherwise the
// checkout queues (pool.CheckOutFunc) and done later receives its result,
// which the driver hands to checkedOut. Only then is the client waiting:
// SHOW CLIENTS says "waiting" while a request waits for a connection, and
// not for a checkout that a free connection serves at once, whichever
// driver serves the request.
func (x *exchange) checkOut(done func(*pool.Conn, error)) (pc *pool.Conn, queued bool, err error) {
	p, err := x.login.poolFor(x.s, x.route, x.srv)
	if err != nil {
		return nil, false, err
	}
	x.pool = p
	pc, queued, err = p.CheckOutFunc(done)
	if queued {
		x.sess.SetPhase(session.PhaseWaiting)
	}
	return pc, queued, err
}

// errAmbiguousRequestID closes a connection on which a request's ID could
// be answered by a late reply to an earlier moreToCome request.
var errAmbiguousRequestID = errors.New("a reply to an earlier moreToCome request with the same ID may still come")

// undo takes back a request the loop began but cannot serve after all (its
// upstream connection cannot be used without a goroutine): the connection
// goes back, and the goroutine starts the request over.
func (x *exchange) undo() {
	x.route.CheckIn(x.pc)
	x.pc = nil
	x.sess.Undo()
	x.route, x.srv = nil, nil
}

// stray reports whether reply, before the request's own, answers an
// earlier moreToCome request on the connection (an upstream that answers
// those, and late): the driver drops it and reads on.
func (x *exchange) stray(reply []byte) bool {
	if x.replies > 0 || len(reply) < wire.HeaderLen {
		return false
	}
	to := int32(binary.LittleEndian.Uint32(reply[8:]))
	return to != x.reqID && x.pc.Upstream().Stray(to)
}

// onReply checks one whole upstream reply (extra bytes arrived behind it)
// and records what it says. stream says more replies follow (an exhaust
// stream). An error means the reply must not be relayed and nothing more on
// the connection can be trusted: the driver takes the failure exit.
func (x *exchange) onReply(reply []byte, extra int) (stream bool, _ error) {
	addr := x.srv.Address()
	// Only the first reply answers the request; the rest of a stream
	// answer the reply before them.
	if err := wire.CheckReply(reply, addr, x.reqID, x.replies == 0); err != nil {
		return false, fmt.Errorf("%w: %w", errUpstreamProtocol, err)
	}
	flags, body := wire.ReplyView(reply)
	stream = flags&wire.FlagMoreToCome != 0
	switch {
	case stream && !x.req.Exhaust:
		// A server must not stream to a request that did not allow it; the
		// rest of its stream would be unread bytes on the connection.
		return false, fmt.Errorf("%w: upstream %s sent moreToCome to a request without exhaustAllowed", errUpstreamProtocol, addr)
	case !stream && extra > 0 && x.req.Exhaust:
		return false, fmt.Errorf("%w: upstream %s sent more after the last reply of an exhaust stream", errUpstreamProtocol, addr)
	case !stream && extra > 0:
		// Those bytes would answer the next request on this connection.
		return false, fmt.Errorf("%w: upstream %s sent more than one reply to a request without exhaustAllowed", errUpstreamProtocol, addr)
	}
	x.replies++
	ri := command.InspectReply(body)
	x.ok = ri.OK
	if !ri.OK && ri.Code != 0 {
		x.s.opts.Observer.UpstreamError(x.route.Name, ri.Code)
	}
	if ri.Overloaded {
		// Passed through unchanged (drivers back off and retry it); the
		// pool's adaptive limit counts it as a drop.
		x.pc.MarkOverloaded()
	}
	if code := ri.StateChange(); code != 0 {
		// The server is stepping down, recovering or shutting down: SDAM's
		// application error rules (mark it Unknown, check it now, clear its
		// pool when they say so). The reply itself goes to the client,
		// whose driver retries it; the retry waits for a new primary.
		x.srv.HandlePoolError(x.pc.Pool(), stateChangeError(code, body), x.pc)
		// The client's driver must not take a member's state for
		// mongobouncer's: shutdown codes softened, the member's
		// topologyVersion replaced by ours (hello.go).
		softened := command.SoftenShutdown(body)
		stamped := x.s.topo.Restamp(body)
		if (softened || stamped) && flags&wire.FlagChecksumPresent != 0 {
			wire.UpdateChecksum(reply)
		}
	}
	x.track(ri)
	return stream, nil
}

// track updates cursor and transaction affinity from one reply.
func (x *exchange) track(ri command.Reply) {
	route, req := x.route, &x.req
	x.sess.NoteLBCursor(req, ri, x.killIDs)
	switch {
	case req.Info.Kind == command.GetMore && ri.CursorID == 0:
		route.ForgetCursor(req.CursorID)
	case req.Info.Kind == command.KillCursors:
		for _, id := range x.killIDs {
			route.ForgetCursor(id)
		}
	case ri.CursorID != 0 && req.Info.Kind != command.GetMore:
		route.SetCursorServer(ri.CursorID, x.srv)
	}
	if !x.inTxn {
		return
	}
	switch {
	case req.Info.Kind == command.Commit || req.Info.Kind == command.Abort:
		route.ForgetTxn(x.key)
		x.s.endTxn(x.key, x.sess)
	case !ri.OK:
		// The server aborts a transaction on a command error. Keep the
		// server affinity (the driver will still send abortTransaction)
		// but free the connection.
		x.s.endTxn(x.key, x.sess)
	}
}

// release ends the request's use of its connection once the whole reply is
// in hand: the connection goes back to its pool unless it stays pinned (a
// transaction-mode pin is dropped once no transaction holds it), and can
// serve someone else while the reply goes to this client.
func (x *exchange) release() {
	route, pc := x.route, x.pc
	pinned := x.pinned
	x.pc = nil
	if !x.sess.Replying(route, pc, pinned) {
		route.CheckIn(pc)
	}
}

// fail is the failure exit: the request could not reach the upstream, or
// its connection failed or cannot be trusted. A connection it holds is
// closed (marked errored, never pooled or kept pinned) and its server hears
// of the error (it may clear its pool); a transaction that never started
// is forgotten. It returns the retryable error reply for the client (nil
// for a moreToCome request, which gets none).
func (x *exchange) fail(err error) bsoncore.Document {
	if pc := x.pc; pc != nil {
		pc.MarkErrored(err)
		if !errors.Is(err, errUpstreamProtocol) && !errors.Is(err, upstream.ErrBadReply) {
			// A reply that breaks the protocol condemns its connection,
			// not the server: the others stay pooled, the server usable.
			x.srv.HandlePoolError(pc.Pool(), err, pc)
		}
		x.s.log.Warn("upstream error", "route", x.route.Name, "server", x.srv.Address(), "client", x.id, "error", err)
		x.dropConn()
	}
	if x.replies == 0 && x.inTxn && x.req.StartTxn {
		// No reply will say the transaction began; left open it would keep
		// the client's transaction-mode pins and hold Shutdown's drain. (If
		// the command did reach the server, it expires there.)
		x.s.endTxn(x.key, x.sess)
	}
	x.ok = false
	if x.req.More {
		// The client reads no reply, so no error code is reported either.
		return nil
	}
	if x.login.pending(x.s) {
		// admit forwards nothing of a client that has not logged in; were
		// anything to fail for one, what the upstream said (the route's
		// service user, its hosts) stays in the log.
		if x.s.log != nil {
			x.s.log.Warn("upstream error for a client that has not logged in", "route", x.route.Name, "client", x.id, "error", err)
		}
		return command.ErrorReply(command.CodeHostUnreachable, "HostUnreachable", "mongobouncer: no upstream is available before login")
	}
	return x.s.upstreamError(x.route, err, &x.req, x.inTxn)
}

// abandon closes the connection of a stream whose client is gone: unread
// replies follow, so it is never pooled, nor kept pinned (the abort of an
// open transaction at disconnect would read them).
func (x *exchange) abandon(err error) {
	x.pc.MarkErrored(err)
	x.dropConn()
}

// dropConn unpins and checks in the request's connection, which the caller
// has marked errored so that the pool closes it.
func (x *exchange) dropConn() {
	pc := x.pc
	x.pc = nil
	x.sess.UnpinReplying(x.route, pc)
	x.route.CheckIn(pc)
}

// end finishes the request once its reply (or error reply) was written, or
// it failed: the Observer hears of it, transaction-mode pins whose
// transaction ended while it ran (committed through another client, which
// leaves a busy client's pins alone) go back, and the client is idle or
// pinned.
func (x *exchange) end() {
	if x.route == nil {
		return
	}
	session.CheckIn(x.sess.Idle())
	name := x.req.Info.Name
	if !x.req.Info.Known {
		name = "other" // bounded label cardinality
	}
	x.s.opts.Observer.Request(x.route.Name, name, x.bytesIn, x.bytesOut, monoNow()-x.start, x.ok)
	x.route, x.srv, x.need = nil, nil, nil
}
