package proxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/topology"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// bodyReadTimeout bounds how long a client may take to send the rest of a
// message once its header has arrived, so a stalled sender cannot hold a
// large buffer forever.
const bodyReadTimeout = 60 * time.Second

// initialBodyBuffer is the first allocation for a message that does not fit
// the inline buffer; it doubles as bytes arrive.
const initialBodyBuffer = 64 * 1024

// clientState is where a client is; see admin.ClientState.
type clientState uint32

const (
	stateIdle clientState = iota
	stateWaiting
	stateActive
	statePinned
)

// String returns the SHOW CLIENTS spelling.
func (s clientState) String() string {
	switch s {
	case stateWaiting:
		return "waiting"
	case stateActive:
		return "active"
	case statePinned:
		return "pinned"
	}
	return "idle"
}

// pin is an upstream connection a client keeps across requests: in session
// mode for its whole life, in transaction mode while it has a transaction
// open on that route.
type pin struct {
	route *Route
	srv   *topology.Server
	conn  *pool.Conn
}

// client is one driver connection. Its goroutine owns every field except
// those guarded by mu, which other clients touch when they end a
// transaction this client began.
type client struct {
	s  *Server
	nc net.Conn
	id int64
	// only names the route of a listener dedicated to one route ("" for
	// the main listener); it is resolved at each request, so a reload that
	// replaces the route takes effect for connected clients too.
	only      string
	remote    string
	connected time.Time
	log       *slog.Logger

	appName  string
	listener string // the address the client connected to
	hello    bool   // the client has sent its handshake
	// state is a clientState, read by SHOW CLIENTS from other goroutines.
	state    atomic.Uint32
	requests atomic.Uint64
	lb       bool // the client is in load-balanced mode
	maxMsg   int
	// lastRoute is the route of the client's most recent request, whose
	// client_idle_timeout applies to it (idleTimeout). Written by whoever
	// serves the client, read by the idle sweeper.
	lastRoute atomic.Pointer[Route]
	nextID    int32 // requestID of our own replies

	hdr [wire.HeaderLen]byte
	// rbuf holds bytes read from the client but not yet consumed
	// (rbuf[rlo:rhi]); small enough to keep idle clients cheap, large
	// enough for most commands to arrive in one read.
	rbuf     [512]byte
	rlo, rhi int
	deadline bool    // a read deadline is set on nc
	in       *buffer // the request being handled
	aux      *buffer // decompressed request
	out      *buffer // replies we build, and compressed copies
	msg      wire.Msg
	req      request
	comp     [4]string // compressors agreed with the client (first wins)

	mu sync.Mutex // guards pins, open and busy
	// pins holds at most one pinned connection per route.
	pins []pin
	// open are the transactions begun through this client that have not
	// ended; they are aborted if the client disconnects.
	open map[txnKey]*Route
	busy bool // a request is in progress: pins may not be released by others
	// forwarding is set for the whole of forward, the reply's write
	// included (busy ends when the connection is given back, before it):
	// Shutdown's drain waits for it.
	forwarding bool

	// Per-request accounting for the Observer; owned by the client's owner.
	bytesOut int
	okReply  bool

	// selRoute and selServer are the event loop's server selection for the
	// request it gave to the goroutine; acquire uses it and clears it.
	selRoute  *Route
	selServer *topology.Server

	// lc is the event-loop state; it says whether the goroutine or the loop
	// owns the client (nc is nil while the loop does).
	lc loopClient
}

func newClient(s *Server, nc net.Conn, only string, listener string) *client {
	id := s.nextClientID.Add(1)
	c := &client{
		s: s, nc: nc, id: id, only: only,
		remote:    nc.RemoteAddr().String(),
		listener:  listener,
		connected: time.Now(),
		maxMsg:    s.opts.MaxMessageSize,
	}
	if only != "" {
		// A route's own listener reads under the route's limit.
		if r := s.Route(only); r != nil {
			if m := int(r.maxMsg.Load()); m > 0 {
				c.maxMsg = m
			}
		}
	}
	c.log = s.log.With("client", id, "remote", c.remote)
	c.initLoop()
	return c
}

// closeConn closes the goroutine's connection; safe to repeat.
func (c *client) closeConn() {
	if c.nc != nil {
		_ = c.nc.Close()
	}
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
	c.log.Info("client connected")
	c.run()
}

// run is the goroutine's request loop. It returns when the client is gone
// or breaks the protocol (then the client is finished), or when the client
// is idle and the event loop took it over.
func (c *client) run() {
	for {
		msg, err := c.read()
		if err == nil {
			err = c.handle(msg)
		}
		c.selRoute, c.selServer = nil, nil
		if err != nil {
			c.finish(err)
			return
		}
		c.releaseBuffers()
		if c.enterLoop() {
			return
		}
	}
}

