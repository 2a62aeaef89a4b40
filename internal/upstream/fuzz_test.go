package upstream

import (
	"errors"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// FuzzParseHello feeds arbitrary documents to the readers of an upstream's
// replies: ParseHello (the handshake and every monitoring check) and
// commandError (every RoundTrip). Both only ever see bodies that
// wire.ParseMsg validated, so invalid documents are skipped; on valid ones
// neither may panic, and commandError must say nil exactly for ok:1/true.
func FuzzParseHello(f *testing.F) {
	oid := bson.ObjectID{1, 2, 3}
	for _, d := range []bson.D{
		{{Key: "isWritablePrimary", Value: true}, {Key: "maxWireVersion", Value: int32(21)}, {Key: "hosts", Value: bson.A{"a:1", "b:2"}},
			{Key: "logicalSessionTimeoutMinutes", Value: int64(30)}, {Key: "connectionId", Value: 7.0}, {Key: "compression", Value: bson.A{"zstd"}},
			{Key: "topologyVersion", Value: bson.D{{Key: "processId", Value: oid}, {Key: "counter", Value: int64(3)}}}, {Key: "ok", Value: 1.0}},
		{{Key: "ismaster", Value: false}, {Key: "secondary", Value: true}, {Key: "setName", Value: "rs"}, {Key: "serviceId", Value: oid},
			{Key: "maxMessageSizeBytes", Value: 48e6}, {Key: "logicalSessionTimeoutMinutes", Value: nil}, {Key: "ok", Value: true}},
		{{Key: "ok", Value: 0.0}, {Key: "code", Value: int32(11600)}, {Key: "codeName", Value: "InterruptedAtShutdown"},
			{Key: "errmsg", Value: "bye"}, {Key: "errorLabels", Value: bson.A{"RetryableWriteError"}}},
		{{Key: "maxWireVersion", Value: int64(1) << 40}},
	} {
		b, err := bson.Marshal(d)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if wire.ValidateDocument(b) != nil {
			return
		}
		raw := bsoncore.Document(b)
		if h, err := ParseHello(raw); err == nil && len(h.Raw) != len(b) {
			t.Fatal("Raw is not the reply")
		}
		cerr := commandError(raw)
		okv := raw.Lookup("ok")
		num, isNum := okv.AsFloat64OK()
		bv, isBool := okv.BooleanOK()
		if wantNil := isNum && num == 1 || isBool && bv; wantNil != (cerr == nil) {
			t.Fatalf("ok %v: commandError %v", okv, cerr)
		}
		var ce *CommandError
		if cerr != nil && !errors.As(cerr, &ce) {
			t.Fatalf("not a CommandError: %v", cerr)
		}
	})
}
