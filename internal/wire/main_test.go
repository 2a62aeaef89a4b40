package wire

import (
	"errors"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// doc marshals a bson.D into a document, failing the test on error.
func doc(tb testing.TB, d bson.D) bsoncore.Document {
	tb.Helper()
	b, err := bson.Marshal(d)
	if err != nil {
		tb.Fatalf("marshal: %v", err)
	}
	return b
}

// concatDocs concatenates documents into a kind-1 payload.
func concatDocs(docs ...bsoncore.Document) []byte {
	var b []byte
	for _, d := range docs {
		b = append(b, d...)
	}
	return b
}

// wantErr fails unless err matches every sentinel in want.
func wantErr(tb testing.TB, err error, want ...error) {
	tb.Helper()
	if err == nil {
		tb.Fatalf("got nil error, want %v", want)
	}
	for _, w := range want {
		if !errors.Is(err, w) {
			tb.Fatalf("error %q does not match %v", err, w)
		}
	}
	var pe *ProtocolError
	if !errors.As(err, &pe) {
		tb.Fatalf("error %q is not a *ProtocolError", err)
	}
}

// put32 overwrites a little-endian int32 at off in a copy of b.
func put32(b []byte, off int, v int32) []byte {
	c := append([]byte(nil), b...)
	le.PutUint32(c[off:], uint32(v))
	return c
}

// withLen fixes messageLength to len(b).
func withLen(b []byte) []byte {
	le.PutUint32(b, uint32(len(b)))
	return b
}

// bsonD builds a bson.D from alternating keys and values.
func bsonD(kv ...any) bson.D {
	d := make(bson.D, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		d = append(d, bson.E{Key: kv[i].(string), Value: kv[i+1]})
	}
	return d
}