// finish ends a client its goroutine owns: open transactions are aborted
// (network I/O, so without the loop lock), then the client is finalized.
func (c *client) finish(err error) {
	c.cleanup()
	c.lc.mu.Lock()
	c.lc.state = lsClosed
	c.loopForget()
	c.lc.mu.Unlock()
	c.finalize(err)
}

// finishLocked ends a client the loop owns, holding c.lc.mu. Such a client
// has no transaction open and nothing pinned, so cleanup does no I/O.
func (c *client) finishLocked(err error) {
	c.cleanup()
	c.loopForget()
	c.finalize(err)
}

// finalize closes the connection and takes the client off the server.
func (c *client) finalize(err error) {
	c.closeConn()
	c.releaseBuffers()
	attrs := []any{"appName", c.appName, "duration", time.Since(c.connected).Round(time.Millisecond)}
	if err != nil && !errors.Is(err, errClientGone) {
		attrs = append(attrs, "error", err)
	}
	c.log.Info("client disconnected", attrs...)
	s := c.s
	s.mu.Lock()
	delete(s.clients, c)
	s.mu.Unlock()
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
	if t := c.idleTimeout(); t > 0 {
		_ = c.nc.SetReadDeadline(time.Now().Add(t))
		c.deadline = true
	} else if c.deadline {
		_ = c.nc.SetReadDeadline(time.Time{})
		c.deadline = false
	}
	for c.rhi-c.rlo < wire.HeaderLen {
		if c.rlo > 0 {
			c.rhi = copy(c.rbuf[:], c.rbuf[c.rlo:c.rhi])
			c.rlo = 0
		}
		n, err := c.nc.Read(c.rbuf[c.rhi:])
		c.rhi += n
		if err != nil && c.rhi-c.rlo < wire.HeaderLen {
			return nil, errClientGone
		}
	}
	hdr := c.rbuf[c.rlo : c.rlo+wire.HeaderLen]
	h, err := wire.ParseHeader(hdr)
	if err != nil {
		return nil, c.protocolError(int32(binary.LittleEndian.Uint32(hdr[4:])), err)
	}
	n := int(h.MessageLength)
	if n < wire.HeaderLen || n > c.maxMsg {
		return nil, c.protocolError(h.RequestID, fmt.Errorf("message length %d is outside [%d, %d]: %w",
			n, wire.HeaderLen, c.maxMsg, wire.ErrMessageTooLarge))
	}
	avail := c.rhi - c.rlo
	if n <= avail {
		c.in = getBuffer(n)
		b := c.in.b[:n]
		copy(b, c.rbuf[c.rlo:c.rlo+n])
		c.rlo += n
		if c.rlo == c.rhi {
			c.rlo, c.rhi = 0, 0
		}
		return b, nil
	}
	// The rest of the message must come from the socket. The buffer grows
	// with the bytes that arrive, not with the length the client claims, so
	// stalled senders of huge headers cost what they sent.
	c.in = getBuffer(min(n, initialBodyBuffer))
	b := c.in.b[:0]
	b = append(b, c.rbuf[c.rlo:c.rhi]...)
	c.rlo, c.rhi = 0, 0
	timeout := bodyReadTimeout
	if t := c.idleTimeout(); t > 0 && t < timeout {
		timeout = t
	}
	_ = c.nc.SetReadDeadline(time.Now().Add(timeout))
	c.deadline = true
	for len(b) < n {
		if len(b) == cap(b) {
			b = slices.Grow(b, min(n, 2*cap(b))-len(b))
		}
		m, err := c.nc.Read(b[len(b):min(n, cap(b))])
		b = b[:len(b)+m]
		if err != nil && len(b) < n {
			c.in.b = b[:0]
			return nil, errClientGone
		}
	}
	c.in.b = b[:0]
	return b, nil
}

// handle answers or forwards one client message. A returned error ends the
// client.
func (c *client) handle(msg []byte) error {
	h, _ := wire.ParseHeader(msg)
	var compID wire.CompressorID
	compressed := false
	if h.OpCode == wire.OpCompressed {
		if len(msg) > wire.HeaderLen+8 {
			compID = wire.CompressorID(msg[wire.HeaderLen+8])
		}
		// A pooled buffer; Decompress grows it to the declared size, which
		// it has checked against the limit first.
		c.aux = getBuffer(0)
		inner, err := wire.Decompress(c.aux.b[:0], msg, c.maxMsg)
		if err != nil {
			return c.protocolError(h.RequestID, err)
		}
		c.aux.b = inner[:0]
		msg = inner
		h, _ = wire.ParseHeader(msg)
		compressed = true
	}
	switch h.OpCode {
	case wire.OpMsg:
		return c.handleMsg(msg, h, compressed, compID)
	case wire.OpQuery:
		return c.handleQuery(msg, h)
	default:
		return c.protocolError(h.RequestID, fmt.Errorf("opcode %d is not supported by mongobouncer: %w", int32(h.OpCode), wire.ErrUnknownOpCode))
	}
}

