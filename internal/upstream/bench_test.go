package upstream

import (
	"context"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// echoServer answers the handshake with hello, then either echoes every
// message back unchanged (echo) or answers it with a fixed {ok: 1} reply.
// After the handshake it allocates nothing, so -benchmem reflects the client.
func echoServer(hello bsoncore.Document, echo bool) func(*fakeConn) {
	return func(c *fakeConn) {
		req, ok := c.read()
		if !ok || !c.reply(req, hello, nil) {
			return
		}
		reply := wire.AppendMsg(nil, 1, 0, 0, okReply)
		var buf []byte
		for {
			msg, err := wire.ReadMessage(c.nc, buf[:0], 0)
			if err != nil {
				return
			}
			buf = msg
			h, err := wire.ParseHeader(msg)
			if err != nil {
				return
			}
			out := reply
			if echo {
				out = msg
			}
			wire.SetResponseTo(out, h.RequestID)
			if !c.write(out) {
				return
			}
		}
	}
}

func BenchmarkRoundTrip(b *testing.B) {
	srv := newFakeServer(b, echoServer(helloReply(nil), false))
	c, err := NewDialer(Options{Logger: quiet}).Dial(context.Background(), srv.addr(), 1)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	cmd := ping()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.RoundTrip(ctx, "admin", cmd); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWriteRead is the proxy's hot path: one message out through
// WriteMessage and back through ReadMessage with a reused buffer.
func BenchmarkWriteRead(b *testing.B) {
	body := bsoncore.NewDocumentBuilder().
		AppendString("insert", "c").
		AppendString("pad", strings.Repeat("mongobouncer ", 80)). // ~1 KiB, compressible
		AppendString("$db", "test").Build()
	msg := wire.AppendMsg(nil, 5, 0, 0, body)
	for _, comp := range []string{"none", "snappy", "zlib", "zstd"} {
		b.Run(comp, func(b *testing.B) {
			hello := helloReply(nil)
			var offer []string
			if comp != "none" {
				offer = []string{comp}
				hello = helloReply(func(d *bsoncore.DocumentBuilder) {
					d.AppendArray("compression", bsoncore.NewArrayBuilder().AppendString(comp).Build())
				})
			}
			srv := newFakeServer(b, echoServer(hello, true))
			c, err := NewDialer(Options{Compressors: offer, Logger: quiet}).Dial(context.Background(), srv.addr(), 1)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			if _, ok := c.Compressor(); ok != (comp != "none") {
				b.Fatalf("compressor not negotiated")
			}
			var buf []byte
			b.SetBytes(int64(len(msg)))
			b.ReportAllocs()
			for b.Loop() {
				if err := c.WriteMessage(msg); err != nil {
					b.Fatal(err)
				}
				if buf, err = c.ReadMessage(buf[:0]); err != nil {
					b.Fatal(err)
				}
				if len(buf) != len(msg) {
					b.Fatalf("echo %d bytes, sent %d", len(buf), len(msg))
				}
			}
		})
	}
}
