package proxy

// The loop driver of the request state machine (exchange.go): what the
// event loop (internal/evloop) does with a client it owns. It reads a
// request, lets the exchange decide, checks a connection out (queued as a
// pool.CheckOutFunc when none is free), sends the request, frames the
// reply as it arrives (wire.NextMessage) and writes it to the client. The
// moving of bytes is the engine's; loopClient is the client's endpoint
// there and the evloop.Handler the engine calls back. Every function here
// holds the endpoint's Mu, and th is the loop thread it runs on (nil off
// the loop threads).
//
// One request on the loop, its bytes passed along as parameters:
//
//	RequestReceived ─► serveOne ─► request(th, msg) ─► checkOut(th, msg) ─► send(th, msg, u) ─► evloop SendRequest
//	ReplyReceived ─► replied(th, f.Msg) ─► [evloop SendReply | write(msg)] ─► after ─► serveOne
//
// Ownership: a client belongs either to its goroutine or to the loop, as
// the endpoint's State says, and only the owner reads its socket. A
// client in the loop has no goroutine and no net.Conn in Go's netpoller:
// its socket is a descriptor of its own, so that readiness wakes only the
// loop. Upstream connections stay the pool's: the loop borrows their
// sockets through syscall.RawConn and registers each with the engine once
// (pooled sockets are out of Go's netpoller: upstream.Options.Detach). A
// Close calls evloop.Upstream.UpstreamClosed, so a request waiting for a
// reply on a connection the pool interrupts hears of it.