// protocolError answers a malformed message with an error reply, when the
// client can still read one, and ends the client.
func (c *client) protocolError(requestID int32, err error) error {
	return c.protocolErrorOp(requestID, wire.OpMsg, err)
}

// protocolErrorOp is protocolError for a request of opcode op: a legacy
// OP_QUERY client can only read an OP_REPLY.
func (c *client) protocolErrorOp(requestID int32, op wire.OpCode, err error) error {
	c.log.Warn("client protocol error", "error", err)
	code, codeName := int32(17), "ProtocolError"
	if errors.Is(err, wire.ErrInvalidBSON) {
		code, codeName = 22, "InvalidBSON"
	}
	doc := errorReply(code, codeName, "mongobouncer: "+err.Error())
	_ = c.nc.SetWriteDeadline(time.Now().Add(time.Second))
	if op == wire.OpQuery {
		c.writeLegacyReply(requestID, true, legacyError(doc))
	} else {
		_ = c.writeError(requestID, false, 0, doc)
	}
	_ = c.nc.SetWriteDeadline(time.Time{})
	return err
}

// refuse answers a client over max_client_conn: it reads the first message
// (with a short deadline) so that the error reply can name its request, and
// closes the connection.
func (c *client) refuse(reason string) {
	defer c.closeConn()
	c.log.Warn("client refused", "reason", reason)
	_ = c.nc.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.ReadFull(c.nc, c.hdr[:]); err != nil {
		return
	}
	h, err := wire.ParseHeader(c.hdr[:])
	if err != nil {
		return
	}
	doc := errorReply(6, "HostUnreachable", reason)
	if h.OpCode == wire.OpQuery {
		c.writeLegacyReply(h.RequestID, true, legacyError(doc))
		return
	}
	_ = c.writeError(h.RequestID, false, 0, doc)
}

// handleQuery serves legacy OP_QUERY, which modern drivers use only for the
// first hello.
func (c *client) handleQuery(msg []byte, h wire.Header) error {
	q, err := wire.ParseQuery(msg)
	if err != nil {
		return c.protocolErrorOp(h.RequestID, wire.OpQuery, err)
	}
	cmd := q.Query
	if v, err := cmd.LookupErr("$query"); err == nil {
		if d, ok := v.DocumentOK(); ok {
			cmd = d
		}
	}
	name := wire.CommandName(cmd)
	if ci := commands[name]; ci.kind == kindHello && isCmdNamespace(q.FullCollectionName) {
		doc := c.answerHello(cmd, name)
		c.writeLegacyReply(h.RequestID, false, doc)
		return nil
	}
	doc := errorReply(352, "UnsupportedOpQueryCommand",
		fmt.Sprintf("mongobouncer: OP_QUERY is only supported for hello and isMaster, not %q on %q; the client driver may require an upgrade", name, q.FullCollectionName))
	c.writeLegacyReply(h.RequestID, true, legacyError(doc))
	return nil
}

func isCmdNamespace(ns string) bool {
	return len(ns) > 5 && ns[len(ns)-5:] == ".$cmd"
}

// legacyError adds the $err field that OP_REPLY query failures carry.
func legacyError(doc bsoncore.Document) bsoncore.Document {
	msg, _ := doc.Lookup("errmsg").StringValueOK()
	out := bsoncore.AppendStringElement(nil, "$err", msg)
	elems, _ := doc.Elements()
	parts := [][]byte{out}
	for _, e := range elems {
		parts = append(parts, e)
	}
	return bsoncore.BuildDocument(nil, parts...)
}

// answerHello handles a client handshake or heartbeat.
func (c *client) answerHello(body bsoncore.Document, name string) bsoncore.Document {
	hr := parseHello(body, name)
	if hr.apiVersion != "" && hr.apiVersion != "1" {
		return errorReply(322, "APIVersionError", fmt.Sprintf("mongobouncer: API version %q is not supported", hr.apiVersion))
	}
	lim := c.s.waitLimits()
	if !c.hello {
		c.hello = true
		c.mu.Lock()
		c.appName = hr.appName
		c.mu.Unlock()
		c.lb = hr.loadBalanced
		c.log = c.log.With("appName", hr.appName)
	}
	if int(lim.maxMsg) < c.maxMsg {
		c.maxMsg = int(lim.maxMsg)
	}
	compressor := ""
	for _, want := range hr.compression {
		if c.s.offers(want) {
			compressor = want
			break
		}
	}
	return helloReply(hr, lim, c.id, compressor, c.s.serviceID)
}

// offers reports whether mongobouncer accepts compressor name from clients.
func (s *Server) offers(name string) bool {
	for _, o := range s.opts.Compressors {
		if o == name {
			_, ok := wire.CompressorByName(name)
			return ok
		}
	}
	return false
}

