package wire

import (
	"bytes"
	"testing"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/wiremessage"
)

// driverMsg builds an OP_MSG the way the Go driver's operation code does,
// using its wiremessage helpers.
func driverMsg(reqID int32, flags wiremessage.MsgFlag, body bsoncore.Document, ident string, docs ...bsoncore.Document) []byte {
	idx, b := wiremessage.AppendHeaderStart(nil, reqID, 0, wiremessage.OpMsg)
	b = wiremessage.AppendMsgFlags(b, flags)
	b = wiremessage.AppendMsgSectionType(b, wiremessage.SingleDocument)
	b = append(b, body...)
	if ident != "" {
		b = wiremessage.AppendMsgSectionType(b, wiremessage.DocumentSequence)
		sidx, sb := bsoncore.ReserveLength(b)
		sb = append(sb, ident...)
		sb = append(sb, 0)
		for _, d := range docs {
			sb = append(sb, d...)
		}
		b = bsoncore.UpdateLength(sb, sidx, int32(len(sb[sidx:])))
	}
	return bsoncore.UpdateLength(b, idx, int32(len(b[idx:])))
}

func TestParseDriverMsg(t *testing.T) {
	body := doc(t, bsonD("insert", "coll", "$db", "db", "lsid", bsonD("id", "u"), "txnNumber", int64(3)))
	d1, d2 := doc(t, bsonD("_id", 1)), doc(t, bsonD("_id", 2, "s", "two"))
	b := driverMsg(41, wiremessage.ExhaustAllowed, body, "documents", d1, d2)
	m, err := ParseMsg(b)
	if err != nil {
		t.Fatal(err)
	}
	if m.Header.RequestID != 41 || m.Flags != FlagExhaustAllowed || !bytes.Equal(m.Body, body) ||
		len(m.Sequences) != 1 || m.Sequences[0].Identifier != "documents" || m.Sequences[0].Len() != 2 {
		t.Fatalf("%+v", m)
	}
	// Our encoder produces the same bytes.
	ours := AppendMsg(nil, 41, 0, FlagExhaustAllowed, body, Sequence{Identifier: "documents", Documents: concatDocs(d1, d2)})
	if !bytes.Equal(ours, b) {
		t.Fatal("AppendMsg differs from the driver's encoding")
	}
	if !wiremessage.IsMsgMoreToCome(AppendMsg(nil, 1, 0, FlagMoreToCome, body)) {
		t.Fatal("driver does not see moreToCome")
	}
}

// TestDriverReadsOurMsg decodes AppendMsg output with the driver's readers.
func TestDriverReadsOurMsg(t *testing.T) {
	body := doc(t, bsonD("ok", 1.0, "cursor", bsonD("id", int64(0), "ns", "a.b", "firstBatch", []any{})))
	d1 := doc(t, bsonD("x", 1))
	b := AppendMsg(nil, 5, 4, FlagChecksumPresent, body, Sequence{Identifier: "ops", Documents: concatDocs(d1, d1)})
	length, reqID, respTo, op, rem, ok := wiremessage.ReadHeader(b)
	if !ok || int(length) != len(b) || reqID != 5 || respTo != 4 || op != wiremessage.OpMsg {
		t.Fatal("header")
	}
	flags, rem, ok := wiremessage.ReadMsgFlags(rem)
	if !ok || flags != wiremessage.ChecksumPresent {
		t.Fatal("flags")
	}
	rem = rem[:len(rem)-4]
	st, rem, ok := wiremessage.ReadMsgSectionType(rem)
	if !ok || st != wiremessage.SingleDocument {
		t.Fatal("section type")
	}
	got, rem, ok := wiremessage.ReadMsgSectionSingleDocument(rem)
	if !ok || !bytes.Equal(got, body) {
		t.Fatal("body")
	}
	st, rem, ok = wiremessage.ReadMsgSectionType(rem)
	if !ok || st != wiremessage.DocumentSequence {
		t.Fatal("section type 1")
	}
	ident, docs, rem, ok := wiremessage.ReadMsgSectionDocumentSequence(rem)
	if !ok || ident != "ops" || len(docs) != 2 || len(rem) != 0 {
		t.Fatalf("sequence %q %d %d", ident, len(docs), len(rem))
	}
}

func TestDriverQueryAndReply(t *testing.T) {
	q := doc(t, bsonD("isMaster", 1, "helloOk", true))
	idx, b := wiremessage.AppendHeaderStart(nil, 3, 0, wiremessage.OpQuery)
	b = wiremessage.AppendQueryFlags(b, wiremessage.SecondaryOK)
	b = wiremessage.AppendQueryFullCollectionName(b, "admin.$cmd")
	b = wiremessage.AppendQueryNumberToSkip(b, 0)
	b = wiremessage.AppendQueryNumberToReturn(b, -1)
	b = append(b, q...)
	b = bsoncore.UpdateLength(b, idx, int32(len(b)))
	got, err := ParseQuery(b)
	if err != nil || got.FullCollectionName != "admin.$cmd" || got.Flags != int32(wiremessage.SecondaryOK) || !bytes.Equal(got.Query, q) {
		t.Fatalf("%v %+v", err, got)
	}
	if ours := AppendQuery(nil, 3, int32(wiremessage.SecondaryOK), "admin.$cmd", 0, -1, q); !bytes.Equal(ours, b) {
		t.Fatal("AppendQuery differs from the driver")
	}

	r := AppendReply(nil, 8, 3, q)
	_, _, respTo, op, rem, ok := wiremessage.ReadHeader(r)
	if !ok || respTo != 3 || op != wiremessage.OpReply {
		t.Fatal("reply header")
	}
	flags, rem, _ := wiremessage.ReadReplyFlags(rem)
	cursor, rem, _ := wiremessage.ReadReplyCursorID(rem)
	_, rem, _ = wiremessage.ReadReplyStartingFrom(rem)
	n, rem, _ := wiremessage.ReadReplyNumberReturned(rem)
	docs, _, ok := wiremessage.ReadReplyDocuments(rem)
	if !ok || flags != wiremessage.AwaitCapable || cursor != 0 || n != 1 || len(docs) != 1 || !bytes.Equal(docs[0], q) {
		t.Fatal("driver cannot read our reply")
	}
}