import (
	"encoding/binary"
	"syscall"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/evloop"
	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// loopClient is a client's endpoint in the event loop and what the loop
// does with it. Everything here is guarded by the endpoint's Mu: the loop
// threads, the client's goroutine (at the hand-overs only), the idle
// sweeper and Server.Close take it before they act on the client.
type loopClient struct {
	evloop.Endpoint
	c *client
	// off is set when the loop cannot take this client (no descriptor).
	off bool
	// lingered is set once the client's socket was handed to
	// Server.flush (linger_linux.go).
	lingered bool
	// lastActive (monoNow) is when the last request ended, for the idle timeout.
	lastActive time.Duration
	// serving is set while serve runs; again asks it to run once more
	// (serve).
	serving, again bool
	// unsent is set while the request in flight is still at the front of
	// the window (lsWaiting).
	unsent bool
	// deliver is the request's pool.CheckOutFunc callback, made once.
	deliver func(*pool.Conn, error)
	// buf is the reply as it arrives (lsUpstream).
	buf *buffer
}

// init prepares a new client's loop state.
func (lc *loopClient) init(c *client) {
	lc.c = c
	lc.Init(lc)
}

// enter hands an idle client from its goroutine to the loop. When it
// returns true the loop owns the client and the goroutine must return
// without touching it.
func (lc *loopClient) enter() (entered bool) {
	c := lc.c
	// A TLS client never: the loop reads and writes the raw socket. Nor
	// a client in the middle of logging in (login.due).
	if lc.off || c.tlsConn != nil || c.sess.HasPinOrOpen() || c.login.due() {
		return false
	}
	l := c.s.loopsFor()
	if l == nil {
		return false
	}
	lc.Mu.Lock()
	defer lc.Mu.Unlock()
	// Close disconnects the clients after setting closing, each under
	// ownMu: a client that enters the loop before is disconnected there,
	// one that would enter after stays with its goroutine, which finds its
	// connection closed.
	if lc.State != lsGoroutine || c.s.closing.Load() {
		return false
	}
	if !lc.Registered() {
		if err := l.AttachConn(&lc.Endpoint, c.nc); err != nil {
			lc.off = true
			return false
		}
	}
	// Out of Go's netpoller: readiness now wakes the loop only.
	_ = c.nc.Close()
	c.nc = nil
	c.deadline = false
	lc.lastActive = monoNow()
	c.login.clock.PartAt = 0 // a message the goroutine read whole
	lc.Enter()
	// The loop owns the client from here: a panic serving it is the loop's
	// to recover (recover_linux.go), and the goroutine returns all the same.
	entered = true
	defer lc.Recover()
	// Bytes may have come before the hand-over, and their edge has passed.
	lc.serve(nil)
	return true
}

// toGoroutine gives the client back to a goroutine, which handles what is
// in the window with the goroutine code.
func (lc *loopClient) toGoroutine() {
	c := lc.c
	nc, err := lc.Conn()
	if err != nil {
		c.log.Warn("cannot give client back to a goroutine", "error", err)
		lc.close()
		return
	}
	c.nc = nc
	lc.State = lsGoroutine
	go c.run()
}

// serve serves the whole message at the front of the window, on the loop
// or on a goroutine, or waits for the rest of it. State lsIdle.
//
// A request can end within the call that began it (an error reply, or a
// reply that was already there), and its end serves the next request:
// that call comes back here, where it only asks the outermost call to go
// on. Pipelined requests are thus served by iteration; by recursion, a
// client could grow the loop thread's stack without bound.
func (lc *loopClient) serve(th evloop.Thread) {
	if lc.serving {
		lc.again = true
		return
	}
	lc.serving = true
	for {
		lc.again = false
		lc.serveOne(th)
		if !lc.again || lc.State != lsIdle {
			break
		}
	}
	lc.serving = false
}

// serveOne is one round of serve.
func (lc *loopClient) serveOne(th evloop.Thread) {
	c := lc.c
	if pending := lc.Win.Pending(); len(pending) > 0 {
		n, err := wire.MessageLength(pending, c.login.readLimit(c.s, c.maxMsg))
		if err != nil || n > len(lc.Win.Buf) {
			// Malformed, or larger than the window: the goroutine answers
			// the error, or reads the rest.
			lc.toGoroutine()
			return
		}
		if len(pending) >= n {
			c.login.clock.PartAt = 0
			if !lc.request(th, pending[:n]) {
				lc.toGoroutine()
			}
			return
		}
	}
	// A message begun must be whole within client_login_timeout (sweepIdle).
	c.login.clock.NotePartial(lc.Win.Len(), monoNow())
	lc.RecvRequest(th)
}

// RequestReceived takes more of the client's next request, or the end of
// its connection (evloop.Handler). State lsIdle.
func (lc *loopClient) RequestReceived(th evloop.Thread, err error) {
	if err != nil {
		lc.close()
		return
	}
	lc.serve(th)
}

// request serves msg on the loop when it is a request the loop handles and
// a server is selectable now; otherwise it returns false having changed
// nothing. State lsIdle.
func (lc *loopClient) request(th evloop.Thread, msg []byte) bool {
	c := lc.c
	if wire.OpCode(int32(binary.LittleEndian.Uint32(msg[12:]))) != wire.OpMsg {
		return false
	}
	if err := wire.ParseMsgInto(msg, &c.msg); err != nil {
		return false
	}
	x := &c.x
	req := &x.req
	req.Inspect(c.msg.Body)
	route := c.s.routeOf(c.only, req)
	if c.s.admit(c.login.Ident, &c.sess, len(msg), c.msg.Flags, req, route).kind != admitLoop {
		// Refusals and answers are the goroutine's, which asks admit
		// again.
		return false
	}
	x.prepare(route, c.msg.Body, len(msg), int32(binary.LittleEndian.Uint32(msg[4:])))
	if t, _ := x.target(false); t != targetCheckOut {
		x.forget()
		return false
	}
	// The request is the loop's from here on.
	x.started()
	panicPoint("loop-request", req)
	lc.unsent = true
	lc.State = lsWaiting
	lc.checkOut(th, msg)
	panicPoint("loop-sent", req)
	return true
}

// checkOut checks a connection out for the request msg, or queues the
// request in the pool until one is free (msg stays at the front of the
// window meanwhile: unsentRequest). State lsWaiting.
func (lc *loopClient) checkOut(th evloop.Thread, msg []byte) {
	if lc.deliver == nil {
		lc.deliver = lc.delivered
	}
	pc, queued, err := lc.c.x.checkOut(lc.deliver)
	if queued {
		return
	}
	lc.checkedOut(th, msg, pc, err)
}

// unsentRequest is the request of a queued checkout, still at the front
// of the window.
func (lc *loopClient) unsentRequest() []byte {
	return lc.Win.Pending()[:lc.c.x.bytesIn]
}

// delivered is the CheckOutFunc callback of a queued request: under the
// pool's lock, it only posts the result to a loop thread.
func (lc *loopClient) delivered(pc *pool.Conn, err error) {
	if l := lc.c.s.loopsPtr.Load(); l != nil && l.Post(&lc.Endpoint, pc, err) {
		return
	}
	// The loops have stopped (the server is closing): finish on a
	// goroutine, which must not run under the pool's lock.
	go lc.Resume(nil, pc, err)
}

// Resumed continues a request whose queued checkout ended (evloop.Handler;
// v is the *pool.Conn). While it waits (lsWaiting) nothing but this ends
// the request, so the state is still lsWaiting here.
func (lc *loopClient) Resumed(th evloop.Thread, v any, err error) {
	pc, _ := v.(*pool.Conn)
	if lc.State == lsClosed {
		// The client was closed while its checkout waited (a panic,
		// recover_linux.go): the connection goes back unused.
		if pc != nil {
			_ = pc.Pool().CheckIn(pc)
		}
		return
	}
	if th == nil && lc.c.s.loopsPtr.Load() == nil {
		// No loop thread would receive the reply.
		lc.abandon(pc)
		return
	}
	lc.checkedOut(th, lc.unsentRequest(), pc, err)
}

// abandon ends the request of a client whose loops have stopped (Close
// ran out of time with it in flight): no thread will receive its reply, so
// its connection (pc, when a queued checkout delivers one) is closed rather
// than pooled, and the client is disconnected.
func (lc *loopClient) abandon(pc *pool.Conn) {
	switch lc.State {
	case lsUpstream:
		lc.EndReply()
		lc.c.x.abandon(evloop.ErrStopped)
	case lsWaiting:
		if pc != nil {
			pc.MarkErrored(evloop.ErrStopped)
			_ = pc.Pool().CheckIn(pc)
		}
		lc.unsent = false
	default:
		return
	}
	lc.close()
}

// checkedOut sends the request msg on the connection it was given, or
// answers the checkout's error.
func (lc *loopClient) checkedOut(th evloop.Thread, msg []byte, pc *pool.Conn, err error) {
	c := lc.c
	x := &c.x
	retry, err := x.checkedOut(pc, err)
	if retry {
		lc.checkOut(th, msg)
		return
	}
	if err != nil {
		lc.errorReply(th, x.fail(err))
		return
	}
	u, never := c.s.loopUpFor(pc.Upstream())
	if u == nil {
		// The request is still in the window; it starts over on a goroutine.
		// When the loop can never use this upstream's sockets (TLS,
		// compression), the route's requests stay on goroutines; a
		// failure of this one socket (closed by the pool meanwhile, no
		// descriptor left to duplicate) concerns this request only.
		if never {
			x.route.SetNoLoop()
		}
		x.undo()
		lc.unsent = false
		lc.State = lsIdle
		lc.toGoroutine()
		return
	}
	lc.send(th, msg, u)
}

// send writes the request msg (at the front of the window, which stays
// untouched until the reply comes) to the connection's socket, then waits
// for the reply.
func (lc *loopClient) send(th evloop.Thread, msg []byte, u *evloop.Upstream) {
	lc.Win.Consume(len(msg))
	lc.unsent = false
	if lc.buf == nil {
		lc.buf = getBuffer(16 * 1024)
		lc.buf.b = lc.buf.b[:0]
	}
	lc.Endpoint.SendRequest(th, u, msg, freeEnd(lc.buf.b))
}

// freeEnd is the room after b's bytes.
func freeEnd(b []byte) []byte { return b[len(b):cap(b)] }

// ReplyReceived takes n more bytes of the reply (evloop.Handler), and
// relays the reply once it is whole. State lsUpstream.
func (lc *loopClient) ReplyReceived(th evloop.Thread, n int) {
	x := &lc.c.x
	uc := x.pc.Upstream()
	b := lc.buf.b[:len(lc.buf.b)+n]
	f, err := wire.NextMessage(b, uc.MaxMessageSize())
	for err == nil && f.Msg != nil && x.stray(f.Msg) {
		b = b[:copy(b, b[f.Need:])]
		f, err = wire.NextMessage(b, uc.MaxMessageSize())
	}
	if err != nil {
		lc.buf.b = b[:0]
		lc.Failed(th, "read", err)
		return
	}
	if f.Msg == nil {
		// Room for a header more than the reply, so that a reply the
		// upstream sent behind it unasked is seen now (f.Extra, which
		// fails the request and drops the connection), not by the next
		// request on the connection.
		lc.buf.b = wire.GrowMessage(b, f.Need+wire.HeaderLen)
		lc.RecvReply(th, freeEnd(lc.buf.b))
		return
	}
	lc.buf.b = b[:0]
	lc.replied(th, f)
}

// replied relays the whole reply f.Msg.
func (lc *loopClient) replied(th evloop.Thread, f wire.Framed) {
	c := lc.c
	x := &c.x
	panicPoint("loop-reply", &x.req)
	if _, err := x.onReply(f.Msg, f.Extra); err != nil {
		lc.fail(th, err)
		return
	}
	lc.EndReply()
	x.release()
	// Not once the server drains: a reply sent with the next receive is
	// not known to have left, and the drain waits for the reply's write.
	if !c.s.draining.Load() && lc.SendReply(th, f.Msg) {
		// The reply and the next receive are the engine's.
		x.bytesOut += len(f.Msg)
		lc.account()
		return
	}
	if !lc.write(f.Msg) {
		return
	}
	lc.after(th)
}

// Failed takes the failure exit for the request out on the connection, in
// op (evloop.Handler). State lsUpstream.
func (lc *loopClient) Failed(th evloop.Thread, op string, err error) {
	lc.buf.b = lc.buf.b[:0]
	lc.fail(th, lc.c.x.pc.Upstream().IOError(op, err))
}

// fail takes the failure exit for the request out on the connection.
func (lc *loopClient) fail(th evloop.Thread, err error) {
	lc.EndReply()
	lc.errorReply(th, lc.c.x.fail(err))
}

// errorReply answers the request with an error reply body; the client
// stays connected.
func (lc *loopClient) errorReply(th evloop.Thread, body []byte) {
	c := lc.c
	if lc.unsent {
		lc.Win.Consume(c.x.bytesIn)
		lc.unsent = false
	}
	out := getBuffer(len(body) + 64)
	msg := c.appendReply(out.b[:0], c.x.reqID, 0, body)
	ok := lc.write(msg)
	putBuffer(out)
	if ok {
		lc.after(th)
	}
}

// after finishes a request whose reply was written, then serves what the
// client sent meanwhile.
func (lc *loopClient) after(th evloop.Thread) {
	lc.account()
	lc.serve(th)
}

// account ends the request in the exchange and drops its reply buffer; the
// client is idle.
func (lc *loopClient) account() {
	c := lc.c
	if c.x.route != nil {
		lc.lastActive = monoNow()
	}
	c.x.end()
	putBuffer(lc.buf)
	lc.buf = nil
	if lc.State != lsClosed {
		lc.State = lsIdle
	}
}

// write writes msg to the client. A client that does not read never
// blocks the loop: what the socket does not take goes to a goroutine, which
// writes it and serves the client from then on. It returns false when the
// loop no longer owns the client.
func (lc *loopClient) write(msg []byte) bool {
	c := lc.c
	n, err := lc.Write(msg)
	if err != nil && err != syscall.EAGAIN {
		// A failed write(2) wrote nothing.
		lc.close()
		return false
	}
	c.x.bytesOut += len(msg) // written now, or by the goroutine below
	if n == len(msg) {
		return true
	}
	rest := getBuffer(len(msg) - n)
	copy(rest.b, msg[n:])
	putBuffer(lc.buf)
	lc.buf = nil
	nc, ferr := lc.Conn()
	if ferr != nil {
		putBuffer(rest)
		lc.close()
		return false
	}
	c.nc = nc
	lc.State = lsGoroutine
	go func() {
		defer c.recoverGoroutine()
		_, werr := nc.Write(rest.b)
		putBuffer(rest)
		// The request ends with its reply written: until then its phase
		// holds Shutdown's drain, which would otherwise cut the reply short.
		c.x.end()
		if werr != nil {
			c.finish(errClientGone)
			return
		}
		c.run()
	}()
	return false
}

// close finishes a loop-owned client.
func (lc *loopClient) close() {
	lc.State = lsClosed
	lc.account()
	lc.c.finishOwned(errClientGone)
}

// forget drops the loop's registration and descriptor of the client; its
// replies are let out when the server is closing.
func (lc *loopClient) forget() { lc.Close(lc.c.s.closing.Load()) }

// disconnect closes the client from outside (Server.Close): a loop-owned
// idle client is finished at once; otherwise its owner notices the closed
// socket.
func (c *client) disconnect() {
	lc := &c.lc
	lc.Mu.Lock()
	defer lc.Mu.Unlock()
	switch lc.State {
	case lsIdle:
		lc.close()
	case lsUpstream, lsWaiting:
		// The reply's write fails once the descriptor is shut down.
		lc.Shutdown()
	case lsGoroutine:
		c.lingerOnClose()
		if c.nc != nil {
			_ = c.nc.Close()
		}
	}
}

// loopUpFor returns the loop's registration of uc, registering it at its
// first use, or nil when the loop cannot use it: never is set when it
// never can on this route (no raw socket: TLS, compression), not when
// only this connection failed (closed meanwhile, a failed dup).
func (s *Server) loopUpFor(uc pool.Upstream) (_ *evloop.Upstream, never bool) {
	if a, ok := uc.Attachment().(*evloop.Upstream); ok {
		return a, false
	}
	rc, ok := uc.RawConn()
	if !ok {
		return nil, true
	}
	l := s.loopsPtr.Load()
	if l == nil {
		return nil, false
	}
	lu, err := l.AttachUpstream(rc)
	if err != nil {
		return nil, false
	}
	uc.SetAttachment(lu)
	// A Close that ran between the Control above and SetAttachment found
	// no attachment to tell, and the registration (on io_uring, a
	// duplicate descriptor) would outlive the connection: the socket is
	// closed by then, which a second Control sees. Told twice (when Close
	// saw the attachment too), UpstreamClosed does nothing the second time.
	if rc.Control(func(uintptr) {}) != nil {
		lu.UpstreamClosed()
	}
	return lu, false
}
