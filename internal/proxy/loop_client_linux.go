package proxy

// The loop driver of the request state machine (exchange.go): what the
// event loop does with a client it owns, whatever its I/O model. It reads
// a request, lets the exchange decide, checks a connection out (queued as
// a pool.CheckOutFunc when none is free), sends the request, frames the
// reply as it arrives (wire.NextMessage) and writes it to the client. The
// waiting is the driver's (loopDriver); every function here holds the
// client's ownMu, and th is the loop thread it runs on (nil off the loop).
//
// Ownership: a client belongs either to its goroutine or to the loop, as
// loopClient.state says, and only the owner reads its socket. A client in
// the loop has no goroutine and no net.Conn in Go's netpoller: its socket
// is a descriptor of its own, so that readiness wakes only the loop.
// Upstream connections stay the pool's: the loop borrows their sockets
// through syscall.RawConn and registers each with the driver once (pooled
// sockets are out of Go's netpoller: upstream.Options.Detach). A Close
// calls loopUp.UpstreamClosed, so a request waiting for a reply on a
// connection the pool interrupts hears of it.

import (
	"encoding/binary"
	"io"
	"net"
	"os"
	"syscall"

	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/sysconn"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// initLoop prepares a new client's loop state.
func (c *client) initLoop() {}

// enterLoop hands an idle client from its goroutine to the loop. When it
// returns true the loop owns the client and the goroutine must return
// without touching it.
func (c *client) enterLoop() (entered bool) {
	lc := &c.lc
	// A TLS client never: the loop reads and writes the raw socket. Nor
	// a client in the middle of logging in (loginDue).
	if lc.off || c.tlsConn != nil || c.hasPinOrOpen() || c.loginDue() {
		return false
	}
	l := c.s.loopsFor()
	if l == nil {
		return false
	}
	lc.ownMu.Lock()
	defer lc.ownMu.Unlock()
	// Close disconnects the clients after setting closing, each under
	// ownMu: a client that enters the loop before is disconnected there,
	// one that would enter after stays with its goroutine, which finds its
	// connection closed.
	if lc.state != lsGoroutine || c.s.closing.Load() {
		return false
	}
	if lc.sock == nil {
		fd, err := sysconn.Dup(c.nc)
		if err != nil {
			lc.off = true
			return false
		}
		sock, err := l.drv.attachClient(c, fd)
		if err != nil {
			_ = syscall.Close(fd)
			lc.off = true
			return false
		}
		lc.drv, lc.sock = l.drv, sock
	}
	lc.sock.entered()
	// Out of Go's netpoller: readiness now wakes the loop only.
	_ = c.nc.Close()
	c.nc = nil
	c.deadline = false
	lc.lastActive = monoNow()
	c.lt.partAt = 0 // a message the goroutine read whole
	lc.state = lsIdle
	// The loop owns the client from here: a panic serving it is the loop's
	// to recover (recover_linux.go), and the goroutine returns all the same.
	entered = true
	defer c.recoverOwned()
	// Bytes may have come before the hand-over, and their edge has passed.
	c.loopServe(nil)
	return true
}

// toGoroutine gives the client back to a goroutine, which handles what is
// in rbuf with the goroutine code.
func (c *client) toGoroutine() {
	lc := &c.lc
	nc, err := fileConn(lc.sock.fd())
	if err != nil {
		c.log.Warn("cannot give client back to a goroutine", "error", err)
		c.loopClose()
		return
	}
	c.nc = nc
	lc.state = lsGoroutine
	go c.run()
}

// fileConn makes a net.Conn (in Go's netpoller) of a duplicate of fd.
func fileConn(fd int) (net.Conn, error) {
	d, err := sysconn.DupFd(fd)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(d), "client")
	defer f.Close()
	return net.FileConn(f)
}

// drv returns the driver that waits for the client's bytes, nil once the
// loops stopped: nothing would receive them.
func (c *client) drv() loopDriver {
	if c.s.loopsPtr.Load() == nil {
		return nil
	}
	return c.lc.drv
}

// loopServe serves the whole message at the front of rbuf, on the loop or
// on a goroutine, or waits for the rest of it. State lsIdle.
//
// A request can end within the call that began it (an error reply, or a
// reply that was already there), and its end serves the next request:
// that call comes back here, where it only asks the outermost call to go
// on. Pipelined requests are thus served by iteration; by recursion, a
// client could grow the loop thread's stack without bound.
func (c *client) loopServe(th loopThread) {
	lc := &c.lc
	if lc.serving {
		lc.again = true
		return
	}
	lc.serving = true
	for {
		lc.again = false
		c.serveOne(th)
		if !lc.again || lc.state != lsIdle {
			break
		}
	}
	lc.serving = false
}

