package wire

import (
	"bytes"
	"testing"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// benchFind is a typical find command as a driver sends it.
func benchFind(b *testing.B) bsoncore.Document {
	return doc(b, bsonD(
		"find", "orders",
		"filter", bsonD("customerId", 12345, "status", bsonD("$in", []any{"open", "pending"})),
		"limit", 20,
		"lsid", bsonD("id", bsonD("uuid", "0123456789abcdef")),
		"$clusterTime", bsonD("clusterTime", int64(7), "signature", bsonD("hash", make([]byte, 20), "keyId", int64(0))),
		"$db", "shop",
		"$readPreference", bsonD("mode", "primaryPreferred"),
	))
}

// benchInsert is an insert of 100 small documents in a kind-1 sequence.
func benchInsert(b *testing.B) (bsoncore.Document, Sequence) {
	var docs []bsoncore.Document
	for i := range 100 {
		docs = append(docs, doc(b, bsonD("_id", i, "sku", "ABC-123", "qty", i%7, "price", 9.99, "tags", []any{"x", "y"})))
	}
	return doc(b, bsonD("insert", "orders", "ordered", true, "$db", "shop")),
		Sequence{Identifier: "documents", Documents: concatDocs(docs...)}
}

func BenchmarkParseMsg(b *testing.B) {
	find := AppendMsg(nil, 1, 0, 0, benchFind(b))
	body, seq := benchInsert(b)
	insert := AppendMsg(nil, 1, 0, 0, body, seq)
	insertSum := AppendMsg(nil, 1, 0, FlagChecksumPresent, body, seq)
	for _, c := range []struct {
		name string
		msg  []byte
	}{{"find", find}, {"insert100", insert}, {"insert100+crc", insertSum}} {
		b.Run(c.name, func(b *testing.B) {
			var m Msg
			b.SetBytes(int64(len(c.msg)))
			b.ReportAllocs()
			for b.Loop() {
				if err := ParseMsgInto(c.msg, &m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkAppendMsg(b *testing.B) {
	find := benchFind(b)
	body, seq := benchInsert(b)
	buf := make([]byte, 0, 64<<10)
	b.Run("find", func(b *testing.B) {
		b.SetBytes(int64(MsgSize(0, find)))
		b.ReportAllocs()
		for b.Loop() {
			buf = AppendMsg(buf[:0], 1, 0, 0, find)
		}
	})
	b.Run("insert100", func(b *testing.B) {
		b.SetBytes(int64(MsgSize(0, body, seq)))
		b.ReportAllocs()
		for b.Loop() {
			buf = AppendMsg(buf[:0], 1, 0, 0, body, seq)
		}
	})
}

func BenchmarkReadMessage(b *testing.B) {
	body, seq := benchInsert(b)
	msg := AppendMsg(nil, 1, 0, 0, body, seq)
	r := bytes.NewReader(msg)
	buf := make([]byte, 0, 64<<10)
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	for b.Loop() {
		r.Reset(msg)
		if _, err := ReadMessage(r, buf, 0); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCompress(b *testing.B) {
	body, seq := benchInsert(b)
	msg := AppendMsg(nil, 1, 0, 0, body, seq)
	for _, id := range allCompressors {
		b.Run(id.String(), func(b *testing.B) {
			buf := make([]byte, 0, 2*len(msg))
			b.SetBytes(int64(len(msg)))
			b.ReportAllocs()
			for b.Loop() {
				var err error
				if buf, err = Compress(buf[:0], msg, id); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(buf))/float64(len(msg)), "ratio")
		})
	}
}

func BenchmarkDecompress(b *testing.B) {
	body, seq := benchInsert(b)
	msg := AppendMsg(nil, 1, 0, 0, body, seq)
	for _, id := range allCompressors {
		b.Run(id.String(), func(b *testing.B) {
			c, err := Compress(nil, msg, id)
			if err != nil {
				b.Fatal(err)
			}
			buf := make([]byte, 0, 2*len(msg))
			b.SetBytes(int64(len(msg)))
			b.ReportAllocs()
			for b.Loop() {
				if buf, err = Decompress(buf[:0], c, 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
