package command

// Command and reply inspection (transactions, retryable writes, cursors,
// reply codes), error reply shape and labels.

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

func mustDoc(t testing.TB, v any) bsoncore.Document {
	t.Helper()
	b, err := bson.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestInspectTransactionCommand(t *testing.T) {
	uuid := bson.Binary{Subtype: 4, Data: []byte("0123456789abcdef")}
	body := mustDoc(t, bson.D{
		{Key: "insert", Value: "orders"},
		{Key: "documents", Value: bson.A{bson.D{{Key: "x", Value: 1}}}},
		{Key: "lsid", Value: bson.D{{Key: "id", Value: uuid}}},
		{Key: "txnNumber", Value: int64(7)},
		{Key: "startTransaction", Value: true},
		{Key: "autocommit", Value: false},
		{Key: "$db", Value: "shop"},
	})
	var r Request
	r.Inspect(body)
	if r.Name() != "insert" || !r.Info.Write {
		t.Fatalf("name=%q write=%v", r.Name(), r.Info.Write)
	}
	if string(r.DB) != "shop" {
		t.Fatalf("db=%q", r.DB)
	}
	key, ok := r.Key()
	if !ok || key.Txn != 7 || string(key.LSID[:]) != "0123456789abcdef" || !r.StartTxn {
		t.Fatalf("key=%v ok=%v start=%v", key, ok, r.StartTxn)
	}
}

func TestInspectRetryableWriteIsNotTransaction(t *testing.T) {
	body := mustDoc(t, bson.D{
		{Key: "update", Value: "c"},
		{Key: "lsid", Value: bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: make([]byte, 16)}}}},
		{Key: "txnNumber", Value: int64(3)},
		{Key: "$db", Value: "d"},
	})
	var r Request
	r.Inspect(body)
	if _, ok := r.Key(); ok {
		t.Fatal("a retryable write (no autocommit:false) must not count as a transaction")
	}
}

func TestInspectGetMoreAndUnknown(t *testing.T) {
	var r Request
	r.Inspect(mustDoc(t, bson.D{{Key: "getMore", Value: int64(42)}, {Key: "collection", Value: "c"}, {Key: "$db", Value: "d"}}))
	if r.Info.Kind != GetMore || r.CursorID != 42 {
		t.Fatalf("kind=%v cursor=%d", r.Info.Kind, r.CursorID)
	}
	r.Inspect(mustDoc(t, bson.D{{Key: "someNewCommand", Value: 1}, {Key: "$db", Value: "d"}}))
	if r.Name() != "someNewCommand" || r.Info.Kind != Other {
		t.Fatalf("name=%q", r.Name())
	}
	r.Inspect(bsoncore.Document{5, 0, 0, 0, 0})
	if r.Name() != "" || r.DB != nil {
		t.Fatal("empty document must yield an empty request")
	}
}

func TestInspectReply(t *testing.T) {
	ri := InspectReply(mustDoc(t, bson.D{
		{Key: "cursor", Value: bson.D{{Key: "firstBatch", Value: bson.A{}}, {Key: "id", Value: int64(99)}, {Key: "ns", Value: "d.c"}}},
		{Key: "ok", Value: 1.0},
	}))
	if !ri.OK || ri.CursorID != 99 {
		t.Fatalf("%+v", ri)
	}
	ri = InspectReply(mustDoc(t, bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: int32(251)}}))
	if ri.OK || ri.Code != 251 || ri.Overloaded {
		t.Fatalf("%+v", ri)
	}
	// Overload: code 462, or any code with the SystemOverloadedError label.
	ri = InspectReply(mustDoc(t, bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: int32(462)}}))
	if !ri.Overloaded {
		t.Fatalf("code 462 not overloaded: %+v", ri)
	}
	ri = InspectReply(mustDoc(t, bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: int32(91)},
		{Key: "errorLabels", Value: bson.A{"RetryableError", "SystemOverloadedError"}}}))
	if !ri.Overloaded || ri.Code != 91 {
		t.Fatalf("SystemOverloadedError label not overloaded: %+v", ri)
	}
	ri = InspectReply(mustDoc(t, bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: int32(91)},
		{Key: "errorLabels", Value: bson.A{"RetryableWriteError"}}}))
	if ri.Overloaded {
		t.Fatalf("RetryableWriteError taken for overload: %+v", ri)
	}
}

func TestErrorReplyShape(t *testing.T) {
	doc := ErrorReply(6, "HostUnreachable", "mongobouncer: x", "RetryableWriteError")
	var got struct {
		OK       float64  `bson:"ok"`
		Code     int32    `bson:"code"`
		CodeName string   `bson:"codeName"`
		ErrMsg   string   `bson:"errmsg"`
		Labels   []string `bson:"errorLabels"`
	}
	if err := bson.Unmarshal(doc, &got); err != nil {
		t.Fatal(err)
	}
	if got.OK != 0 || got.Code != 6 || got.CodeName != "HostUnreachable" || got.ErrMsg != "mongobouncer: x" ||
		len(got.Labels) != 1 || got.Labels[0] != "RetryableWriteError" {
		t.Fatalf("%+v", got)
	}
}

func TestLabels(t *testing.T) {
	cases := []struct {
		cmd   string
		inTxn bool
		want  []string
	}{
		{"insert", false, []string{"RetryableWriteError"}},
		{"find", false, nil},
		{"find", true, []string{"TransientTransactionError"}},
		{"commitTransaction", true, []string{"RetryableWriteError", "UnknownTransactionCommitResult"}},
		{"abortTransaction", true, []string{"RetryableWriteError"}},
	}
	for _, c := range cases {
		var r Request
		r.Inspect(mustDoc(t, bson.D{{Key: c.cmd, Value: 1}, {Key: "$db", Value: "d"}}))
		got := Labels(&r, c.inTxn)
		if len(got) != len(c.want) {
			t.Fatalf("%s inTxn=%v: %v, want %v", c.cmd, c.inTxn, got, c.want)
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Fatalf("%s inTxn=%v: %v, want %v", c.cmd, c.inTxn, got, c.want)
			}
		}
	}
}

func BenchmarkInspect(b *testing.B) {
	body := mustDoc(b, bson.D{
		{Key: "find", Value: "orders"},
		{Key: "filter", Value: bson.D{{Key: "status", Value: "A"}}},
		{Key: "batchSize", Value: int32(10)},
		{Key: "lsid", Value: bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: make([]byte, 16)}}}},
		{Key: "$clusterTime", Value: bson.D{{Key: "clusterTime", Value: bson.Timestamp{T: 1, I: 1}}}},
		{Key: "$db", Value: "shop"},
	})
	b.ReportAllocs()
	var r Request
	for b.Loop() {
		r.Inspect(body)
	}
	if string(r.DB) != "shop" {
		b.Fatal(string(r.DB))
	}
}
