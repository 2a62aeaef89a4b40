package proxy

// Dispatch: what mongobouncer does with each client message. The handshake
// (hello, isMaster, legacy OP_QUERY hello) and the admin commands are
// answered here; authentication commands go to auth.go, which also
// decides what a client may run before it has logged in; malformed messages get a protocol error; every
// other command goes to its route (relay.go). The replies are written by
// reply.go.

import (
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/hello"
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
			return c.protocolError(c.log, h.RequestID, err)
		}
		// A pooled buffer; Decompress grows it to the declared size, which
		// it has checked against the limit first.
		c.aux = getBuffer(0)
		limit := c.login.readLimit(c.s, c.maxMsg)
		inner, err := wire.Decompress(c.aux.b[:0], msg, limit)
		if err != nil {
			if errors.Is(err, wire.ErrMessageTooLarge) && c.login.pending(c.s) && limit == c.s.preLoginLimit() {
				err = fmt.Errorf("before login, at most max_prelogin_message_size (%d bytes): %w", limit, err)
			}
			return c.protocolError(c.log, h.RequestID, err)
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
		return c.protocolError(c.log, h.RequestID, fmt.Errorf("opcode %d is not supported by mongobouncer: %w", int32(h.OpCode), wire.ErrUnknownOpCode))
	}
}

// handleQuery serves legacy OP_QUERY, which modern drivers use only for the
// first hello; other commands are translated to OP_MSG (command/legacy.go).
func (c *client) handleQuery(msg []byte, h wire.Header) error {
	q, err := wire.ParseQuery(msg)
	if err != nil {
		return c.protocolErrorOp(c.log, h.RequestID, wire.OpQuery, err)
	}
	cmd := q.Query
	if v, err := cmd.LookupErr("$query"); err == nil {
		if d, ok := v.DocumentOK(); ok {
			cmd = d
		}
	}
	name := wire.CommandName(cmd)
	if ci := command.Lookup(name); ci.Kind == command.Hello && command.IsCmdNamespace(q.FullCollectionName) {
		hr := hello.Parse(cmd, name)
		c.writeLegacyReply(h.RequestID, false, c.answerHello(cmd, &hr))
		return nil
	}
	db := command.LegacyDatabase(q.FullCollectionName)
	if db == "" {
		doc := command.ErrorReply(352, "UnsupportedOpQueryCommand",
			fmt.Sprintf("mongobouncer: OP_QUERY is only supported for commands (on \"<db>.$cmd\"), not on %q; the client driver may require an upgrade", q.FullCollectionName))
		c.writeFailure(h.RequestID, wire.OpQuery, doc)
		return nil
	}
	m, err := command.LegacyCommand(nil, q, db)
	if err != nil {
		c.writeFailure(h.RequestID, wire.OpQuery, command.ErrorReply(2, "BadValue", "mongobouncer: "+err.Error()))
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

// handleMsg serves one OP_MSG request, as admit decides.
func (c *client) handleMsg(msg []byte, h wire.Header, compressed bool, compID wire.CompressorID) error {
	if err := wire.ParseMsgInto(msg, &c.msg); err != nil {
		return c.protocolError(c.log, h.RequestID, err)
	}
	req := &c.x.req
	req.Inspect(c.msg.Body)
	req.Exhaust = c.msg.Flags&wire.FlagExhaustAllowed != 0
	req.More = c.msg.Flags&wire.FlagMoreToCome != 0
	route := c.s.routeOf(c.only, req)
	v := c.s.admit(c.login.Ident, &c.sess, len(msg), c.msg.Flags, req, route)
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
	case c.login.pending(c.s):
		doc = c.s.preLoginAnswer(req)
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
