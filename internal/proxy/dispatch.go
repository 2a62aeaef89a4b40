package proxy

// Dispatch: what mongobouncer does with each client message. The handshake
// (hello, isMaster, legacy OP_QUERY hello) and the admin commands are
// answered here; authentication commands go to auth.go, which also
// decides what a client may run before it has logged in; malformed messages get a protocol error; every
// other command goes to its route (relay.go). The replies mongobouncer
// builds itself are written from here too.

import (
	"errors"
	"fmt"
	"io"
	"time"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

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
		// Nothing is inflated with a compressor the client's hello did
		// not agree on, nor to more than the client may send now.
		if err := c.checkCompressed(msg); err != nil {
			return c.protocolError(h.RequestID, err)
		}
		// A pooled buffer; Decompress grows it to the declared size, which
		// it has checked against the limit first.
		c.aux = getBuffer(0)
		limit := c.readLimit()
		inner, err := wire.Decompress(c.aux.b[:0], msg, limit)
		if err != nil {
			if errors.Is(err, wire.ErrMessageTooLarge) && c.preLogin() && limit == c.s.preLoginLimit() {
				err = fmt.Errorf("before login, at most max_prelogin_message_size (%d bytes): %w", limit, err)
			}
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
	doc := command.ErrorReply(code, codeName, "mongobouncer: "+err.Error())
	_ = c.nc.SetWriteDeadline(time.Now().Add(time.Second))
	if op == wire.OpQuery {
		c.writeLegacyReply(requestID, true, command.LegacyError(doc))
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
	doc := command.ErrorReply(6, "HostUnreachable", reason)
	if h.OpCode == wire.OpQuery {
		c.writeLegacyReply(h.RequestID, true, command.LegacyError(doc))
		return
	}
	_ = c.writeError(h.RequestID, false, 0, doc)
}

// handleQuery serves legacy OP_QUERY, which modern drivers use only for the
// first hello; other commands are translated to OP_MSG (command/legacy.go).
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
	if ci := command.Lookup(name); ci.Kind == command.Hello && command.IsCmdNamespace(q.FullCollectionName) {
		doc := c.answerHello(cmd, name)
		c.writeLegacyReply(h.RequestID, false, doc)
		return nil
	}
	db := command.LegacyDatabase(q.FullCollectionName)
	if db == "" {
		doc := command.ErrorReply(352, "UnsupportedOpQueryCommand",
			fmt.Sprintf("mongobouncer: OP_QUERY is only supported for commands (on \"<db>.$cmd\"), not on %q; the client driver may require an upgrade", q.FullCollectionName))
		c.writeLegacyReply(h.RequestID, true, command.LegacyError(doc))
		return nil
	}
	m, err := command.LegacyCommand(nil, q, db)
	if err != nil {
		c.writeLegacyReply(h.RequestID, true, command.LegacyError(command.ErrorReply(2, "BadValue", "mongobouncer: "+err.Error())))
		return nil
	}
	// The command takes the OP_MSG path; every reply to it, built here or
	// relayed, goes back as an OP_REPLY (writeRaw). m is the request's own
	// buffer: the exchange keeps views into it until handleMsg returns.
	c.legacy = true
	defer func() { c.legacy = false }()
	mh, _ := wire.ParseHeader(m)
	return c.handleMsg(m, mh, false, 0)
}

// answerHello handles a client handshake or heartbeat.
func (c *client) answerHello(body bsoncore.Document, name string) bsoncore.Document {
	hr := parseHello(body, name)
	if hr.apiVersion != "" && hr.apiVersion != "1" {
		return hr.apiVersionError()
	}
	a := parseAwait(body)
	if doc := c.s.checkAwait(&a); doc != nil {
		return doc
	}
	lim := c.s.waitLimits()
	if !c.hello {
		c.hello = true
		c.sess.setHelloInfo(hr.appName, hr.loadBalanced)
		c.log = c.log.With("appName", hr.appName)
	}
	if int(lim.maxMsg) < c.maxMsg {
		c.maxMsg = int(lim.maxMsg)
	}
	compressor := ""
	for _, want := range hr.compression {
		if c.s.offers(want) {
			compressor = want
			// The client may compress with it from now on (checkCompressed).
			id, _ := wire.CompressorByName(want)
			c.comp |= 1 << id
			break
		}
	}
	if c.s.draining.Load() {
		// Quiesce, as a mongos shutting down: drivers mark us Unknown and
		// select another mongobouncer (awaithello.go).
		return c.s.quiesceReply()
	}
	return c.helloAuth(body, c.s.plainHello(hr, lim, c.id, compressor))
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

// handleMsg serves one OP_MSG request, as admit decides.
func (c *client) handleMsg(msg []byte, h wire.Header, compressed bool, compID wire.CompressorID) error {
	if err := wire.ParseMsgInto(msg, &c.msg); err != nil {
		return c.protocolError(h.RequestID, err)
	}
	req := &c.x.req
	req.Inspect(c.msg.Body)
	req.Exhaust = c.msg.Flags&wire.FlagExhaustAllowed != 0
	req.More = c.msg.Flags&wire.FlagMoreToCome != 0
	route := c.s.routeOf(c.only, req)
	v := c.admit(len(msg), c.msg.Flags, req, route)
	switch v.kind {
	case admitRefuse:
		return c.replyError(h.RequestID, compressed, compID, req, v.reply)
	case admitAnswer:
		return c.answer(h.RequestID, compressed, compID, req)
	}
	return c.forward(route, msg, h, compressed, compID)
}

// answer serves a request mongobouncer answers itself (admitAnswer).
func (c *client) answer(responseTo int32, compressed bool, compID wire.CompressorID, req *command.Request) error {
	var doc bsoncore.Document
	switch {
	case req.Info.Kind == command.Hello:
		return c.serveHello(responseTo, compressed, compID, req)
	case req.Info.Kind == command.Auth:
		return c.handleAuth(responseTo, compressed, compID, req)
	case c.preLogin():
		doc = c.preLoginAnswer(req)
	case string(req.DB) == AdminDatabase:
		return c.replyError(responseTo, compressed, compID, req, c.s.opts.Admin.HandleAdmin(c.nc.RemoteAddr(), c.msg.Body))
	default: // endSessions with no route
		doc = command.OKReply
	}
	if req.More {
		return nil // moreToCome: the client reads no reply
	}
	return c.reply(responseTo, compressed, compID, req.Name(), doc)
}

// reply sends a reply body we built.
func (c *client) reply(responseTo int32, compressed bool, compID wire.CompressorID, name string, body bsoncore.Document) error {
	return c.replyFlags(responseTo, 0, compressed, compID, name, body)
}

// replyFlags sends a reply body we built with OP_MSG flags (moreToCome in
// an exhaust stream); its requestID is c.nextID after.
func (c *client) replyFlags(responseTo int32, flags wire.MsgFlags, compressed bool, compID wire.CompressorID, name string, body bsoncore.Document) error {
	c.out = getBuffer(len(body) + 64)
	msg := c.appendReply(c.out.b[:0], responseTo, flags, body)
	c.out.b = msg[:0]
	return c.writeRaw(msg, compressed, compID, name)
}

// replyError sends an error reply; the client stays connected.
func (c *client) replyError(responseTo int32, compressed bool, compID wire.CompressorID, req *command.Request, body bsoncore.Document) error {
	if req != nil && req.More {
		return nil
	}
	return c.reply(responseTo, compressed, compID, "", body)
}

// writeError sends an uncompressed error reply.
func (c *client) writeError(responseTo int32, compressed bool, compID wire.CompressorID, body bsoncore.Document) error {
	return c.reply(responseTo, compressed, compID, "", body)
}

// writeRaw writes a whole message to the client, compressed with the
// client's compressor when the client compressed its request and the
// command may be compressed.
func (c *client) writeRaw(msg []byte, compressed bool, compID wire.CompressorID, name string) error {
	if c.legacy {
		buf := getBuffer(len(msg) + 64)
		defer putBuffer(buf)
		msg = command.LegacyReply(buf.b[:0], msg)
		if cap(msg) > cap(buf.b) {
			buf.b = msg[:0]
		}
		compressed = false
	}
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
	c.x.bytesOut += n
	if err != nil {
		return errClientGone
	}
	return nil
}
