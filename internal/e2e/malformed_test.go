package e2e

import (
	"bytes"
	"compress/zlib"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
	"go.uber.org/goleak"

	"github.com/mongobouncer/mongobouncer/internal/app"
	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// This file is the malformed-input catalogue: raw bytes a broken or hostile
// client may send, each checked for the answer mongobouncer gives that
// client, while a well-behaved driver and a raw client keep working on the
// same process.

// malOutcome is what the offending client must see.
type malOutcome int

const (
	// malReplyClose: one well-formed error reply naming the request, then
	// the connection is closed (the stream position is lost or the client
	// speaks something we will not serve).
	malReplyClose malOutcome = iota
	// malClose: the connection is closed without a reply (the client
	// vanished mid-message; there is no one to answer).
	malClose
	// malReplyStay: an error reply, and the connection stays usable (the
	// message was well formed, only the command was wrong).
	malReplyStay
)

// malCase is one entry of the catalogue.
type malCase struct {
	name string
	// msg builds the bytes to send; id is the requestID to use, which an
	// error reply must echo in responseTo.
	msg func(id int32) []byte
	// halfClose shuts the client's write side after sending.
	halfClose bool
	want      malOutcome
	// replyOp is the opcode of the expected reply; 0 means OP_MSG.
	replyOp wire.OpCode
	// code is the expected error code; 0 accepts any non-zero code.
	code int32
	// errmsg must occur in the reply's errmsg.
	errmsg string
	// agree is the compressor a hello agrees on before msg is sent ("" for
	// no hello): mongobouncer inflates nothing else.
	agree string
}

// Message builders. Each returns fresh bytes so cases can mutate them.

func malU32(v int32) []byte { return binary.LittleEndian.AppendUint32(nil, uint32(v)) }

func malHeader(length, id int32, op wire.OpCode) []byte {
	return wire.AppendHeader(nil, wire.Header{MessageLength: length, RequestID: id, OpCode: op})
}

// malFrame builds a message of opcode op whose messageLength is right.
func malFrame(id int32, op wire.OpCode, parts ...[]byte) []byte {
	var p []byte
	for _, x := range parts {
		p = append(p, x...)
	}
	return append(malHeader(int32(wire.HeaderLen+len(p)), id, op), p...)
}

func malKind0(doc []byte) []byte { return append([]byte{0}, doc...) }

func malKind1(ident string, docs ...[]byte) []byte {
	var d []byte
	for _, x := range docs {
		d = append(d, x...)
	}
	out := append([]byte{1}, malU32(int32(4+len(ident)+1+len(d)))...)
	out = append(out, ident...)
	out = append(out, 0)
	return append(out, d...)
}

// malPing is {ping: 1, $db: "admin"}.
func malPing() []byte {
	return bsoncore.NewDocumentBuilder().AppendInt32("ping", 1).AppendString("$db", "admin").Build()
}

func malOpMsg(id int32, flags wire.MsgFlags, sections ...[]byte) []byte {
	return malFrame(id, wire.OpMsg, append([][]byte{malU32(int32(flags))}, sections...)...)
}

// malCompress wraps msg in OP_COMPRESSED, then lets edit change the fixed
// fields (originalOpcode at 16, uncompressedSize at 20, compressorId at 24).
func malCompress(t testing.TB, msg []byte, comp wire.CompressorID, edit func(b []byte)) []byte {
	out, err := wire.Compress(nil, msg, comp)
	if err != nil {
		t.Fatalf("compress: %v", err)
	}
	if edit != nil {
		edit(out)
	}
	return out
}

func malZlib(t testing.TB, b []byte) []byte {
	var buf bytes.Buffer
	w, err := zlib.NewWriterLevel(&buf, zlib.BestSpeed)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// malLegacyInsert is a removed OP_INSERT (2002) of one document.
func malLegacyInsert(id int32) []byte {
	doc := bsoncore.NewDocumentBuilder().AppendInt32("x", 1).Build()
	return malFrame(id, wire.OpInsert, malU32(0), []byte("test.c\x00"), doc)
}

// malCatalogue returns the cases. zeros8MB is a zlib stream of 8 MB of
// zero bytes (about 8 KB): the payload of the decompression bombs.
func malCatalogue(t testing.TB, zeros8MB []byte) []malCase {
	badType := func() []byte {
		d := malPing()
		d[4] = 0x20 // element type of "ping": not a BSON type
		return d
	}
	noTerm := func() []byte {
		d := malPing()
		d[len(d)-1] = 1
		return d
	}
	longLen := func() []byte {
		d := malPing()
		binary.LittleEndian.PutUint32(d, 1000)
		return d
	}
	pingMsg := func(id int32) []byte { return malOpMsg(id, 0, malKind0(malPing())) }
	compressedPing := func(id int32, comp wire.CompressorID, edit func([]byte)) []byte {
		return malCompress(t, pingMsg(id), comp, edit)
	}
	setSize := func(n int32) func([]byte) {
		return func(b []byte) { binary.LittleEndian.PutUint32(b[20:], uint32(n)) }
	}
	return []malCase{
		// Framing.
		{name: "messageLength below header size", msg: func(id int32) []byte { return malHeader(8, id, wire.OpMsg) },
			want: malReplyClose, code: 17, errmsg: "message too small"},
		{name: "messageLength zero", msg: func(id int32) []byte { return malHeader(0, id, wire.OpMsg) },
			want: malReplyClose, code: 17, errmsg: "message too small"},
		{name: "messageLength negative", msg: func(id int32) []byte { return malHeader(-1, id, wire.OpMsg) },
			want: malReplyClose, code: 17, errmsg: "message too small"},
		{name: "messageLength 2 GB", msg: func(id int32) []byte { return malHeader(1<<31-1, id, wire.OpMsg) },
			want: malReplyClose, code: 17, errmsg: "message too large"},
		{name: "messageLength one over the default limit", msg: func(id int32) []byte {
			return malHeader(wire.DefaultMaxMessageSize+1, id, wire.OpMsg)
		}, want: malReplyClose, code: 17, errmsg: "message too large"},
		{name: "partial header then EOF", msg: func(id int32) []byte { return pingMsg(id)[:7] },
			halfClose: true, want: malClose},
		{name: "header only then EOF", msg: func(id int32) []byte { return pingMsg(id)[:wire.HeaderLen] },
			halfClose: true, want: malClose},
		{name: "truncated body then EOF", msg: func(id int32) []byte { m := pingMsg(id); return m[:len(m)-5] },
			halfClose: true, want: malClose},

		// Opcodes.
		{name: "unknown opcode 9999", msg: func(id int32) []byte { return malFrame(id, 9999, malU32(0), malPing()) },
			want: malReplyClose, code: 17, errmsg: "opcode 9999"},
		{name: "removed OP_INSERT", msg: malLegacyInsert, want: malReplyClose, code: 17, errmsg: "opcode 2002"},
		{name: "removed OP_GET_MORE", msg: func(id int32) []byte {
			return malFrame(id, wire.OpGetMore, malU32(0), []byte("test.c\x00"), malU32(0), make([]byte, 8))
		}, want: malReplyClose, code: 17, errmsg: "opcode 2005"},
		{name: "OP_REPLY sent by a client", msg: func(id int32) []byte { return wire.AppendReply(nil, id, 0, malPing()) },
			want: malReplyClose, code: 17, errmsg: "opcode 1 "},

		// OP_MSG structure.
		{name: "OP_MSG unknown required flag bit", msg: func(id int32) []byte { return malOpMsg(id, 1<<2, malKind0(malPing())) },
			want: malReplyClose, code: 17, errmsg: "unknown required OP_MSG flag bits"},
		{name: "OP_MSG flags only", msg: func(id int32) []byte { return malOpMsg(id, 0) },
			want: malReplyClose, code: 17, errmsg: "too short"},
		{name: "OP_MSG without kind-0 section", msg: func(id int32) []byte {
			return malOpMsg(id, 0, malKind1("documents", malPing()))
		}, want: malReplyClose, code: 17, errmsg: "no kind-0 section"},
		{name: "OP_MSG with two kind-0 sections", msg: func(id int32) []byte {
			return malOpMsg(id, 0, malKind0(malPing()), malKind0(malPing()))
		}, want: malReplyClose, code: 17, errmsg: "more than one kind-0 section"},
		{name: "OP_MSG unknown section kind", msg: func(id int32) []byte {
			sec := malKind0(malPing())
			sec[0] = 2
			return malOpMsg(id, 0, sec)
		}, want: malReplyClose, code: 17, errmsg: "unknown section kind 2"},
		{name: "kind-1 size overruns the message", msg: func(id int32) []byte {
			k1 := malKind1("documents", malPing())
			binary.LittleEndian.PutUint32(k1[1:], 1000)
			return malOpMsg(id, 0, malKind0(malPing()), k1)
		}, want: malReplyClose, code: 17, errmsg: "kind-1 size 1000 out of range"},
		{name: "kind-1 identifier repeated", msg: func(id int32) []byte {
			return malOpMsg(id, 0, malKind0(malPing()), malKind1("documents", malPing()), malKind1("documents", malPing()))
		}, want: malReplyClose, code: 17, errmsg: "duplicate kind-1 identifier"},
		{name: "bad CRC-32C checksum", msg: func(id int32) []byte {
			m := wire.AppendMsg(nil, id, 0, wire.FlagChecksumPresent, malPing())
			m[len(m)-1] ^= 0xff
			return m
		}, want: malReplyClose, code: 17, errmsg: "checksum"},

		// BSON.
		{name: "BSON length beyond its section", msg: func(id int32) []byte { return malOpMsg(id, 0, malKind0(longLen())) },
			want: malReplyClose, code: 22, errmsg: "invalid BSON"},
		{name: "BSON missing terminator", msg: func(id int32) []byte { return malOpMsg(id, 0, malKind0(noTerm())) },
			want: malReplyClose, code: 22, errmsg: "not NUL-terminated"},
		{name: "BSON unknown element type", msg: func(id int32) []byte { return malOpMsg(id, 0, malKind0(badType())) },
			want: malReplyClose, code: 22, errmsg: "unknown element type"},
		{name: "BSON invalid in a kind-1 document", msg: func(id int32) []byte {
			ins := bsoncore.NewDocumentBuilder().AppendString("insert", "c").AppendString("$db", "test").Build()
			return malOpMsg(id, 0, malKind0(ins), malKind1("documents", noTerm()))
		}, want: malReplyClose, code: 22, errmsg: "kind-1 document"},

		// OP_COMPRESSED.
		{name: "OP_COMPRESSED fixed fields truncated", msg: func(id int32) []byte {
			return malFrame(id, wire.OpCompressed, malU32(int32(wire.OpMsg)), []byte{1})
		}, want: malReplyClose, code: 17, errmsg: "truncated"},
		{name: "OP_COMPRESSED unknown compressor", msg: func(id int32) []byte {
			return compressedPing(id, wire.CompressorNoop, func(b []byte) { b[24] = 9 })
		}, want: malReplyClose, code: 17, errmsg: "unknown compressor"},
		{name: "OP_COMPRESSED decompression bomb", msg: func(id int32) []byte {
			return malFrame(id, wire.OpCompressed, malU32(int32(wire.OpMsg)), malU32(1<<30), []byte{byte(wire.CompressorZlib)}, zeros8MB)
		}, want: malReplyClose, code: 17, errmsg: "exceeds limit", agree: "zlib"},
		{name: "OP_COMPRESSED bomb behind a small declared size", msg: func(id int32) []byte {
			return malFrame(id, wire.OpCompressed, malU32(int32(wire.OpMsg)), malU32(1000), []byte{byte(wire.CompressorZlib)}, zeros8MB)
		}, want: malReplyClose, code: 17, errmsg: "size", agree: "zlib"},
		{name: "OP_COMPRESSED declared size too large", msg: func(id int32) []byte {
			return compressedPing(id, wire.CompressorZlib, func(b []byte) {
				binary.LittleEndian.PutUint32(b[20:], binary.LittleEndian.Uint32(b[20:])+100)
			})
		}, want: malReplyClose, code: 17, errmsg: "size", agree: "zlib"},
		{name: "OP_COMPRESSED negative declared size", msg: func(id int32) []byte {
			return compressedPing(id, wire.CompressorZlib, setSize(-5))
		}, want: malReplyClose, code: 17, errmsg: "negative uncompressedSize", agree: "zlib"},
		{name: "OP_COMPRESSED corrupt snappy data", msg: func(id int32) []byte {
			return malFrame(id, wire.OpCompressed, malU32(int32(wire.OpMsg)), malU32(40), []byte{byte(wire.CompressorSnappy)},
				[]byte{0x28, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
		}, want: malReplyClose, code: 17, errmsg: "decompress", agree: "snappy"},
		{name: "OP_COMPRESSED nested", msg: func(id int32) []byte {
			return compressedPing(id, wire.CompressorSnappy, func(b []byte) {
				binary.LittleEndian.PutUint32(b[16:], uint32(wire.OpCompressed))
			})
		}, want: malReplyClose, code: 17, errmsg: "nested", agree: "snappy"},
		{name: "OP_COMPRESSED wrapping OP_INSERT", msg: func(id int32) []byte {
			return malCompress(t, malLegacyInsert(id), wire.CompressorSnappy, nil)
		}, want: malReplyClose, code: 17, errmsg: "opcode 2002", agree: "snappy"},
		{name: "OP_COMPRESSED wrapping a bad OP_MSG", msg: func(id int32) []byte {
			return malCompress(t, malOpMsg(id, 0, malKind0(noTerm())), wire.CompressorZlib, nil)
		}, want: malReplyClose, code: 22, errmsg: "invalid BSON", agree: "zlib"},
		{name: "OP_COMPRESSED with a compressor no hello agreed on", msg: func(id int32) []byte {
			return compressedPing(id, wire.CompressorZstd, nil)
		}, want: malReplyClose, code: 17, errmsg: "did not agree on (agreed: none)"},
		{name: "OP_COMPRESSED with another compressor than the agreed one", msg: func(id int32) []byte {
			return compressedPing(id, wire.CompressorZstd, nil)
		}, want: malReplyClose, code: 17, errmsg: "did not agree on (agreed: zlib)", agree: "zlib"},

		// Legacy OP_QUERY.
		{name: "OP_QUERY command asking for exhaust", msg: func(id int32) []byte {
			return wire.AppendQuery(nil, id, queryExhaust, "test.$cmd", 0, -1, malPing())
		}, want: malReplyStay, replyOp: wire.OpReply, code: 2, errmsg: "Exhaust"},
		{name: "OP_QUERY command with a $query that is not a document", msg: func(id int32) []byte {
			return wire.AppendQuery(nil, id, 0, "test.$cmd", 0, -1, bsoncore.NewDocumentBuilder().AppendInt32("$query", 1).Build())
		}, want: malReplyStay, replyOp: wire.OpReply, code: 2, errmsg: "$query"},
		{name: "OP_QUERY find on a collection", msg: func(id int32) []byte {
			return wire.AppendQuery(nil, id, 0, "test.c", 0, 0, bsoncore.NewDocumentBuilder().Build())
		}, want: malReplyStay, replyOp: wire.OpReply, code: 352, errmsg: "test.c"},
		{name: "OP_QUERY truncated", msg: func(id int32) []byte {
			return malFrame(id, wire.OpQuery, malU32(0), []byte("admin.$cmd"))
		}, want: malReplyClose, replyOp: wire.OpReply, code: 17, errmsg: "not NUL-terminated"},
		{name: "OP_QUERY invalid BSON", msg: func(id int32) []byte {
			return wire.AppendQuery(nil, id, 0, "admin.$cmd", 0, -1, noTerm())
		}, want: malReplyClose, replyOp: wire.OpReply, code: 22, errmsg: "invalid BSON"},

		// Well-formed messages carrying bad commands: the client stays.
		{name: "command without $db", msg: func(id int32) []byte {
			return malOpMsg(id, 0, malKind0(bsoncore.NewDocumentBuilder().AppendInt32("ping", 1).Build()))
		}, want: malReplyStay, code: 40571, errmsg: "$db"},
		{name: "$db not a string", msg: func(id int32) []byte {
			return malOpMsg(id, 0, malKind0(bsoncore.NewDocumentBuilder().AppendInt32("ping", 1).AppendInt32("$db", 5).Build()))
		}, want: malReplyStay, code: 40571, errmsg: "$db"},
		{name: "empty command document", msg: func(id int32) []byte {
			return malOpMsg(id, 0, malKind0(bsoncore.NewDocumentBuilder().Build()))
		}, want: malReplyStay},
	}
}

// malReply is a reply read back by malRecv.
type malReply struct {
	op         wire.OpCode
	responseTo int32
	replyFlags int32 // OP_REPLY responseFlags
	body       bson.Raw
}

// malRecv reads and fully validates one reply.
func malRecv(c net.Conn, d time.Duration) (malReply, error) {
	_ = c.SetReadDeadline(time.Now().Add(d))
	msg, err := wire.ReadMessage(c, nil, wire.DefaultMaxMessageSize)
	if err != nil {
		return malReply{}, err
	}
	h, err := wire.ParseHeader(msg)
	if err != nil {
		return malReply{}, err
	}
	r := malReply{op: h.OpCode, responseTo: h.ResponseTo}
	switch h.OpCode {
	case wire.OpMsg:
		m, err := wire.ParseMsg(msg)
		if err != nil {
			return r, err
		}
		if m.Flags != 0 || len(m.Sequences) != 0 {
			return r, fmt.Errorf("error reply has flags %v and %d sequences", m.Flags, len(m.Sequences))
		}
		r.body = bson.Raw(m.Body)
	case wire.OpReply:
		rp, err := wire.ParseReply(msg)
		if err != nil {
			return r, err
		}
		if len(rp.Documents) != 1 {
			return r, fmt.Errorf("OP_REPLY with %d documents", len(rp.Documents))
		}
		r.replyFlags = rp.ResponseFlags
		r.body = bson.Raw(rp.Documents[0])
	default:
		return r, fmt.Errorf("reply has opcode %v", h.OpCode)
	}
	return r, nil
}

// malCheckError checks that body is a clear mongobouncer error reply.
func malCheckError(t testing.TB, body bson.Raw, code int32, errmsg string) {
	t.Helper()
	if okOf(body) != 0 {
		t.Fatalf("ok = %v, want 0: %v", okOf(body), body)
	}
	msg, _ := body.Lookup("errmsg").StringValueOK()
	if !strings.HasPrefix(msg, "mongobouncer: ") || !strings.Contains(msg, errmsg) {
		t.Fatalf("errmsg %q: want a mongobouncer error mentioning %q", msg, errmsg)
	}
	if name, _ := body.Lookup("codeName").StringValueOK(); name == "" {
		t.Fatalf("no codeName: %v", body)
	}
	got := codeOf(body)
	if code != 0 && got != code || got == 0 {
		t.Fatalf("code %d, want %d: %v", got, code, body)
	}
}

// malDrain reads until the peer closes or d passes, and reports how many
// bytes arrived and whether it was closed.
func malDrain(c net.Conn, d time.Duration) (n int, closed bool) {
	_ = c.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 4096)
	for {
		k, err := c.Read(buf)
		n += k
		if err != nil {
			var ne net.Error
			return n, !(errors.As(err, &ne) && ne.Timeout())
		}
	}
}

func malPingCmd() bson.D { return bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}} }

// malRun sends one case on a fresh connection and checks the outcome.
func malRun(t *testing.T, addr string, id int32, tc malCase) {
	r := dialRaw(t, addr)
	if tc.agree != "" {
		rep := r.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "compression", Value: bson.A{tc.agree}}, {Key: "$db", Value: "admin"}})
		if comp, _ := rep.Lookup("compression").ArrayOK(); len(comp) == 0 {
			t.Fatalf("%s not agreed: %v", tc.agree, rep)
		}
	}
	r.sendRaw(tc.msg(id))
	if tc.halfClose {
		if err := r.c.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
	}
	if tc.want == malClose {
		n, closed := malDrain(r.c, 10*time.Second)
		if n > 0 {
			t.Fatalf("got %d bytes, want the connection closed without a reply", n)
		}
		if !closed {
			t.Fatal("connection still open 10s after the client stopped mid-message")
		}
		return
	}
	rep, err := malRecv(r.c, 10*time.Second)
	if err != nil {
		t.Fatalf("want a well-formed error reply, got %v", err)
	}
	wantOp := tc.replyOp
	if wantOp == 0 {
		wantOp = wire.OpMsg
	}
	if rep.op != wantOp {
		t.Fatalf("reply opcode %v, want %v", rep.op, wantOp)
	}
	if rep.responseTo != id {
		t.Fatalf("responseTo %d, want the request's id %d", rep.responseTo, id)
	}
	malCheckError(t, rep.body, tc.code, tc.errmsg)
	if rep.op == wire.OpReply {
		if rep.replyFlags&wire.ReplyQueryFailure == 0 {
			t.Fatalf("OP_REPLY error without QueryFailure: flags %#x", rep.replyFlags)
		}
		if e, _ := rep.body.Lookup("$err").StringValueOK(); e == "" {
			t.Fatalf("OP_REPLY error without $err: %v", rep.body)
		}
	}
	switch tc.want {
	case malReplyClose:
		if !r.closed(5 * time.Second) {
			t.Fatal("connection still open 5s after a protocol error")
		}
	case malReplyStay:
		if body := r.cmd(malPingCmd()); okOf(body) != 1 {
			t.Fatalf("client unusable after a command error: %v", body)
		}
	}
}