// handleMsg serves one OP_MSG request.
func (c *client) handleMsg(msg []byte, h wire.Header, compressed bool, compID wire.CompressorID) error {
	if err := wire.ParseMsgInto(msg, &c.msg); err != nil {
		return c.protocolError(h.RequestID, err)
	}
	req := &c.req
	req.inspect(c.msg.Body)
	req.exhaust = c.msg.Flags&wire.FlagExhaustAllowed != 0
	req.more = c.msg.Flags&wire.FlagMoreToCome != 0
	switch req.info.kind {
	case kindHello:
		hello := c.answerHello(c.msg.Body, req.name())
		if req.more {
			return nil // moreToCome: the client reads no reply
		}
		return c.reply(h.RequestID, compressed, compID, req.name(), hello)
	case kindAuth:
		return c.replyError(h.RequestID, compressed, compID, req,
			errorReply(115, "CommandNotSupported", "mongobouncer: authentication is not enabled on mongobouncer"))
	}
	if len(req.db) == 0 {
		return c.replyError(h.RequestID, compressed, compID, req,
			errorReply(40571, "Location40571", "mongobouncer: OP_MSG requests require a $db argument"))
	}
	if string(req.db) == AdminDatabase {
		if c.s.opts.Admin == nil {
			return c.replyError(h.RequestID, compressed, compID, req,
				errorReply(13, "Unauthorized", "mongobouncer: admin commands are not enabled"))
		}
		return c.replyError(h.RequestID, compressed, compID, req, c.s.opts.Admin.HandleAdmin(c.nc.RemoteAddr(), c.msg.Body))
	}
	if c.s.draining.Load() {
		// Only the commands of an open transaction may still run (on any
		// client connection: drivers pin the server, not the connection):
		// everything else goes to another mongobouncer.
		key, inTxn := req.key()
		if !inTxn || !c.isOpen(key) && c.s.txnRoute(key) == nil {
			return c.replyError(h.RequestID, compressed, compID, req,
				errorReply(91, "ShutdownInProgress", "mongobouncer: shutting down"))
		}
	}
	var route *Route
	switch key, inTxn := req.key(); {
	case c.only != "":
		route = c.s.Route(c.only)
	case inTxn && !req.startTxn:
		// A transaction's later commands go to the route it began on:
		// commitTransaction and abortTransaction name admin, which may be
		// routed elsewhere (or nowhere).
		if route = c.s.txnRoute(key); route == nil {
			route = c.s.routeFor(req.db)
		}
	default:
		route = c.s.routeFor(req.db)
	}
	if route == nil {
		if req.info.kind == kindEndSessions {
			// Sessions expire on their own; with no route for admin there is
			// nowhere to send this, and the driver needs no more than ok.
			if req.more {
				return nil
			}
			return c.reply(h.RequestID, compressed, compID, req.name(), okReply)
		}
		return c.replyError(h.RequestID, compressed, compID, req,
			errorReply(70, "ShardNotFound", fmt.Sprintf("mongobouncer: no route for database %q (add [databases.%s] or a \"*\" route)", req.db, req.db)))
	}
	c.useRoute(route)
	if m := int(route.maxMsg.Load()); m > 0 && len(msg) > m {
		// Read under the listener's limit, over the route's: the message
		// was read whole, so the client can go on.
		return c.replyError(h.RequestID, compressed, compID, req,
			errorReply(10334, "BSONObjectTooLarge", fmt.Sprintf("mongobouncer: a message of %d bytes is over route %q's max_message_size of %d bytes", len(msg), route.Name, m)))
	}
	return c.forward(route, msg, h, compressed, compID)
}

// useRoute records route as the client's most recent one.
func (c *client) useRoute(route *Route) {
	if c.lastRoute.Load() != route {
		c.lastRoute.Store(route)
	}
}

// idleTimeout returns the client_idle_timeout that applies to the client
// now, 0 for none: its listener's route's, else the route of its most
// recent request (as that route is configured now), else the global one.
func (c *client) idleTimeout() time.Duration {
	var r *Route
	if c.only != "" {
		r = c.s.Route(c.only)
	} else if last := c.lastRoute.Load(); last != nil {
		r = c.s.Route(last.Name)
	}
	if r != nil {
		switch t := time.Duration(r.idle.Load()); {
		case t < 0:
			return 0
		case t > 0:
			return t
		}
	}
	return time.Duration(c.s.idleTimeout.Load())
}

var okReply = func() bsoncore.Document {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendDoubleElement(d, "ok", 1)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}()

