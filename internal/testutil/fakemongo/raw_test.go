package fakemongo

import (
	"bufio"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/testutil/wait"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// rawClient is a minimal wire client for tests that need what a driver does
// not expose: exhaust streams, moreToCome requests, OP_QUERY, exact ids.
type rawClient struct {
	t      testing.TB
	nc     net.Conn
	br     *bufio.Reader
	nextID int32
	buf    []byte
	out    []byte
	comp   wire.CompressorID // compressor for requests; noop id with useComp false means none
	useC   bool
}

// ioTimeout bounds every raw read and write so a broken server fails the
// test instead of hanging it.
const ioTimeout = 10 * time.Second

func dialRaw(t testing.TB, s *Server) *rawClient {
	t.Helper()
	nc, err := net.DialTimeout("tcp", s.Addr(), ioTimeout)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	c := &rawClient{t: t, nc: nc, br: bufio.NewReader(nc)}
	t.Cleanup(func() { _ = nc.Close() })
	return c
}

// send writes an OP_MSG and returns its requestID.
func (c *rawClient) send(flags wire.MsgFlags, body any, seqs ...wire.Sequence) int32 {
	c.t.Helper()
	c.nextID++
	c.out = wire.AppendMsg(c.out[:0], c.nextID, 0, flags, Doc(body), seqs...)
	c.write(c.out)
	return c.nextID
}

func (c *rawClient) write(msg []byte) {
	c.t.Helper()
	if c.useC {
		var err error
		msg, err = wire.Compress(nil, msg, c.comp)
		if err != nil {
			c.t.Fatalf("compress: %v", err)
		}
	}
	_ = c.nc.SetWriteDeadline(time.Now().Add(ioTimeout))
	if _, err := c.nc.Write(msg); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// readRaw reads one message (decompressing it) within d.
func (c *rawClient) readRaw(d time.Duration) (wire.Header, []byte, error) {
	_ = c.nc.SetReadDeadline(time.Now().Add(d))
	msg, err := wire.ReadMessage(c.br, nil, 0)
	if err != nil {
		return wire.Header{}, nil, err
	}
	h, err := wire.ParseHeader(msg)
	if err != nil {
		return h, nil, err
	}
	if h.OpCode == wire.OpCompressed {
		msg, err = wire.Decompress(nil, msg, 0)
		if err != nil {
			return h, nil, err
		}
		ch := h
		h, err = wire.ParseHeader(msg)
		h.MessageLength = ch.MessageLength // keep a trace that it was compressed
		h.OpCode = wire.OpCompressed
		return h, msg, err
	}
	return h, msg, nil
}

// recv reads one OP_MSG reply.
func (c *rawClient) recv() wire.Msg {
	c.t.Helper()
	_, msg, err := c.readRaw(ioTimeout)
	if err != nil {
		c.t.Fatalf("read reply: %v", err)
	}
	m, err := wire.ParseMsg(msg)
	if err != nil {
		c.t.Fatalf("parse reply: %v", err)
	}
	return m
}

// roundTrip sends a command and returns the reply body.
func (c *rawClient) roundTrip(body any) bsoncore.Document {
	c.t.Helper()
	id := c.send(0, body)
	m := c.recv()
	if m.Header.ResponseTo != id {
		c.t.Fatalf("responseTo %d, want %d", m.Header.ResponseTo, id)
	}
	return m.Body
}

// expectNothing asserts no message arrives within d.
func (c *rawClient) expectNothing(d time.Duration) {
	c.t.Helper()
	_, _, err := c.readRaw(d)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		c.t.Fatalf("expected no reply, got err=%v", err)
	}
	// A timed-out read may leave the bufio state fine, but the deadline
	// must be lifted for later reads; readRaw sets a fresh one each time.
}

// expectClosed asserts the server closes the connection within d.
func (c *rawClient) expectClosed(d time.Duration) {
	c.t.Helper()
	_, _, err := c.readRaw(d)
	if err == nil {
		c.t.Fatalf("expected the server to close the connection, got a message")
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		c.t.Fatalf("expected the server to close the connection, still open after %v", d)
	}
	if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !isReset(err) {
		c.t.Fatalf("unexpected error: %v", err)
	}
}

func isReset(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe)
}

func okOf(t testing.TB, body bsoncore.Document) float64 {
	t.Helper()
	v, ok := body.Lookup("ok").AsFloat64OK()
	if !ok {
		t.Fatalf("reply without ok: %v", body)
	}
	return v
}

func codeOf(body bsoncore.Document) int32 {
	c, _ := body.Lookup("code").AsInt32OK()
	return c
}

func mustOK(t testing.TB, body bsoncore.Document) {
	t.Helper()
	if okOf(t, body) != 1 {
		t.Fatalf("command failed: %v", body)
	}
}

// e and d are test shorthands for bson.E and bson.D. They are local types
// (not aliases) so that unkeyed literals such as d{{"ping", 1}} stay vet-clean.
type e struct {
	Key   string
	Value any
}

// d is an ordered document; it marshals as bson.D.
type d []e

// MarshalBSON implements bson.Marshaler.
func (x d) MarshalBSON() ([]byte, error) {
	bd := make(bson.D, len(x))
	for i, el := range x {
		bd[i] = bson.E{Key: el.Key, Value: el.Value}
	}
	return bson.Marshal(bd)
}

// waitFor polls cond until it holds or the generous deadline passes.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	wait.Until(t, what, 10*time.Second, 5*time.Millisecond, cond)
}
