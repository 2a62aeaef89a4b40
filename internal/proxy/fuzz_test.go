package proxy

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// FuzzRequestParsers feeds arbitrary bytes to the parsers the proxy runs on
// command bodies: none may panic. inspect and parseHello are only ever given
// BSON that the wire layer validated, so invalid documents are skipped for
// them; inspectReply and cursorIDs read upstream replies, which are relayed
// without validation, so they must survive anything.
func FuzzRequestParsers(f *testing.F) {
	for _, d := range []bson.D{
		{{Key: "find", Value: "c"}, {Key: "$db", Value: "d"}, {Key: "lsid", Value: bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: make([]byte, 16)}}}},
			{Key: "txnNumber", Value: int64(1)}, {Key: "startTransaction", Value: true}, {Key: "autocommit", Value: false}},
		{{Key: "getMore", Value: int64(7)}, {Key: "collection", Value: "c"}, {Key: "$db", Value: "d"}},
		{{Key: "killCursors", Value: "c"}, {Key: "cursors", Value: bson.A{int64(1), int64(2)}}, {Key: "$db", Value: "d"}},
		{{Key: "hello", Value: 1}, {Key: "compression", Value: bson.A{"zstd"}}, {Key: "client", Value: bson.D{{Key: "application", Value: bson.D{{Key: "name", Value: "x"}}}}}},
		{{Key: "cursor", Value: bson.D{{Key: "id", Value: int64(9)}}}, {Key: "ok", Value: 1.0}, {Key: "code", Value: int32(2)}},
		{{Key: "ok", Value: 0.0}, {Key: "code", Value: int32(10107)}, {Key: "topologyVersion", Value: bson.D{{Key: "processId", Value: bson.NewObjectID()}, {Key: "counter", Value: int64(3)}}}},
		{{Key: "ok", Value: 1.0}, {Key: "writeConcernError", Value: bson.D{{Key: "code", Value: int32(91)}}}},
		{{Key: "aggregate", Value: "c"}, {Key: "pipeline", Value: bson.A{bson.D{{Key: "$out", Value: "o"}}}}, {Key: "$readPreference", Value: bson.D{{Key: "mode", Value: "secondary"}}}},
	} {
		b, _ := bson.Marshal(d)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		doc := bsoncore.Document(b)
		ri := inspectReply(doc)
		if code := ri.stateChange(); code != 0 {
			_ = stateChangeError(code, doc)
		}
		_ = cursorIDs(doc)
		_ = pipelineWrites(doc)
		if wire.ValidateDocument(b) == nil {
			c := append([]byte(nil), b...)
			softenShutdown(c)
			if wire.ValidateDocument(c) != nil {
				t.Fatal("softenShutdown broke a valid document")
			}
		}
		if wire.ValidateDocument(b) != nil {
			return
		}
		var r request
		r.inspect(doc)
		_, _ = r.key()
		_ = parseHello(doc, "hello")
		checkLegacy(t, b)
	})
}