// forward sends one request to an upstream connection chosen by the route's
// pool mode and affinity, and relays the reply or the whole exhaust stream.
func (c *client) forward(route *Route, msg []byte, h wire.Header, compressed bool, compID wire.CompressorID) error {
	start := monoNow()
	c.requests.Add(1)
	c.bytesOut = 0
	if len(c.pins) > 0 {
		c.dropStalePins()
	}
	c.state.Store(uint32(stateActive))
	c.mu.Lock()
	c.forwarding = true
	c.mu.Unlock()
	err := c.forward1(route, msg, h, compressed, compID)
	// Whatever path the request took, it is over: the client is no longer
	// busy, and it is idle or pinned. A transaction-mode pin whose
	// transaction ended while this request ran (committed through another
	// client, txnEnded, which leaves a busy client's pins alone) goes back
	// now.
	c.mu.Lock()
	c.busy, c.forwarding = false, false
	back := c.takePinsLocked(func(p *pin) bool { return p.route.PoolMode() != ModeSession })
	if c.hasPinLocked() {
		c.state.Store(uint32(statePinned))
	} else {
		c.state.Store(uint32(stateIdle))
	}
	c.mu.Unlock()
	checkInPins(back)
	name := c.req.info.name
	if !c.req.info.known {
		name = "other" // bounded label cardinality
	}
	c.s.opts.Observer.Request(route.Name, name, len(msg), c.bytesOut, monoNow()-start, c.okReply)
	return err
}

// forward1 is forward without the accounting.
func (c *client) forward1(route *Route, msg []byte, h wire.Header, compressed bool, compID wire.CompressorID) error {
	req := &c.req
	c.okReply = false
	key, inTxn := req.key()
	var killIDs []int64
	if req.info.kind == kindKillCursors && route.multi {
		killIDs = cursorIDs(c.msg.Body)
	}

	srv, pc, pinned, err := c.acquire(route, req, key, inTxn, killIDs)
	if err != nil {
		if req.more {
			return nil
		}
		return c.replyError(h.RequestID, compressed, compID, req, c.s.upstreamError(route, err, req, inTxn))
	}
	if inTxn && req.startTxn {
		c.beginTxn(route, srv, key)
	}

	uc := pc.Upstream().(*upstream.Conn)
	if err := uc.WriteMessage(msg); err != nil {
		c.fail(route, srv, pc, err)
		c.failedStart(req, key, inTxn)
		if req.more {
			return nil
		}
		return c.replyError(h.RequestID, compressed, compID, req, c.s.upstreamError(route, err, req, inTxn))
	}
	if req.more {
		c.release(route, srv, pc, pinned)
		return nil
	}

	respondTo := h.RequestID
	rbuf := getBuffer(16 * 1024)
	defer putBuffer(rbuf)
	// failed ends the request on an upstream problem: the connection is
	// closed, the client gets a retryable error.
	failed := func(err error) error {
		c.fail(route, srv, pc, err)
		return c.replyError(respondTo, compressed, compID, req, c.s.upstreamError(route, err, req, inTxn))
	}
	for first := true; ; first = false {
		reply, err := uc.ReadMessage(rbuf.b[:0])
		if err != nil {
			if first {
				c.failedStart(req, key, inTxn)
			}
			return failed(err)
		}
		if cap(reply) > cap(rbuf.b) {
			rbuf.b = reply[:0]
		}
		rh, _ := wire.ParseHeader(reply)
		// Only the first reply answers the request; the rest of a stream
		// answer the reply before them.
		if err := checkReply(reply, srv.Address(), h.RequestID, first); err != nil {
			return failed(err)
		}
		flags, body := replyView(reply)
		ri := inspectReply(body)
		c.okReply = ri.ok
		if !ri.ok && ri.code != 0 {
			c.s.opts.Observer.UpstreamError(route.Name, ri.code)
		}
		c.track(route, srv, req, key, inTxn, ri, killIDs)
		stream := flags&wire.FlagMoreToCome != 0
		if stream && !req.exhaust {
			// A server must not stream to a request that did not allow it;
			// the rest of its stream would be unread bytes on the conn.
			return failed(fmt.Errorf("upstream %s sent moreToCome to a request without exhaustAllowed", srv.Address()))
		}
		if !stream && uc.Buffered() > 0 {
			// More than the reply came: those bytes would answer the next
			// request on this connection.
			if req.exhaust {
				return failed(fmt.Errorf("upstream %s sent more after the last reply of an exhaust stream", srv.Address()))
			}
			return failed(fmt.Errorf("upstream %s sent more than one reply to a request without exhaustAllowed", srv.Address()))
		}
		if !stream {
			// The whole reply is in our buffer: the upstream connection can
			// serve someone else while the reply goes to this client.
			c.release(route, srv, pc, pinned)
			if werr := c.writeRaw(reply, compressed, compID, req.name()); werr != nil {
				return errClientGone
			}
			return nil
		}
		if werr := c.writeRaw(reply, compressed, compID, req.name()); werr != nil {
			// Unread replies of the stream follow: never pool that conn,
			// nor keep it pinned (the abort of an open transaction at
			// disconnect would read the stream's replies).
			pc.MarkErrored(werr)
			c.unpin(route, pc)
			route.checkIn(srv, pc)
			return errClientGone
		}
		respondTo = rh.RequestID
	}
}

