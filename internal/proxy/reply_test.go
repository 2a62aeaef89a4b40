package proxy

// The reply writer: every reply we build is framed once (appendReply), so
// OP_MSG and OP_REPLY answers share one sequence of request IDs; a
// failure reaches a client in the framing its request's opcode reads; and
// every byte written is counted where the exchange reads it.

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// pipeConn is a conn writing on one end of a pipe, and a reader of the
// message that reaches the other end when write runs.
func pipeConn(t *testing.T) (*conn, *int, func(write func()) []byte) {
	t.Helper()
	a, b := net.Pipe()
	t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
	sent := new(int)
	cn := &conn{nc: a, sent: sent}
	read := func(write func()) []byte {
		t.Helper()
		done := make(chan struct{})
		go func() { defer close(done); write() }()
		defer func() {
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("the write did not return")
			}
		}()
		_ = b.SetReadDeadline(time.Now().Add(5 * time.Second))
		var hdr [wire.HeaderLen]byte
		if _, err := io.ReadFull(b, hdr[:]); err != nil {
			t.Fatal(err)
		}
		h, err := wire.ParseHeader(hdr[:])
		if err != nil {
			t.Fatal(err)
		}
		msg := make([]byte, h.MessageLength)
		copy(msg, hdr[:])
		if _, err := io.ReadFull(b, msg[wire.HeaderLen:]); err != nil {
			t.Fatal(err)
		}
		return msg
	}
	return cn, sent, read
}

func TestReplyFramingSharedAcrossOpcodes(t *testing.T) {
	cn, sent, read := pipeConn(t)
	doc := command.ErrorReply(6, "HostUnreachable", "mongobouncer: no")

	// An OP_MSG client's failure: an OP_MSG answering its request.
	m := read(func() { cn.writeFailure(7, wire.OpMsg, doc) })
	msg, err := wire.ParseMsg(m)
	if err != nil {
		t.Fatal(err)
	}
	if msg.Header.RequestID != 1 || msg.Header.ResponseTo != 7 || !bytes.Equal(msg.Body, doc) {
		t.Fatalf("OP_MSG failure: header %+v body %v", msg.Header, bson.Raw(msg.Body))
	}
	if *sent != len(m) {
		t.Fatalf("counted %d bytes, wrote %d", *sent, len(m))
	}

	// A legacy client's failure: an OP_REPLY query failure with $err, the
	// next ID of the same sequence.
	rep, err := wire.ParseReply(read(func() { cn.writeFailure(8, wire.OpQuery, doc) }))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Header.RequestID != 2 || rep.Header.ResponseTo != 8 || rep.ResponseFlags != wire.ReplyQueryFailure || len(rep.Documents) != 1 {
		t.Fatalf("OP_REPLY failure: %+v", rep)
	}
	if s, _ := rep.Documents[0].Lookup("$err").StringValueOK(); s != "mongobouncer: no" {
		t.Fatalf("OP_REPLY failure without $err: %v", bson.Raw(rep.Documents[0]))
	}

	// A legacy answer that is no failure (the OP_QUERY hello).
	rep, err = wire.ParseReply(read(func() { cn.writeLegacyReply(9, false, command.OKReply) }))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Header.RequestID != 3 || rep.Header.ResponseTo != 9 || rep.ResponseFlags&wire.ReplyQueryFailure != 0 ||
		!bytes.Equal(rep.Documents[0], command.OKReply) {
		t.Fatalf("OP_REPLY answer: %+v", rep)
	}
}

func TestProtocolErrorNamesInvalidBSON(t *testing.T) {
	cn, _, read := pipeConn(t)
	log := slog.New(slog.DiscardHandler)
	var ended error
	msg, err := wire.ParseMsg(read(func() { ended = cn.protocolError(log, 4, wire.ErrInvalidBSON) }))
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := msg.Body.Lookup("code").AsInt32OK(); code != 22 || msg.Header.ResponseTo != 4 {
		t.Fatalf("protocol error reply: %v to %d, want code 22 to 4", bson.Raw(msg.Body), msg.Header.ResponseTo)
	}
	if ended != wire.ErrInvalidBSON {
		t.Fatalf("protocolError returned %v, want the error that ends the client", ended)
	}
}

func TestReplyErrorSilentForMoreToCome(t *testing.T) {
	cn, sent, _ := pipeConn(t)
	req := &command.Request{More: true}
	if err := cn.replyError(1, false, 0, req, command.ErrorReply(6, "HostUnreachable", "x")); err != nil || *sent != 0 {
		t.Fatalf("moreToCome request got a reply (%d bytes, %v)", *sent, err)
	}
}
