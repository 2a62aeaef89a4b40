package upstream

import (
	"context"
	"errors"
	"net/url"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func dialDev(t *testing.T, o Options, addr string) *Conn {
	t.Helper()
	if o.Logger == nil {
		o.Logger = quiet
	}
	c, err := NewDialer(o).Dial(testCtx(t), addr, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestDevmongoHello(t *testing.T) {
	c := dialDev(t, Options{AppName: "upstream-test"}, dev.Addr())
	h := c.Hello()
	t.Logf("FerretDB hello: %s", h.Raw)
	if !h.IsWritablePrimary {
		t.Error("isWritablePrimary false")
	}
	if h.MaxWireVersion < 6 || h.MinWireVersion > h.MaxWireVersion {
		t.Errorf("wire versions %d..%d", h.MinWireVersion, h.MaxWireVersion)
	}
	if h.MaxBSONObjectSize != 16<<20 {
		t.Errorf("maxBsonObjectSize %d", h.MaxBSONObjectSize)
	}
	if h.MaxMessageSizeBytes < 16<<20 {
		t.Errorf("maxMessageSizeBytes %d", h.MaxMessageSizeBytes)
	}
	if c.MaxMessageSize() != int(h.MaxMessageSizeBytes) {
		t.Errorf("MaxMessageSize() = %d, hello said %d", c.MaxMessageSize(), h.MaxMessageSizeBytes)
	}
	if h.MaxWriteBatchSize <= 0 {
		t.Errorf("maxWriteBatchSize %d", h.MaxWriteBatchSize)
	}
	if h.LogicalSessionTimeoutMinutes == nil || *h.LogicalSessionTimeoutMinutes <= 0 {
		t.Errorf("logicalSessionTimeoutMinutes %v", h.LogicalSessionTimeoutMinutes)
	}
	if _, ok := c.ServiceID(); ok {
		t.Error("serviceId from a non-load-balanced server")
	}
	if ok, _ := h.Raw.Lookup("ok").AsFloat64OK(); ok != 1 {
		t.Errorf("Raw lacks ok:1: %s", h.Raw)
	}
}

func TestDevmongoRoundTrip(t *testing.T) {
	c := dialDev(t, Options{}, dev.Addr())
	ctx := testCtx(t)

	if _, err := c.RoundTrip(ctx, "admin", doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt32("ping", 1) })); err != nil {
		t.Fatal(err)
	}
	coll := "rt" + time.Now().Format("150405.000000")
	insert := doc(func(b *bsoncore.DocumentBuilder) {
		b.AppendString("insert", coll).AppendArray("documents", bsoncore.NewArrayBuilder().
			AppendDocument(doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt32("_id", 1).AppendString("v", "one") })).
			AppendDocument(doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt32("_id", 2).AppendString("v", "two") })).
			Build())
	})
	reply, err := c.RoundTrip(ctx, "upstream_test", insert)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := reply.Lookup("n").AsInt64OK(); n != 2 {
		t.Fatalf("insert reply %s", reply)
	}
	find := doc(func(b *bsoncore.DocumentBuilder) {
		b.AppendString("find", coll).AppendDocument("filter", doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt32("_id", 2) }))
	})
	reply, err = c.RoundTrip(ctx, "upstream_test", find)
	if err != nil {
		t.Fatal(err)
	}
	batch, ok := reply.Lookup("cursor", "firstBatch").ArrayOK()
	if !ok {
		t.Fatalf("find reply %s", reply)
	}
	vals, _ := batch.Values()
	if len(vals) != 1 || vals[0].Document().Lookup("v").StringValue() != "two" {
		t.Fatalf("find returned %s", batch)
	}

	// An unknown command is a server error: typed, not a network error,
	// and the connection stays usable.
	_, err = c.RoundTrip(ctx, "admin", doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt32("noSuchCommand", 1) }))
	var ce *CommandError
	if !errors.As(err, &ce) || IsNetworkError(err) {
		t.Fatalf("unknown command: %v (%T)", err, err)
	}
	if ce.Code != 59 || ce.CodeName != "CommandNotFound" {
		t.Errorf("unknown command error %+v, want 59 CommandNotFound", ce)
	}
	if _, err := c.RoundTrip(ctx, "admin", doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt32("ping", 1) })); err != nil {
		t.Fatalf("ping after a command error: %v", err)
	}

	// A second hello with client metadata is refused by the server (code
	// 186): a real hello command error.
	_, err = c.RoundTrip(ctx, "admin", NewDialer(Options{}).hello)
	if !errors.As(err, &ce) || ce.Code != 186 {
		t.Fatalf("second hello with metadata: %v, want CommandError 186", err)
	}
}

// FerretDB v1.24 implements no compressor: its hello reply has no
// "compression" field (and it closes connections that send OP_COMPRESSED),
// so nothing is negotiated and traffic must stay uncompressed. Compression
// itself is tested against the fake server.
func TestDevmongoCompressionNotNegotiated(t *testing.T) {
	c := dialDev(t, Options{Compressors: []string{"zstd", "snappy", "zlib"}}, dev.Addr())
	if id, ok := c.Compressor(); ok {
		t.Fatalf("FerretDB negotiated %v; update this test and the report", id)
	}
	if c.Hello().Compression != nil {
		t.Fatalf("compression in hello: %v", c.Hello().Compression)
	}
	if _, err := c.RoundTrip(testCtx(t), "admin", doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt32("ping", 1) })); err != nil {
		t.Fatal(err)
	}
}

func TestDevmongoUnixSocket(t *testing.T) {
	for _, addr := range []string{dev.UnixSocket(), url.PathEscape(dev.UnixSocket())} {
		t.Run(addr, func(t *testing.T) {
			if network, _ := ParseAddress(addr); network != "unix" {
				t.Fatalf("ParseAddress(%q) network %q", addr, network)
			}
			c := dialDev(t, Options{}, addr)
			if c.NetConn().RemoteAddr().Network() != "unix" {
				t.Fatalf("dialled %s", c.NetConn().RemoteAddr().Network())
			}
			if _, err := c.RoundTrip(testCtx(t), "admin", doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt32("ping", 1) })); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func doc(f func(*bsoncore.DocumentBuilder)) bsoncore.Document {
	b := bsoncore.NewDocumentBuilder()
	f(b)
	return b.Build()
}
