package proxy

// Client connections: a client's life from accept to disconnect, and the
// reads of its messages on its goroutine. A client is served by its
// goroutine or by the event loop (loop_client_linux.go says when); either
// way its requests go through dispatch.go, and the forwarded ones through
// the request state machine (exchange.go).

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"slices"
	"sync/atomic"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/routing"
	"github.com/mongobouncer/mongobouncer/internal/session"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// initialBodyBuffer is the first allocation for a message that does not fit
// the inline buffer; it doubles as bytes arrive.
const initialBodyBuffer = 64 * 1024

// client is one driver connection.
//
// Ownership: the fields without a comment of their own are owned by whoever
// serves the client, its goroutine or the loop thread holding lc.Mu
// (lc.State says which); the hand-over between them happens under
// lc.Mu. The client is split by owner (doc.go): conn, the socket and
// buffers; sess, what other clients, SHOW CLIENTS and Shutdown read (its
// Session.Mu, internal/session); login; lc, the loop's side; x, the request
// being forwarded.
type client struct {
	s *Server
	// conn is the socket and the buffers (conn.go). Owner only.
	conn
	id int64
	// only names the route of a listener dedicated to one route ("" for
	// the main listener); it is resolved at each request, so a reload that
	// replaces the route takes effect for connected clients too.
	only      string
	connected time.Time
	log       *slog.Logger
	// spoke is set once the client's first message has been answered (by
	// its goroutine, which always serves the first one); Shutdown's drain
	// waits for it (freshClientGrace).
	spoke atomic.Bool

	hello  bool // the client has sent its handshake
	maxMsg int

	// msg is the request being handled, parsed (owner only).
	msg wire.Msg

	// login is who the client logged in as, and its login in progress
	// (auth.go, logintimeout.go). Owner only.
	login login

	// x is the request being forwarded (exchange.go).
	x exchange
	// checkOutFn and checkedOutCh carry a queued checkout's result to the
	// client's goroutine (relay.go); made at its first queued checkout.
	checkOutFn   func(*pool.Conn, error)
	checkedOutCh chan checkOutResult

	// sess is the client's session: pins, open transactions, phase, and
	// what SHOW CLIENTS shows (guarded by its own Mu, "sessMu").
	sess session.Session

	// lc is the event-loop state; it says whether the goroutine or the loop
	// owns the client.
	lc loopClient

	// quiet logs the client's end at debug: a client refused before it
	// was served (startTLS), which logged why itself.
	quiet bool
}

func newClient(s *Server, nc net.Conn, only string, listener string) *client {
	id := s.nextClientID.Add(1)
	c := &client{
		s: s, id: id, only: only,
		conn:      conn{nc: nc, remote: nc.RemoteAddr().String(), listener: listener},
		connected: time.Now(),
		maxMsg:    s.opts.MaxMessageSize,
	}
	c.sent = &c.x.bytesOut
	if only != "" {
		// A route's own listener reads under the route's limit.
		if r := s.Route(only); r != nil {
			if m := r.MessageLimit(); m > 0 {
				c.maxMsg = m
			}
		}
	}
	c.login.clock.Connected = c.connected
	c.log = s.log.With("client", id, "remote", c.remote)
	c.bind()
	return c
}

// bind ties a new client's parts together: its exchange is given the
// server, the session, the login and the client's id, and its loop side
// the client.
func (c *client) bind() {
	c.x.s, c.x.sess, c.x.login, c.x.id = c.s, &c.sess, &c.login, c.id
	c.lc.init(c)
}

// monoEpoch anchors monoNow.
var monoEpoch = time.Now()

// monoNow reads only the monotonic clock, half the cost of time.Now (which
// reads the wall clock too): request durations are taken on every request.
func monoNow() time.Duration { return time.Since(monoEpoch) }

// errClientGone ends the client loop without an error reply.
var errClientGone = errors.New("client connection closed")

// serve serves a new client on its goroutine.
func (c *client) serve() {
	defer c.recoverGoroutine()
	if err := c.conn.startTLS(c.s, &c.lc.Endpoint, c.connected, c.log); err != nil {
		c.quiet = true
		c.finish(err)
		return
	}
	if c.tlsConn != nil {
		c.log.Info("client connected", "tls", tls.VersionName(c.tlsConn.ConnectionState().Version))
	} else {
		c.log.Info("client connected")
	}
	c.run()
}

// run is the goroutine's request loop. It returns when the client is gone
// or breaks the protocol (then the client is finished), or when the client
// is idle and the event loop took it over.
func (c *client) run() {
	defer c.recoverGoroutine()
	for {
		msg, err := c.read()
		if err == nil {
			err = c.handle(msg)
		}
		if err != nil {
			c.finish(err)
			return
		}
		if !c.spoke.Load() {
			c.spoke.Store(true)
		}
		c.releaseBuffers()
		if c.lc.enter() {
			return
		}
	}
}

// finish ends a client its goroutine owns: open transactions are aborted
// (network I/O, so without the loop lock), then the client is finalized.
func (c *client) finish(err error) {
	c.cleanup()
	c.closeOwned()
	c.finalize(err)
}

