package e2e

import (
	"io"
	"net"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// rawClient speaks the wire protocol by hand, so tests control exactly
// which bytes go out on which connection.
type rawClient struct {
	t   testing.TB
	c   net.Conn
	id  int32
	buf []byte
}

// reply is one message read back.
type reply struct {
	header wire.Header
	flags  wire.MsgFlags
	body   bson.Raw
}

func dialRaw(t testing.TB, addr string) *rawClient {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawClient{t: t, c: c}
}

func docOf(t testing.TB, v any) bsoncore.Document {
	t.Helper()
	b, err := bson.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// send writes an OP_MSG and returns its requestID.
func (r *rawClient) send(flags wire.MsgFlags, body any) int32 {
	r.t.Helper()
	r.id++
	msg := wire.AppendMsg(nil, r.id, 0, flags, docOf(r.t, body))
	r.sendRaw(msg)
	return r.id
}

func (r *rawClient) sendRaw(b []byte) {
	r.t.Helper()
	_ = r.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := r.c.Write(b); err != nil {
		r.t.Fatalf("write: %v", err)
	}
}

// recv reads one reply (decompressing OP_COMPRESSED), or fails the test
// after 10s.
func (r *rawClient) recv() reply {
	r.t.Helper()
	rep, err := r.tryRecv(10 * time.Second)
	if err != nil {
		r.t.Fatalf("recv: %v", err)
	}
	return rep
}

func (r *rawClient) tryRecv(d time.Duration) (reply, error) {
	_ = r.c.SetReadDeadline(time.Now().Add(d))
	msg, err := wire.ReadMessage(r.c, r.buf[:0], wire.DefaultMaxMessageSize)
	if err != nil {
		return reply{}, err
	}
	r.buf = msg[:0]
	h, err := wire.ParseHeader(msg)
	if err != nil {
		return reply{}, err
	}
	if h.OpCode == wire.OpCompressed {
		if msg, err = wire.Decompress(nil, msg, wire.DefaultMaxMessageSize); err != nil {
			return reply{}, err
		}
		h, _ = wire.ParseHeader(msg)
	}
	switch h.OpCode {
	case wire.OpMsg:
		m, err := wire.ParseMsg(msg)
		if err != nil {
			return reply{}, err
		}
		return reply{header: h, flags: m.Flags, body: bson.Raw(append([]byte(nil), m.Body...))}, nil
	case wire.OpReply:
		rp, err := wire.ParseReply(msg)
		if err != nil {
			return reply{}, err
		}
		var body bson.Raw
		if len(rp.Documents) > 0 {
			body = bson.Raw(append([]byte(nil), rp.Documents[0]...))
		}
		return reply{header: h, body: body}, nil
	}
	return reply{header: h}, nil
}

// cmd sends a command and returns the reply body, checking responseTo.
func (r *rawClient) cmd(body any) bson.Raw {
	r.t.Helper()
	id := r.send(0, body)
	rep := r.recv()
	if rep.header.ResponseTo != id {
		r.t.Fatalf("responseTo %d, want %d", rep.header.ResponseTo, id)
	}
	return rep.body
}

// hello performs the handshake a driver would.
func (r *rawClient) hello() bson.Raw {
	r.t.Helper()
	return r.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "helloOk", Value: true}, {Key: "$db", Value: "admin"}})
}

// closed reports whether the server closed the connection (EOF) within d.
func (r *rawClient) closed(d time.Duration) bool {
	_ = r.c.SetReadDeadline(time.Now().Add(d))
	var b [1]byte
	for {
		_, err := r.c.Read(b[:])
		if err == nil {
			continue
		}
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return false
		}
		return true
	}
}

func okOf(b bson.Raw) float64 {
	v, err := b.LookupErr("ok")
	if err != nil {
		return -1
	}
	f, _ := v.AsFloat64OK()
	return f
}

func codeOf(b bson.Raw) int32 {
	v, err := b.LookupErr("code")
	if err != nil {
		return 0
	}
	c, _ := v.AsInt64OK()
	return int32(c)
}

// awaitFirstByte blocks until the next reply starts to arrive, and keeps
// the byte it read for the next recv: the server is then writing the
// reply, and a reply larger than the socket buffers cannot be written
// whole until the client reads.
func (r *rawClient) awaitFirstByte() {
	r.t.Helper()
	var b [1]byte
	_ = r.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(r.c, b[:]); err != nil {
		r.t.Fatalf("waiting for a reply to start: %v", err)
	}
	r.c = &prefixConn{Conn: r.c, pre: b[:]}
}

// prefixConn is a net.Conn whose reads return pre first.
type prefixConn struct {
	net.Conn
	pre []byte
}

func (p *prefixConn) Read(b []byte) (int, error) {
	if len(p.pre) > 0 {
		n := copy(b, p.pre)
		p.pre = p.pre[n:]
		return n, nil
	}
	return p.Conn.Read(b)
}