// serveOne is one round of loopServe.
func (c *client) serveOne(th loopThread) {
	if avail := c.rhi - c.rlo; avail > 0 {
		n, err := wire.MessageLength(c.rbuf[c.rlo:c.rhi], c.readLimit())
		if err != nil || n > len(c.rbuf) {
			// Malformed, or larger than the inline buffer: the goroutine
			// answers the error, or reads the rest.
			c.toGoroutine()
			return
		}
		if avail >= n {
			c.lt.partAt = 0
			if !c.loopRequest(th, c.rbuf[c.rlo:c.rlo+n]) {
				c.toGoroutine()
			}
			return
		}
	}
	if c.rlo > 0 {
		c.rhi = copy(c.rbuf[:], c.rbuf[c.rlo:c.rhi])
		c.rlo = 0
	}
	// A message begun must be whole within client_login_timeout (sweepIdle).
	c.loopNotePartial()
	d := c.drv()
	if d == nil {
		c.loopClose()
		return
	}
	d.recvClient(th, c)
}

// clientReceived takes n more bytes of the client's next request, or the
// end of its connection. State lsIdle.
func (c *client) clientReceived(th loopThread, n int, err error) {
	if err != nil || n <= 0 {
		c.loopClose()
		return
	}
	c.rhi += n
	c.loopServe(th)
}

// loopRequest serves msg on the loop when it is a request the loop handles
// and a server is selectable now; otherwise it returns false having
// changed nothing. State lsIdle.
func (c *client) loopRequest(th loopThread, msg []byte) bool {
	if wire.OpCode(int32(binary.LittleEndian.Uint32(msg[12:]))) != wire.OpMsg {
		return false
	}
	if err := wire.ParseMsgInto(msg, &c.msg); err != nil {
		return false
	}
	x := &c.x
	req := &x.req
	req.inspect(c.msg.Body)
	route := c.s.routeOf(c.only, req)
	if c.admit(len(msg), c.msg.Flags, req, route).kind != admitLoop {
		// Refusals and answers are the goroutine's, which asks admit
		// again.
		return false
	}
	x.prepare(route, len(msg), int32(binary.LittleEndian.Uint32(msg[4:])))
	if t, _ := x.target(false); t != targetCheckOut {
		x.forget()
		return false
	}
	// The request is the loop's from here on.
	x.started()
	panicPoint("loop-request", req)
	c.lc.unsent = true
	c.loopCheckOut(th)
	panicPoint("loop-sent", req)
	return true
}

// loopCheckOut checks a connection out for the request, or queues the
// request in the pool until one is free.
func (c *client) loopCheckOut(th loopThread) {
	lc := &c.lc
	if lc.deliver == nil {
		lc.deliver = c.loopDelivered
	}
	pc, queued, err := c.x.checkOut(lc.deliver)
	if queued {
		lc.state = lsWaiting
		return
	}
	c.loopCheckedOut(th, pc, err)
}

// loopDelivered is the CheckOutFunc callback of a queued request: under the
// pool's lock, it only posts the result to a loop thread.
func (c *client) loopDelivered(pc *pool.Conn, err error) {
	if l := c.s.loopsPtr.Load(); l != nil {
		l.post(readyItem{c: c, pc: pc, err: err})
		return
	}
	// The loops have stopped (the server is closing): finish on a
	// goroutine, which must not run under the pool's lock.
	go c.loopResume(nil, pc, err)
}

// loopResume continues a request whose queued checkout ended. While it
// waits (lsWaiting) nothing but this ends the request, so the state is
// still lsWaiting here.
func (c *client) loopResume(th loopThread, pc *pool.Conn, err error) {
	lc := &c.lc
	lc.ownMu.Lock()
	defer lc.ownMu.Unlock()
	defer c.recoverOwned()
	if lc.state == lsClosed {
		// The client was closed while its checkout waited (a panic,
		// recover_linux.go): the connection goes back unused.
		if pc != nil {
			_ = pc.Pool().CheckIn(pc)
		}
		return
	}
	if th == nil && c.s.loopsPtr.Load() == nil {
		// No loop thread would receive the reply.
		c.loopAbandon(pc)
		return
	}
	c.loopCheckedOut(th, pc, err)
}

