package fakemongo

import (
	"bufio"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// benchConn is an allocation-free ping client, so -benchmem reports what
// the server side allocates per round trip.
type benchConn struct {
	nc  net.Conn
	br  *bufio.Reader
	req []byte
	buf []byte
	id  int32
}

func newBenchConn(b *testing.B, s *Server) *benchConn {
	nc, err := net.DialTimeout("tcp", s.Addr(), ioTimeout)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = nc.Close() })
	return &benchConn{
		nc:  nc,
		br:  bufio.NewReaderSize(nc, 16<<10),
		req: wire.AppendMsg(nil, 0, 0, 0, Doc(d{{"ping", 1}, {"$db", "admin"}})),
		buf: make([]byte, 0, 4096),
	}
}

func (c *benchConn) ping() error {
	c.id++
	wire.SetRequestID(c.req, c.id)
	if _, err := c.nc.Write(c.req); err != nil {
		return err
	}
	msg, err := wire.ReadMessage(c.br, c.buf, 0)
	if err != nil {
		return err
	}
	if h, err := wire.ParseHeader(msg); err != nil || h.ResponseTo != c.id {
		return errBadBenchReply
	}
	return nil
}

var errBadBenchReply = errors.New("bench: unexpected reply")

// BenchmarkPingRoundTrip measures one OP_MSG ping round trip over loopback
// on a single connection.
func BenchmarkPingRoundTrip(b *testing.B) {
	s, err := Listen("127.0.0.1:0", Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	c := newBenchConn(b, s)
	if err := c.ping(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := c.ping(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPingRoundTripParallel runs ping round trips on GOMAXPROCS
// connections at once, as the load tool does.
func BenchmarkPingRoundTripParallel(b *testing.B) {
	s, err := Listen("127.0.0.1:0", Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		nc, err := net.DialTimeout("tcp", s.Addr(), ioTimeout)
		if err != nil {
			b.Error(err)
			return
		}
		defer func() { _ = nc.Close() }()
		c := &benchConn{
			nc:  nc,
			br:  bufio.NewReaderSize(nc, 16<<10),
			req: wire.AppendMsg(nil, 0, 0, 0, Doc(d{{"ping", 1}, {"$db", "admin"}})),
			buf: make([]byte, 0, 4096),
		}
		_ = nc.SetDeadline(time.Now().Add(5 * time.Minute))
		for pb.Next() {
			if err := c.ping(); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkHandlerRoundTrip measures a round trip through a test handler
// that returns a prebuilt document, the path scripted tests use.
func BenchmarkHandlerRoundTrip(b *testing.B) {
	s, err := Listen("127.0.0.1:0", Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	reply := Docs(d{{"ok", 1}, {"n", 1}})
	s.Handle("ping", func(*Request) Reply { return reply })
	c := newBenchConn(b, s)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := c.ping(); err != nil {
			b.Fatal(err)
		}
	}
}