// malLoad is a well-behaved Go driver client running pings and inserts in
// a loop; it records every error with the catalogue case running then.
type malLoad struct {
	stop  chan struct{}
	done  chan struct{}
	ops   atomic.Int64
	phase atomic.Pointer[string]

	mu   sync.Mutex // guards errs
	errs []string
}

// malLoadMaxOps and malLoadMaxTime bound the loop whatever the test does.
const (
	malLoadMaxOps  = 200_000
	malLoadMaxTime = 3 * time.Minute
)

func malStartLoad(c *mongo.Client) *malLoad {
	l := &malLoad{stop: make(chan struct{}), done: make(chan struct{})}
	l.setPhase("start")
	coll := c.Database("load").Collection("ops")
	go func() {
		defer close(l.done)
		start := time.Now()
		for i := range malLoadMaxOps {
			select {
			case <-l.stop:
				return
			default:
			}
			if time.Since(start) > malLoadMaxTime {
				l.record(errors.New("load loop ran past its time bound"))
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := c.Ping(ctx, nil)
			if err == nil {
				_, err = coll.InsertOne(ctx, bson.D{{Key: "n", Value: i}})
			}
			cancel()
			if err != nil {
				l.record(err)
			}
			l.ops.Add(1)
			time.Sleep(time.Millisecond)
		}
	}()
	return l
}

func (l *malLoad) setPhase(p string) { l.phase.Store(&p) }

func (l *malLoad) record(err error) {
	l.mu.Lock()
	l.errs = append(l.errs, fmt.Sprintf("during %q: %v", *l.phase.Load(), err))
	l.mu.Unlock()
}

// finish stops the loop and fails t on any error it saw.
func (l *malLoad) finish(t *testing.T) {
	t.Helper()
	close(l.stop)
	select {
	case <-l.done:
	case <-time.After(30 * time.Second):
		t.Fatal("driver load loop did not stop")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.errs {
		t.Errorf("well-behaved driver client failed %s", e)
	}
	if n := l.ops.Load(); n < 20 {
		t.Errorf("driver load ran only %d operations", n)
	}
	t.Logf("driver ran %d ping+insert rounds during the catalogue", l.ops.Load())
}

func malZeros8MB(t testing.TB) []byte { return malZlib(t, make([]byte, 8<<20)) }

// malNoServeErrors fails t if a listener of a died.
func malNoServeErrors(t testing.TB, a *app.App) {
	t.Helper()
	select {
	case err := <-a.Errors():
		t.Fatalf("mongobouncer listener failed: %v", err)
	default:
	}
}

// malWaitClients waits until the server counts n clients.
func malWaitClients(t testing.TB, a *app.App, n int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for a.Server().ClientCount() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d clients connected after %v, want %d", a.Server().ClientCount(), d, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestMalformedInputCatalogue(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		ignore := goleak.IgnoreCurrent()
		t.Cleanup(func() { goleak.VerifyNone(t, ignore) })

		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		a, addr := bouncer(t, up.URI(), nil)
		c := driver(t, addr, "&appName=malformed-load")
		if err := c.Ping(ctxT(t, 20*time.Second), nil); err != nil {
			t.Fatal(err)
		}
		load := malStartLoad(c)
		ctl := dialRaw(t, addr)
		ctl.hello()
		zeros := malZeros8MB(t)

		cases := malCatalogue(t, zeros)
		if len(cases) < 15 {
			t.Fatalf("catalogue has %d cases", len(cases))
		}
		for i, tc := range cases {
			load.setPhase(tc.name)
			t.Run(tc.name, func(t *testing.T) { malRun(t, addr, int32(7000+i), tc) })
			// The raw client that behaves sends a command right after each bad
			// input, on its long-lived connection and on a new one.
			if body := ctl.cmd(malPingCmd()); okOf(body) != 1 {
				t.Fatalf("after %q: well-behaved raw client got %v", tc.name, body)
			}
			fresh := dialRaw(t, addr)
			if okOf(fresh.hello()) != 1 || okOf(fresh.cmd(malPingCmd())) != 1 {
				t.Fatalf("after %q: a new client cannot connect", tc.name)
			}
			fresh.c.Close()
			malNoServeErrors(t, a)
		}

		load.setPhase("1000 rapid connect/close cycles")
		t.Run("1000 rapid connect/close cycles", func(t *testing.T) {
			deadline := time.Now().Add(45 * time.Second)
			before := a.Server().TotalClients()
			hello := wire.AppendMsg(nil, 1, 0, 0, docOf(t, bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}}))
			for i := range 1000 {
				if time.Now().After(deadline) {
					t.Fatalf("only %d cycles in 45s", i)
				}
				nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
				if err != nil {
					t.Fatalf("cycle %d: %v", i, err)
				}
				switch i % 3 {
				case 1: // a hello, then gone before the reply is read
					_ = nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
					_, _ = nc.Write(hello)
				case 2: // half a header
					_, _ = nc.Write(hello[:9])
				}
				if i%2 == 0 {
					// Closing with SO_LINGER 0 resets the connection instead
					// of a clean FIN.
					_ = nc.(*net.TCPConn).SetLinger(0)
				}
				nc.Close()
			}
			if body := ctl.cmd(malPingCmd()); okOf(body) != 1 {
				t.Fatalf("after the cycles: %v", body)
			}
			// Every cycle reaches the accept loop, which may lag behind.
			for wait := time.Now().Add(10 * time.Second); a.Server().TotalClients()-before < 1000; {
				if time.Now().After(wait) {
					t.Fatalf("server accepted %d of the 1000 connections", a.Server().TotalClients()-before)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})

		load.finish(t)
		malNoServeErrors(t, a)

		// Every bad client is gone: once the driver and the control client
		// leave, no client is left.
		ctl.c.Close()
		if err := c.Disconnect(ctxT(t, 10*time.Second)); err != nil {
			t.Fatal(err)
		}
		malWaitClients(t, a, 0, 10*time.Second)
	})
}