// loopAbandon ends the request of a client whose loops have stopped (Close
// ran out of time with it in flight): no thread will receive its reply, so
// its connection (pc, when a queued checkout delivers one) is closed rather
// than pooled, and the client is disconnected.
func (c *client) loopAbandon(pc *pool.Conn) {
	lc := &c.lc
	x := &c.x
	switch lc.state {
	case lsUpstream:
		lc.up.owner.Store(nil)
		lc.up = nil
		x.abandon(errLoopStopped)
	case lsWaiting:
		if pc != nil {
			pc.MarkErrored(errLoopStopped)
			_ = pc.Pool().CheckIn(pc)
		}
		lc.unsent = false
	default:
		return
	}
	c.loopClose()
}

// loopCheckedOut sends the request on the connection it was given, or
// answers the checkout's error.
func (c *client) loopCheckedOut(th loopThread, pc *pool.Conn, err error) {
	x := &c.x
	retry, err := x.checkedOut(pc, err)
	if retry {
		c.loopCheckOut(th)
		return
	}
	if err != nil {
		c.loopErrorReply(th, x.fail(err))
		return
	}
	lu, never := c.s.loopUpFor(pc.Upstream())
	if lu == nil {
		// The request is still in rbuf; it starts over on a goroutine.
		// When the loop can never use this upstream's sockets (TLS,
		// compression), the route's requests stay on goroutines; a
		// failure of this one socket (closed by the pool meanwhile, no
		// descriptor left to duplicate) concerns this request only.
		if never {
			x.route.noLoop.Store(true)
		}
		x.undo()
		c.lc.unsent = false
		c.toGoroutine()
		return
	}
	c.loopSend(th, lu)
}

// loopSend writes the request (still at the front of rbuf) to the
// connection's socket, then waits for the reply.
func (c *client) loopSend(th loopThread, lu *loopUp) {
	lc := &c.lc
	x := &c.x
	msg := c.rbuf[c.rlo : c.rlo+x.bytesIn]
	c.consume(x.bytesIn)
	lc.unsent = false
	lc.up = lu
	lc.state = lsUpstream
	lu.owner.Store(c)
	if lc.buf == nil {
		lc.buf = getBuffer(16 * 1024)
		lc.buf.b = lc.buf.b[:0]
	}
	if c.drv() != nil && lu.drv.sendRequest(th, c, msg) {
		return
	}
	n, err := lu.drv.sendUpstream(lu, msg)
	if err == nil && n < len(msg) {
		// A small request that does not fit the socket's send buffer: the
		// upstream has stopped reading.
		err = syscall.EAGAIN
	}
	if err != nil {
		c.loopFail(th, lu.uc.IOError("write", err))
		return
	}
	if d := c.drv(); d != nil {
		d.recvReply(th, c)
	} else {
		c.loopFail(th, lu.uc.IOError("read", errLoopStopped))
	}
}

// consume drops n bytes, a request being handled, from the front of rbuf.
// The bytes stay where they are until the next read, so the request's
// slices remain valid.
func (c *client) consume(n int) {
	c.rlo += n
	if c.rlo == c.rhi {
		c.rlo, c.rhi = 0, 0
	}
}

// replyReceived takes n more bytes of the reply, or the connection's
// failure, and relays the reply once it is whole. State lsUpstream.
func (c *client) replyReceived(th loopThread, n int, err error) {
	lc := &c.lc
	lu := lc.up
	if err == nil && n <= 0 {
		err = io.EOF
	}
	if err != nil {
		lc.buf.b = lc.buf.b[:0]
		c.loopFail(th, lu.uc.IOError("read", err))
		return
	}
	b := lc.buf.b[:len(lc.buf.b)+n]
	f, err := wire.NextMessage(b, lu.uc.MaxMessageSize())
	for err == nil && f.Msg != nil && c.x.stray(f.Msg) {
		b = b[:copy(b, b[f.Need:])]
		f, err = wire.NextMessage(b, lu.uc.MaxMessageSize())
	}
	if err != nil {
		lc.buf.b = b[:0]
		c.loopFail(th, lu.uc.IOError("read", err))
		return
	}
	if f.Msg == nil {
		// Room for a header more than the reply, so that a reply the
		// upstream sent behind it unasked is seen now (f.Extra, which
		// fails the request and drops the connection), not by the next
		// request on the connection.
		lc.buf.b = wire.GrowMessage(b, f.Need+wire.HeaderLen)
		if d := c.drv(); d != nil {
			d.recvReply(th, c)
		} else {
			c.loopFail(th, lu.uc.IOError("read", errLoopStopped))
		}
		return
	}
	lc.buf.b = b[:0]
	c.loopReplied(th, f)
}

