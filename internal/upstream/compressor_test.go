package upstream

import (
	"slices"
	"testing"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// TestCompressorOurOrder: a server whose hello lists the agreed compressors
// in another order than ours (a real one keeps the client's order, but
// nothing forces it) still gets our preferred one, as the OP_COMPRESSED spec
// says: "clients MUST use the first compressor in the client's configured
// compressors list that is also in the servers list".
func TestCompressorOurOrder(t *testing.T) {
	srv := fakemongo.Start(t, fakemongo.Options{Compressors: []string{"snappy", "zlib", "zstd"}})
	srv.Handle("hello", func(req *fakemongo.Request) fakemongo.Reply {
		r := srv.Builtin(req) // agrees the compressors on this connection
		return fakemongo.Reply{Docs: []bsoncore.Document{reverseCompression(t, r.Docs[0])}}
	})
	used := make(chan string, 1)
	srv.Handle("ping", func(req *fakemongo.Request) fakemongo.Reply {
		used <- req.Compressor
		return srv.Builtin(req)
	})

	c := dialDev(t, Options{Compressors: []string{"zstd", "zlib", "snappy"}}, srv.Addr())
	if got := c.Hello().Compression; !slices.Equal(got, []string{"snappy", "zlib", "zstd"}) {
		t.Fatalf("the fake's hello listed %v; the test needs it reversed", got)
	}
	if id, ok := c.Compressor(); !ok || id.String() != "zstd" {
		t.Fatalf("Compressor() = %v, %v; want zstd (our first), not snappy (the server's first)", id, ok)
	}
	if _, err := c.RoundTrip(testCtx(t), "admin", ping()); err != nil {
		t.Fatal(err)
	}
	if got := <-used; got != "zstd" {
		t.Errorf("ping reached the server compressed with %q, want zstd", got)
	}
}

// reverseCompression returns hello with its compression array reversed.
func reverseCompression(t *testing.T, hello bsoncore.Document) bsoncore.Document {
	t.Helper()
	elems, err := hello.Elements()
	if err != nil {
		t.Fatal(err)
	}
	b := bsoncore.NewDocumentBuilder()
	for _, e := range elems {
		if e.Key() != "compression" {
			b.AppendValue(e.Key(), e.Value())
			continue
		}
		vals, err := e.Value().Array().Values()
		if err != nil {
			t.Fatal(err)
		}
		arr := bsoncore.NewArrayBuilder()
		for _, v := range slices.Backward(vals) {
			arr.AppendString(v.StringValue())
		}
		b.AppendArray("compression", arr.Build())
	}
	return b.Build()
}