// checkReply reports a reply that cannot be relayed: one that does not
// answer request reqID (checked when checkTo: a stale reply left on the
// connection, or a confused server), or whose checksum does not match.
// Nothing more on that connection can be trusted.
func checkReply(reply []byte, addr string, reqID int32, checkTo bool) error {
	if to := int32(binary.LittleEndian.Uint32(reply[8:])); checkTo && to != reqID {
		return fmt.Errorf("upstream %s answered request %d with a reply to %d", addr, reqID, to)
	}
	if !wire.ChecksumOK(reply) {
		return fmt.Errorf("upstream %s sent a reply whose checksum does not match: %w", addr, wire.ErrBadChecksum)
	}
	return nil
}

// replyView returns the flags and the body of an upstream OP_MSG reply
// without validating it: the body is only read with bounds-checked element
// walks, and the bytes are relayed unchanged.
func replyView(msg []byte) (wire.MsgFlags, bsoncore.Document) {
	if len(msg) < wire.HeaderLen+5 || wire.OpCode(int32(binary.LittleEndian.Uint32(msg[12:]))) != wire.OpMsg {
		return 0, nil
	}
	flags := wire.MsgFlags(binary.LittleEndian.Uint32(msg[16:]))
	end := len(msg)
	if flags&wire.FlagChecksumPresent != 0 {
		end -= 4
	}
	for p := wire.HeaderLen + 4; p < end; {
		kind := msg[p]
		p++
		if p+4 > end {
			break
		}
		n := int(int32(binary.LittleEndian.Uint32(msg[p:])))
		if n < 5 || p+n > end {
			break
		}
		if kind == 0 {
			return flags, bsoncore.Document(msg[p : p+n])
		}
		p += n
	}
	return flags, nil
}

// acquire finds the upstream connection for a request: the client's pin for
// the route when it has one and affinity allows, else a checkout from the
// server that affinity names or that selection picks.
func (c *client) acquire(route *Route, req *request, key txnKey, inTxn bool, killIDs []int64) (*topology.Server, *pool.Conn, bool, error) {
	var need *topology.Server
	if route.multi {
		// Only affinity needs the clock: a single-server route spares the read.
		now := time.Now()
		switch {
		case req.info.kind == kindGetMore:
			need, _ = route.cursors.get(req.cursorID, now)
		case req.info.kind == kindKillCursors && len(killIDs) > 0:
			// Drivers kill one cursor per command; several would all belong
			// to the server of the first, as they come from one cursor's
			// namespace.
			need, _ = route.cursors.get(killIDs[0], now)
		case inTxn && !req.startTxn:
			need, _ = route.txns.get(key, now)
		}
	}
	c.mu.Lock()
	c.busy = true
	if p := c.pinLocked(route); p != nil && p.conn != nil && (need == nil || need == p.srv) {
		c.mu.Unlock()
		return p.srv, p.conn, true, nil
	}
	c.mu.Unlock()

	srv := need
	if srv == nil && c.selRoute == route {
		// The event loop selected this server before it gave the request
		// to this goroutine (its pool had no connection to spare): keep the
		// choice, or servers that have no connection yet would never get one.
		srv = c.selServer
	}
	c.selRoute, c.selServer = nil, nil
	if srv == nil {
		// SelectServer bounds its own wait by server_selection_timeout.
		s, err := route.Topology.SelectServer(context.Background())
		if err != nil {
			return nil, nil, false, err
		}
		srv = s
	}
	if err := route.waitGate(c.s.stopping); err != nil {
		return nil, nil, false, err
	}
	if c.s.Route(route.Name) != route {
		// A reload replaced or removed the route while the request waited
		// at its pause (and carried the pause over): the driver's retry
		// takes the route now configured.
		return nil, nil, false, errRouteReplaced
	}
	c.state.Store(uint32(stateWaiting))
	pc, err := route.checkOut(context.Background(), srv)
	if err != nil && clearedAndReady(err, srv) {
		// The pool was cleared and is ready again already (a graceful
		// reconnect, or a heartbeat that followed at once): one more try
		// spares the client an error.
		pc, err = route.checkOut(context.Background(), srv)
	}
	c.state.Store(uint32(stateActive))
	if err != nil {
		srv.HandleError(err, nil)
		return nil, nil, false, err
	}
	mode := route.PoolMode()
	pinNow := mode == ModeSession || (mode == ModeTransaction && (req.startTxn || (inTxn && c.hasOpen(route))))
	if pinNow && (need == nil || !route.multi || c.pinServer(route) == nil || c.pinServer(route) == srv) {
		c.mu.Lock()
		c.setPinLocked(route, srv, pc)
		c.mu.Unlock()
		return srv, pc, true, nil
	}
	return srv, pc, false, nil
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
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.pinLocked(route); p != nil && p.conn != nil {
		return p.srv
	}
	return nil
}