// loopReplied relays the whole reply f.Msg.
func (c *client) loopReplied(th loopThread, f wire.Framed) {
	x := &c.x
	panicPoint("loop-reply", &x.req)
	if _, err := x.onReply(f.Msg, f.Extra); err != nil {
		c.loopFail(th, err)
		return
	}
	lc := &c.lc
	lc.up.owner.Store(nil)
	lc.up = nil
	x.release()
	if d := c.drv(); d != nil && d.sendReply(th, c, f.Msg) {
		// The reply and the next receive are the driver's.
		x.bytesOut += len(f.Msg)
		c.loopAccount()
		lc.state = lsIdle
		return
	}
	if !c.loopWrite(f.Msg) {
		return
	}
	c.loopAfter(th)
}

// loopFail takes the failure exit for the request out on lc.up.
func (c *client) loopFail(th loopThread, err error) {
	lc := &c.lc
	lc.up.owner.Store(nil)
	lc.up = nil
	c.loopErrorReply(th, c.x.fail(err))
}

// loopErrorReply answers the request with an error reply body; the client
// stays connected.
func (c *client) loopErrorReply(th loopThread, body []byte) {
	lc := &c.lc
	if lc.unsent {
		c.consume(c.x.bytesIn)
		lc.unsent = false
	}
	c.nextID++
	out := getBuffer(len(body) + 64)
	msg := wire.AppendMsg(out.b[:0], c.nextID, c.x.reqID, 0, body)
	ok := c.loopWrite(msg)
	putBuffer(out)
	if ok {
		c.loopAfter(th)
	}
}

// loopAfter finishes a request whose reply was written, then serves what
// the client sent meanwhile.
func (c *client) loopAfter(th loopThread) {
	c.loopAccount()
	c.lc.state = lsIdle
	c.loopServe(th)
}

// loopAccount ends the request in the exchange and drops its reply buffer.
func (c *client) loopAccount() {
	lc := &c.lc
	if c.x.route != nil {
		lc.lastActive = monoNow()
	}
	c.x.end()
	putBuffer(lc.buf)
	lc.buf = nil
}

// loopWrite writes msg to the client. A client that does not read never
// blocks the loop: what the socket does not take goes to a goroutine, which
// writes it and serves the client from then on. It returns false when the
// loop no longer owns the client.
func (c *client) loopWrite(msg []byte) bool {
	lc := &c.lc
	n, err := lc.drv.sendClient(c, msg)
	c.x.bytesOut += n
	if err == nil && n == len(msg) {
		return true
	}
	if err != nil && err != syscall.EAGAIN {
		c.loopClose()
		return false
	}
	rest := getBuffer(len(msg) - n)
	copy(rest.b, msg[n:])
	c.x.bytesOut += len(rest.b)
	putBuffer(lc.buf)
	lc.buf = nil
	nc, ferr := fileConn(lc.sock.fd())
	if ferr != nil {
		putBuffer(rest)
		c.loopClose()
		return false
	}
	c.nc = nc
	lc.state = lsGoroutine
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

// loopClose finishes a loop-owned client.
func (c *client) loopClose() {
	c.loopAccount()
	c.lc.state = lsClosed
	c.finishLocked(errClientGone)
}

// loopForget drops the loop's registration and descriptor of the client.
func (c *client) loopForget() {
	if c.lc.sock != nil {
		c.lc.drv.closeClient(c)
	}
}

// disconnect closes the client from outside (Server.Close): a loop-owned
// idle client is finished at once; otherwise its owner notices the closed
// socket.
func (c *client) disconnect() {
	lc := &c.lc
	lc.ownMu.Lock()
	defer lc.ownMu.Unlock()
	switch lc.state {
	case lsIdle:
		c.loopClose()
	case lsUpstream, lsWaiting:
		// The reply's write fails once the descriptor is shut down.
		_ = syscall.Shutdown(lc.sock.fd(), syscall.SHUT_RDWR)
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
func (s *Server) loopUpFor(uc pool.Upstream) (_ *loopUp, never bool) {
	if a, ok := uc.Attachment().(*loopUp); ok {
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
	lu := &loopUp{uc: uc, rc: rc, drv: l.drv}
	var err error
	if cerr := rc.Control(func(fd uintptr) { lu.sock, err = l.drv.attachUpstream(lu, int(fd)) }); cerr != nil {
		err = cerr
	}
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

// UpstreamClosed is called by upstream.Conn.Close: a request in flight on
// the connection must fail, though the close may have dropped the event
// that would have woken the loop.
func (lu *loopUp) UpstreamClosed() { lu.drv.upstreamClosed(lu) }
