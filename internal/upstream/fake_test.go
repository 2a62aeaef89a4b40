package upstream

import (
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// fakeServer is a scripted loopback MongoDB server: serve runs once per
// accepted connection. Cleanup closes the listener and every connection and
// waits for the serve goroutines.
type fakeServer struct {
	t     testing.TB
	ln    net.Listener
	serve func(*fakeConn)

	mu    sync.Mutex // guards conns
	conns []net.Conn
	wg    sync.WaitGroup
}

func newFakeServer(t testing.TB, serve func(*fakeConn)) *fakeServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return startFake(t, ln, serve)
}

func startFake(t testing.TB, ln net.Listener, serve func(*fakeConn)) *fakeServer {
	s := &fakeServer{t: t, ln: ln, serve: serve}
	s.wg.Add(1)
	go s.acceptLoop()
	t.Cleanup(s.close)
	return s
}

func (s *fakeServer) addr() string { return s.ln.Addr().String() }

func (s *fakeServer) acceptLoop() {
	defer s.wg.Done()
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns = append(s.conns, nc)
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer nc.Close()
			// Bound every fake connection: no test needs one for long.
			_ = nc.SetDeadline(time.Now().Add(30 * time.Second))
			s.serve(&fakeConn{t: s.t, nc: nc})
		}()
	}
}

func (s *fakeServer) close() {
	s.ln.Close()
	s.mu.Lock()
	for _, c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// fakeConn is the server side of one connection.
type fakeConn struct {
	t   testing.TB
	nc  net.Conn
	buf []byte
}

// request is one decoded client message.
type request struct {
	header     wire.Header
	flags      wire.MsgFlags
	compressed bool
	compressor wire.CompressorID
	body       bsoncore.Document // owned copy
}

// read reads one OP_MSG (decompressing OP_COMPRESSED). ok is false when
// the client went away or sent something unexpected (reported with t.Errorf
// unless it is a plain disconnect).
func (c *fakeConn) read() (request, bool) {
	msg, err := wire.ReadMessage(c.nc, c.buf[:0], 0)
	if err != nil {
		return request{}, false
	}
	c.buf = msg
	var r request
	h, _ := wire.ParseHeader(msg)
	if h.OpCode == wire.OpCompressed {
		ch, err := wire.ParseCompressedHeader(msg)
		if err != nil {
			c.t.Errorf("fake server: %v", err)
			return request{}, false
		}
		r.compressed, r.compressor = true, ch.Compressor
		if msg, err = wire.Decompress(nil, msg, 0); err != nil {
			c.t.Errorf("fake server: %v", err)
			return request{}, false
		}
	}
	m, err := wire.ParseMsg(msg)
	if err != nil {
		c.t.Errorf("fake server: %v", err)
		return request{}, false
	}
	r.header = m.Header
	r.flags = m.Flags
	r.body = append(bsoncore.Document(nil), m.Body...)
	return r, true
}

// reply answers req with doc, compressed with z when z is not nil.
func (c *fakeConn) reply(req request, doc bsoncore.Document, z *wire.CompressorID) bool {
	msg := wire.AppendMsg(nil, req.header.RequestID+1000, req.header.RequestID, 0, doc)
	if z != nil {
		var err error
		if msg, err = wire.Compress(nil, msg, *z); err != nil {
			c.t.Errorf("fake server: %v", err)
			return false
		}
	}
	return c.write(msg)
}

func (c *fakeConn) write(msg []byte) bool {
	_, err := c.nc.Write(msg)
	return err == nil || errors.Is(err, net.ErrClosed)
}

// helloReply is a plausible mongod hello reply; extra elements are appended.
func helloReply(extra func(*bsoncore.DocumentBuilder)) bsoncore.Document {
	b := bsoncore.NewDocumentBuilder().
		AppendBoolean("isWritablePrimary", true).
		AppendInt32("maxBsonObjectSize", 16777216).
		AppendInt32("maxMessageSizeBytes", 48000000).
		AppendInt32("maxWriteBatchSize", 100000).
		AppendInt32("logicalSessionTimeoutMinutes", 30).
		AppendInt64("connectionId", 42).
		AppendInt32("minWireVersion", 0).
		AppendInt32("maxWireVersion", 25)
	if extra != nil {
		extra(b)
	}
	return b.AppendDouble("ok", 1).Build()
}

var okReply = bsoncore.NewDocumentBuilder().AppendDouble("ok", 1).Build()

// serveHello answers the handshake with hello, then every further command
// with ok:1, until the client leaves.
func serveHello(hello bsoncore.Document) func(*fakeConn) {
	return func(c *fakeConn) {
		req, ok := c.read()
		if !ok || !c.reply(req, hello, nil) {
			return
		}
		for {
			req, ok := c.read()
			if !ok || !c.reply(req, okReply, nil) {
				return
			}
		}
	}
}

// blackhole accepts connections and never answers.
func blackhole(c *fakeConn) {
	var b [1]byte
	for {
		if _, err := c.nc.Read(b[:]); err != nil {
			return
		}
	}
}