// closeOwned marks a client its goroutine owns closed for the loop, which
// forgets it, under ownMu.
func (c *client) closeOwned() {
	c.lc.Mu.Lock()
	defer c.lc.Mu.Unlock()
	c.lc.State = lsClosed
	c.lingerOnClose()
	c.lc.forget()
}

// finishOwned ends a client the loop owns, holding c.lc.Mu. Such a client
// has no transaction open and nothing pinned, so cleanup does no I/O.
func (c *client) finishOwned(err error) {
	c.cleanup()
	c.lingerOnClose()
	c.lc.forget()
	c.finalize(err)
}

// finalize closes the connection and takes the client off the server.
func (c *client) finalize(err error) {
	c.closeConn()
	c.releaseBuffers()
	attrs := []any{"duration", time.Since(c.connected).Round(time.Millisecond)}
	if !c.hello {
		// After a hello, c.log names the appName already (answerHello).
		attrs = append(attrs, "appName", "")
	}
	if err != nil && !errors.Is(err, errClientGone) {
		attrs = append(attrs, "error", err)
	}
	if c.quiet {
		c.log.Debug("client disconnected", attrs...)
	} else {
		c.log.Info("client disconnected", attrs...)
	}
	c.login.releaseUser(c.s)
	s := c.s
	s.clientsMu.Lock()
	delete(s.clients, c)
	s.clientsMu.Unlock()
	s.clientCount.Add(-1)
	s.opts.Observer.ClientDisconnected()
	s.wg.Done()
}

// read reads one whole message from the client, bounded by the message size
// limit. Too small or too large messages get an error reply and end the
// client. Bytes arrive through the client's small inline buffer, so a small
// command costs one read system call; the rest of a larger message is read
// straight into a pooled buffer.
func (c *client) read() ([]byte, error) {
	// The wait for a message is bounded by client_idle_timeout and the
	// login rule; a message begun, by readWait.partial (logintimeout.go).
	w := startRead(c.s, &c.conn, &c.login, c.log, c.idleTimeout())
	win := &c.lc.Win
	for win.Len() < wire.HeaderLen {
		win.Compact()
		if win.Hi > 0 {
			w.partial(c.idleTimeout())
		}
		n, err := c.nc.Read(win.Free())
		win.Hi += n
		if err != nil && win.Len() < wire.HeaderLen {
			if w.stillWaiting(err, c.idleTimeout()) {
				continue
			}
			return nil, w.failed(err)
		}
	}
	hdr := win.Pending()[:wire.HeaderLen]
	h, err := wire.ParseHeader(hdr)
	if err != nil {
		return nil, c.protocolError(c.log, int32(binary.LittleEndian.Uint32(hdr[4:])), err)
	}
	n := int(h.MessageLength)
	if limit := c.login.readLimit(c.s, c.maxMsg); n < wire.HeaderLen || n > limit {
		return nil, c.protocolError(c.log, h.RequestID, c.login.sizeError(c.s, n, limit))
	}
	if n <= win.Len() {
		c.in = getBuffer(n)
		b := c.in.b[:n]
		copy(b, win.Pending())
		win.Consume(n)
		w.done()
		return b, nil
	}
	// The rest of the message must come from the socket. The buffer grows
	// with the bytes that arrive, not with the length the client claims, so
	// stalled senders of huge headers cost what they sent.
	c.in = getBuffer(min(n, initialBodyBuffer))
	b := c.in.b[:0]
	b = append(b, win.Pending()...)
	win.Reset()
	w.partial(c.idleTimeout())
	for len(b) < n {
		if len(b) == cap(b) {
			b = slices.Grow(b, min(n, 2*cap(b))-len(b))
		}
		m, err := c.nc.Read(b[len(b):min(n, cap(b))])
		b = b[:len(b)+m]
		if err != nil && len(b) < n {
			if w.stillWaiting(err, c.idleTimeout()) {
				continue
			}
			c.in.b = b[:0]
			return nil, w.failed(err)
		}
	}
	c.in.b = b[:0]
	w.done()
	return b, nil
}

// idleTimeout returns the client_idle_timeout that applies to the client
// now, 0 for none: its listener's route's, else the route of its most
// recent request (as that route is configured now), else the global one.
func (c *client) idleTimeout() time.Duration {
	var r *routing.Route
	if c.only != "" {
		r = c.s.Route(c.only)
	} else if last := c.sess.LastRoute(); last != nil {
		r = c.s.Route(last.Name)
	}
	if r != nil {
		switch t := r.IdleLimit(); {
		case t < 0:
			return 0
		case t > 0:
			return t
		}
	}
	return time.Duration(c.s.idleTimeout.Load())
}

// clearedAndReady reports whether err says p was cleared while p is ready
// again. It is kept out of acquire's fast path because the errors.As
// target escapes to the heap.
func clearedAndReady(err error, p *pool.Pool) bool {
	var cleared *pool.PoolClearedError
	return p != nil && errors.As(err, &cleared) && p.Stats().State == pool.StateReady
}
