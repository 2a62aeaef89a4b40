package command

// Fuzz test of the parsers of command and reply bodies and of the legacy
// translation.

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// FuzzInspect feeds arbitrary bytes to the parsers of this package: none
// may panic. Inspect is only ever given BSON that the wire layer
// validated, so invalid documents are skipped for it; InspectReply,
// CursorIDs and SoftenShutdown read upstream replies, which are relayed
// without validation, so they must survive anything. SoftenShutdown keeps
// a valid document valid.
func FuzzInspect(f *testing.F) {
	for _, d := range []bson.D{
		{{Key: "find", Value: "c"}, {Key: "$db", Value: "d"}, {Key: "lsid", Value: bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: make([]byte, 16)}}}},
			{Key: "txnNumber", Value: int64(1)}, {Key: "startTransaction", Value: true}, {Key: "autocommit", Value: false}},
		{{Key: "getMore", Value: int64(7)}, {Key: "collection", Value: "c"}, {Key: "$db", Value: "d"}},
		{{Key: "killCursors", Value: "c"}, {Key: "cursors", Value: bson.A{int64(1), int64(2)}}, {Key: "$db", Value: "d"}},
		{{Key: "cursor", Value: bson.D{{Key: "id", Value: int64(9)}}}, {Key: "ok", Value: 1.0}, {Key: "code", Value: int32(2)}},
		{{Key: "ok", Value: 0.0}, {Key: "code", Value: int32(91)}, {Key: "errorLabels", Value: bson.A{"SystemOverloadedError"}}},
		{{Key: "ok", Value: 1.0}, {Key: "writeConcernError", Value: bson.D{{Key: "code", Value: int32(11600)}}}},
		{{Key: "$query", Value: bson.D{{Key: "ping", Value: 1}}}, {Key: "$readPreference", Value: bson.D{{Key: "mode", Value: "secondary"}}}},
	} {
		b, _ := bson.Marshal(d)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		doc := bsoncore.Document(b)
		ri := InspectReply(doc)
		_ = ri.StateChange()
		_ = CursorIDs(doc)
		c := append([]byte(nil), b...)
		SoftenShutdown(c)
		if wire.ValidateDocument(b) != nil {
			return
		}
		if wire.ValidateDocument(c) != nil {
			t.Fatal("SoftenShutdown broke a valid document")
		}
		var r Request
		r.Inspect(doc)
		_, _ = r.Key()
		checkLegacy(t, b)
	})
}