// TestMalformedSlowSenders stalls clients mid-header and mid-message:
// others are served meanwhile, and client_idle_timeout ends the stalled.
func TestMalformedSlowSenders(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		ignore := goleak.IgnoreCurrent()
		t.Cleanup(func() { goleak.VerifyNone(t, ignore) })

		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		_, addr := bouncer(t, up.URI(), func(c *config.Config) { c.Global.ClientIdleTimeout = time.Second })

		stall := func(t *testing.T, n int, prefix func(id int32) []byte) []*rawClient {
			var out []*rawClient
			for i := range n {
				r := dialRaw(t, addr)
				r.sendRaw(prefix(int32(i + 1)))
				out = append(out, r)
			}
			return out
		}
		// While they stall, a well-behaved client keeps getting quick answers.
		serveMeanwhile := func(t *testing.T) {
			ctl := dialRaw(t, addr)
			ctl.hello()
			for i := range 10 {
				start := time.Now()
				if body := ctl.cmd(malPingCmd()); okOf(body) != 1 {
					t.Fatalf("ping %d: %v", i, body)
				}
				if d := time.Since(start); d > 3*time.Second {
					t.Fatalf("ping %d took %v while other clients stall", i, d)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
		expectClosed := func(t *testing.T, rs []*rawClient, within time.Duration) {
			for i, r := range rs {
				n, closed := malDrain(r.c, within)
				if !closed {
					t.Fatalf("stalled client %d still open after %v with client_idle_timeout 1s", i, within)
				}
				if n > 0 {
					t.Fatalf("stalled client %d got %d bytes", i, n)
				}
			}
		}
		ping := func(id int32) []byte { return malOpMsg(id, 0, malKind0(malPing())) }

		t.Run("partial header then stall", func(t *testing.T) {
			start := time.Now()
			rs := stall(t, 10, func(id int32) []byte { return ping(id)[:9] })
			serveMeanwhile(t)
			expectClosed(t, rs, 10*time.Second)
			if d := time.Since(start); d < 900*time.Millisecond {
				t.Fatalf("stalled clients closed after %v, before client_idle_timeout", d)
			}
		})
		t.Run("header then stall", func(t *testing.T) {
			start := time.Now()
			rs := stall(t, 10, func(id int32) []byte { return ping(id)[:wire.HeaderLen+3] })
			serveMeanwhile(t)
			expectClosed(t, rs, 10*time.Second)
			if d := time.Since(start); d < 900*time.Millisecond {
				t.Fatalf("stalled clients closed after %v, before client_idle_timeout", d)
			}
		})
	})
}

// TestMalformedDeclaredLengthDoesNotReserveMemory stalls a few clients
// after headers that declare 40 MB messages: memory must follow the bytes
// that arrived, not the lengths a client claims.
func TestMalformedDeclaredLengthDoesNotReserveMemory(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		ignore := goleak.IgnoreCurrent()
		t.Cleanup(func() { goleak.VerifyNone(t, ignore) })

		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		if runtime.GOOS != "linux" {
			t.Skip("needs /proc/net/tcp to see that the proxy has read the headers")
		}
		_, addr := bouncer(t, up.URI(), nil)
		const conns, declared = 4, 40_000_000
		heap := func() uint64 {
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			return ms.HeapAlloc
		}
		before := heap()
		var rs []*rawClient
		for i := range conns {
			r := dialRaw(t, addr)
			r.sendRaw(append(malHeader(declared, int32(i+1), wire.OpMsg), 0, 0, 0, 0))
			rs = append(rs, r)
		}
		// The proxy has read what they sent once its side of each of
		// their connections has nothing left to receive.
		waitFor(t, "the proxy to read the headers", func() bool { return proxyHasRead(t, addr, rs) })
		after := heap()
		t.Logf("heap grew by %d KB for %d stalled headers declaring %d MB each", (int64(after)-int64(before))>>10, conns, declared>>20)
		if grew := int64(after) - int64(before); grew > conns*declared/4 {
			t.Fatalf("heap grew by %d MB for %d stalled headers of %d MB", grew>>20, conns, declared>>20)
		}
		for _, r := range rs {
			r.c.Close()
		}
	})
}

// proxyHasRead reports whether the proxy listening at addr has read
// everything each of cs sent: the proxy's end of each connection is in
// this process, and its receive queue is empty.
func proxyHasRead(t *testing.T, addr string, cs []*rawClient) bool {
	t.Helper()
	socks, err := ownSockets()
	must(t, err)
	want := map[string]bool{} // the clients' ports, as /proc spells them
	for _, c := range cs {
		want[fmt.Sprintf("%04X", portOf(t, c.c.LocalAddr().String()))] = true
	}
	bPort := fmt.Sprintf("%04X", portOf(t, addr))
	read := 0
	for _, s := range socks {
		_, local, _ := strings.Cut(s.local, ":")
		if local != bPort || !want[s.remotePort()] {
			continue
		}
		if _, rx, _ := strings.Cut(s.queues, ":"); strings.TrimLeft(rx, "0") != "" {
			return false
		}
		read++
	}
	return read == len(cs)
}
