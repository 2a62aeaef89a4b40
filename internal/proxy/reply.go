package proxy

// The one writer of replies to a client on its goroutine: our own replies,
// framed once (appendReply, which the loop path and the hello stream use
// too), and relayed ones (writeRaw), each translated to an OP_REPLY for a
// legacy OP_QUERY request and compressed when the request was; and the
// failures a client gets in the framing its request's opcode reads
// (protocol errors, refusals). These are methods of conn, the connection
// they write on: they need its socket, its buffers, its reply IDs and
// nothing else of the client.

import (
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"time"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// appendReply appends our own reply to the client's request responseTo,
// an OP_MSG of body with flags, to dst: the one framing of every reply we
// build, on either path (an OP_REPLY is this message translated,
// writeLegacyReply).
func (cn *conn) appendReply(dst []byte, responseTo int32, flags wire.MsgFlags, body []byte) []byte {
	cn.nextID++
	return wire.AppendMsg(dst, cn.nextID, responseTo, flags, body)
}

// writeLegacyReply answers an OP_QUERY with an OP_REPLY of doc, framed as
// every reply we build and translated as a relayed one; failure sets
// QueryFailure, for a request refused as a query (doc then carries $err,
// command.LegacyError), not a command's ok: 0.
func (cn *conn) writeLegacyReply(responseTo int32, failure bool, doc bsoncore.Document) {
	b := command.LegacyReply(nil, cn.appendReply(nil, responseTo, 0, doc))
	if failure {
		// responseFlags sit right after the header: QueryFailure alone,
		// as before this framing was shared.
		binary.LittleEndian.PutUint32(b[wire.HeaderLen:], uint32(wire.ReplyQueryFailure))
	}
	_, _ = cn.nc.Write(b)
}

// writeFailure answers the request requestID of opcode op with the error
// reply doc, uncompressed, in the framing the client reads for it: an
// OP_REPLY query failure for a legacy OP_QUERY, else an OP_MSG. The client
// is ended after it, so a failed write changes nothing.
func (cn *conn) writeFailure(requestID int32, op wire.OpCode, doc bsoncore.Document) {
	if op == wire.OpQuery {
		cn.writeLegacyReply(requestID, true, command.LegacyError(doc))
		return
	}
	_ = cn.reply(requestID, false, 0, "", doc)
}

// protocolError answers a malformed message with an error reply, when the
// client can still read one, and returns err, which ends the client.
func (cn *conn) protocolError(log *slog.Logger, requestID int32, err error) error {
	return cn.protocolErrorOp(log, requestID, wire.OpMsg, err)
}

// protocolErrorOp is protocolError for a request of opcode op: a legacy
// OP_QUERY client can only read an OP_REPLY.
func (cn *conn) protocolErrorOp(log *slog.Logger, requestID int32, op wire.OpCode, err error) error {
	log.Warn("client protocol error", "error", err)
	code, codeName := int32(17), "ProtocolError"
	if errors.Is(err, wire.ErrInvalidBSON) {
		code, codeName = 22, "InvalidBSON"
	}
	_ = cn.nc.SetWriteDeadline(time.Now().Add(time.Second))
	cn.writeFailure(requestID, op, command.ErrorReply(code, codeName, "mongobouncer: "+err.Error()))
	_ = cn.nc.SetWriteDeadline(time.Time{})
	return err
}

// refuse answers a client over max_client_conn: it reads the first message
// (with a short deadline) so that the error reply can name its request, and
// closes the connection.
func (cn *conn) refuse(log *slog.Logger, reason string) {
	defer cn.closeConn()
	log.Warn("client refused", "reason", reason)
	_ = cn.nc.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.ReadFull(cn.nc, cn.hdr[:]); err != nil {
		return
	}
	h, err := wire.ParseHeader(cn.hdr[:])
	if err != nil {
		return
	}
	cn.writeFailure(h.RequestID, h.OpCode, command.ErrorReply(command.CodeHostUnreachable, "HostUnreachable", reason))
}

// reply sends a reply body we built.
func (cn *conn) reply(responseTo int32, compressed bool, compID wire.CompressorID, name string, body bsoncore.Document) error {
	return cn.replyFlags(responseTo, 0, compressed, compID, name, body)
}

// replyFlags sends a reply body we built with OP_MSG flags (moreToCome in
// an exhaust stream); its requestID is cn.nextID after.
func (cn *conn) replyFlags(responseTo int32, flags wire.MsgFlags, compressed bool, compID wire.CompressorID, name string, body bsoncore.Document) error {
	cn.out = getBuffer(len(body) + 64)
	msg := cn.appendReply(cn.out.b[:0], responseTo, flags, body)
	cn.out.b = msg[:0]
	return cn.writeRaw(msg, compressed, compID, name)
}

// replyError sends an error reply, unless req asked for none
// (moreToCome); the client stays connected.
func (cn *conn) replyError(responseTo int32, compressed bool, compID wire.CompressorID, req *command.Request, body bsoncore.Document) error {
	if req != nil && req.More {
		return nil
	}
	return cn.reply(responseTo, compressed, compID, "", body)
}

// writeRaw writes a whole message to the client, compressed with the
// client's compressor when the client compressed its request and the
// command (name) may be compressed, and counts it in *cn.sent.
func (cn *conn) writeRaw(msg []byte, compressed bool, compID wire.CompressorID, name string) error {
	if cn.legacy {
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
	n, err := cn.nc.Write(msg)
	*cn.sent += n
	if err != nil {
		return errClientGone
	}
	return nil
}