func (c *client) setPinLocked(route *Route, srv *topology.Server, pc *pool.Conn) {
	if p := c.pinLocked(route); p != nil {
		p.srv, p.conn = srv, pc
		return
	}
	c.pins = append(c.pins, pin{route: route, srv: srv, conn: pc})
}

func (c *client) hasOpen(route *Route) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
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

// release ends a request: a connection that is not pinned goes back to its
// pool; a transaction-mode pin is dropped once no transaction holds it.
func (c *client) release(route *Route, srv *topology.Server, pc *pool.Conn, pinned bool) {
	c.mu.Lock()
	c.busy = false
	if pinned && route.PoolMode() != ModeSession && !c.hasOpenLocked(route) {
		if p := c.pinLocked(route); p != nil && p.conn == pc {
			p.conn = nil
			pinned = false
		}
	}
	c.mu.Unlock()
	if !pinned {
		route.checkIn(srv, pc)
	}
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

// fail handles an I/O error on an upstream connection: the connection is
// closed at check-in, the server hears of the error (it may clear its pool),
// and a pin on it is dropped.
func (c *client) fail(route *Route, srv *topology.Server, pc *pool.Conn, err error) {
	pc.MarkErrored(err)
	srv.HandleError(err, pc)
	c.s.log.Warn("upstream error", "route", route.Name, "server", srv.Address(), "client", c.id, "error", err)
	c.unpin(route, pc)
	route.checkIn(srv, pc)
}

// unpin ends the request on pc, dropping the client's pin on it: the
// caller checks pc in (errored, so that it is closed).
func (c *client) unpin(route *Route, pc *pool.Conn) {
	c.mu.Lock()
	c.busy = false
	if p := c.pinLocked(route); p != nil && p.conn == pc {
		p.conn = nil
	}
	c.mu.Unlock()
}

// failedStart forgets a transaction whose first command failed on the
// network: no reply will say it began, and left open it would keep the
// client's transaction-mode pins and hold Shutdown's drain. (If the
// command did reach the server, the transaction expires there.)
func (c *client) failedStart(req *request, key txnKey, inTxn bool) {
	if inTxn && req.startTxn {
		c.s.endTxn(key, c)
	}
}

// beginTxn records a transaction begun through this client.
func (c *client) beginTxn(route *Route, srv *topology.Server, key txnKey) {
	c.mu.Lock()
	if c.open == nil {
		c.open = make(map[txnKey]*Route)
	}
	c.open[key] = route
	c.mu.Unlock()
	if route.multi {
		route.txns.put(key, srv, time.Now())
	}
	c.s.setTxnOwner(key, c)
}

// track updates cursor and transaction affinity from one reply.
func (c *client) track(route *Route, srv *topology.Server, req *request, key txnKey, inTxn bool, ri replyInfo, killIDs []int64) {
	if route.multi {
		switch {
		case req.info.kind == kindGetMore && ri.cursorID == 0:
			route.cursors.delete(req.cursorID)
		case req.info.kind == kindKillCursors:
			for _, id := range killIDs {
				route.cursors.delete(id)
			}
		case ri.cursorID != 0 && req.info.kind != kindGetMore:
			route.cursors.put(ri.cursorID, srv, time.Now())
		}
	}
	if !inTxn {
		return
	}
	switch {
	case req.info.kind == kindCommit || req.info.kind == kindAbort:
		if route.multi {
			route.txns.delete(key)
		}
		c.s.endTxn(key, c)
	case !ri.ok:
		// The server aborts a transaction on a command error. Keep the
		// server affinity (the driver will still send abortTransaction)
		// but free the connection.
		c.s.endTxn(key, c)
	}
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
	owner.mu.Lock()
	defer owner.mu.Unlock()
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
	c.mu.Lock()
	route, ok := c.open[key]
	if !ok {
		c.mu.Unlock()
		return
	}
	delete(c.open, key)
	var back pin
	if !c.busy && route.PoolMode() != ModeSession && !c.hasOpenLocked(route) {
		if p := c.pinLocked(route); p != nil && p.conn != nil {
			back = *p
			p.conn = nil
			if !c.hasPinLocked() {
				c.state.Store(uint32(stateIdle))
			}
		}
	}
	c.mu.Unlock()
	if back.conn != nil {
		route.checkIn(back.srv, back.conn)
	}
}

// cleanup runs when the client disconnects: open transactions are aborted
// upstream, then pinned connections go back to their pools.
func (c *client) cleanup() {
	c.mu.Lock()
	open := c.open
	c.open = nil
	c.mu.Unlock()
	for key, route := range open {
		c.abort(route, key)
		c.s.txnMu.Lock()
		if c.s.txnOwners[key] == c {
			delete(c.s.txnOwners, key)
		}
		c.s.txnMu.Unlock()
		if route.multi {
			route.txns.delete(key)
		}
	}
	c.mu.Lock()
	pins := c.pins
	c.pins = nil
	c.mu.Unlock()
	for _, p := range pins {
		if p.conn != nil {
			p.route.checkIn(p.srv, p.conn)
		}
	}
}

// abort sends abortTransaction for a transaction the client left open, on
// its pinned connection if it has one, else on a connection to the server
// that runs it.
func (c *client) abort(route *Route, key txnKey) {
	ctx, cancel := context.WithTimeout(context.Background(), c.s.opts.AbortTimeout)
	defer cancel()
	c.mu.Lock()
	var srv *topology.Server
	var pc *pool.Conn
	pinned := false
	if p := c.pinLocked(route); p != nil && p.conn != nil {
		srv, pc, pinned = p.srv, p.conn, true
	}
	c.mu.Unlock()
	if pc == nil {
		if route.multi {
			srv, _ = route.txns.get(key, time.Now())
		}
		if srv == nil {
			s, err := route.Topology.SelectServer(ctx)
			if err != nil {
				c.log.Warn("cannot abort transaction of disconnected client", "route", route.Name, "error", err)
				return
			}
			srv = s
		}
		var err error
		pc, err = route.checkOut(ctx, srv)
		if err != nil {
			c.log.Warn("cannot abort transaction of disconnected client", "route", route.Name, "server", srv.Address(), "error", err)
			return
		}
	}
	uc := pc.Upstream().(*upstream.Conn)
	_, err := uc.RoundTrip(ctx, "admin", abortCommand(key))
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
		route.checkIn(srv, pc)
	}
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

// reply sends a reply body we built.
func (c *client) reply(responseTo int32, compressed bool, compID wire.CompressorID, name string, body bsoncore.Document) error {
	c.nextID++
	c.out = getBuffer(len(body) + 64)
	msg := wire.AppendMsg(c.out.b[:0], c.nextID, responseTo, 0, body)
	c.out.b = msg[:0]
	return c.writeRaw(msg, compressed, compID, name)
}

// replyError sends an error reply; the client stays connected.
func (c *client) replyError(responseTo int32, compressed bool, compID wire.CompressorID, req *request, body bsoncore.Document) error {
	if req != nil && req.more {
		return nil
	}
	return c.reply(responseTo, compressed, compID, "", body)
}

// writeError sends an uncompressed error reply.
func (c *client) writeError(responseTo int32, compressed bool, compID wire.CompressorID, body bsoncore.Document) error {
	return c.reply(responseTo, compressed, compID, "", body)
}

// writeLegacyReply answers an OP_QUERY with an OP_REPLY.
func (c *client) writeLegacyReply(responseTo int32, failure bool, doc bsoncore.Document) {
	c.nextID++
	b := wire.AppendReply(nil, c.nextID, responseTo, doc)
	if failure {
		// responseFlags QueryFailure (bit 1) sits right after the header.
		binary.LittleEndian.PutUint32(b[wire.HeaderLen:], 2)
	}
	_, _ = c.nc.Write(b)
}

// writeRaw writes a whole message to the client, compressed with the
// client's compressor when the client compressed its request and the
// command may be compressed.
func (c *client) writeRaw(msg []byte, compressed bool, compID wire.CompressorID, name string) error {
	if compressed && name != "" && !wire.MustNotCompress(name) {
		buf := getBuffer(len(msg) + 64)
		defer putBuffer(buf)
		out, err := wire.Compress(buf.b[:0], msg, compID)
		if err == nil {
			if cap(out) > cap(buf.b) {
				buf.b = out[:0]
			}
			msg = out
		}
	}
	n, err := c.nc.Write(msg)
	c.bytesOut += n
	if err != nil {
		return errClientGone
	}
	return nil
}

func (c *client) releaseBuffers() {
	putBuffer(c.in)
	putBuffer(c.aux)
	putBuffer(c.out)
	c.in, c.aux, c.out = nil, nil, nil
}

// isOpen reports whether the client has transaction key open.
func (c *client) isOpen(key txnKey) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.open[key]
	return ok
}

// dropStalePins returns the pinned connections of routes a reload replaced
// or removed, unless a transaction still needs them, so that the old
// route's pools can drain and close; the client's next request on that
// database uses the new route.
func (c *client) dropStalePins() {
	c.mu.Lock()
	back := c.takePinsLocked(func(p *pin) bool { return c.s.Route(p.route.Name) != p.route })
	c.mu.Unlock()
	checkInPins(back)
}

// takePinsLocked unpins and returns the pinned connections of routes with
// no transaction open for which drop says so; the caller checks them in
// (checkInPins) once it has released c.mu.
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
		p.route.checkIn(p.srv, p.conn)
	}
}

// clearedAndReady reports whether err says srv's pool was cleared while the
// pool is ready again. It is kept out of acquire's fast path because the
// errors.As target escapes to the heap.
func clearedAndReady(err error, srv *topology.Server) bool {
	var cleared *pool.PoolClearedError
	return errors.As(err, &cleared) && srv.Pool().Stats().State == pool.StateReady
}
