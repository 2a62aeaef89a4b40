package wire

import (
	"bytes"
	"slices"
	"testing"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

func TestQueryRoundTrip(t *testing.T) {
	q := doc(t, bsonD("isMaster", 1, "client", bsonD("driver", bsonD("name", "x")), "compression", []any{"zstd"}))
	b := AppendQuery([]byte{9}, 77, 4, "admin.$cmd", 0, -1, q)[1:]
	got, err := ParseQuery(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.Header != (Header{MessageLength: int32(len(b)), RequestID: 77, OpCode: OpQuery}) ||
		got.Flags != 4 || got.FullCollectionName != "admin.$cmd" || got.NumberToSkip != 0 ||
		got.NumberToReturn != -1 || !bytes.Equal(got.Query, q) || got.ReturnFieldsSelector != nil {
		t.Fatalf("%+v", got)
	}
	if CommandName(got.Query) != "isMaster" {
		t.Fatal("command name")
	}

	// With a field selector.
	sel := doc(t, bsonD("a", 1))
	b2 := withLen(append(slices.Clone(b), sel...))
	got, err = ParseQuery(b2)
	if err != nil || !bytes.Equal(got.ReturnFieldsSelector, sel) {
		t.Fatalf("selector: %v", err)
	}
}

func TestParseQueryErrors(t *testing.T) {
	q := doc(t, bsonD("isMaster", 1))
	good := AppendQuery(nil, 1, 0, "admin.$cmd", 0, -1, q)
	nameEnd := HeaderLen + 4 + len("admin.$cmd")
	unterminated := withLen(slices.Clone(good[:nameEnd]))
	badDoc := slices.Clone(good)
	badDoc[len(badDoc)-1] = 7
	cases := map[string]struct {
		msg  []byte
		want error
	}{
		"short":              {good[:10], ErrMessageTooSmall},
		"wrong opcode":       {put32(good, 12, int32(OpMsg)), ErrUnexpectedOpCode},
		"no flags":           {withLen(slices.Clone(good[:HeaderLen+2])), ErrTruncated},
		"name unterminated":  {unterminated, ErrTruncated},
		"no skip/return":     {withLen(slices.Clone(good[:nameEnd+1+6])), ErrTruncated},
		"no query":           {withLen(slices.Clone(good[:nameEnd+1+8])), ErrInvalidBSON},
		"bad query":          {badDoc, ErrInvalidBSON},
		"query overruns":     {put32(good, len(good)-len(q), 200), ErrInvalidBSON},
		"bad selector":       {withLen(append(slices.Clone(good), 5, 0, 0, 0, 1)), ErrInvalidBSON},
		"after selector":     {withLen(append(append(slices.Clone(good), q...), 0)), ErrLengthMismatch},
		"length beyond data": {put32(good, 0, int32(len(good)+3)), ErrTruncated},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := ParseQuery(c.msg)
			wantErr(t, err, c.want)
		})
	}
}

func TestReplyRoundTrip(t *testing.T) {
	d1 := doc(t, bsonD("ismaster", true, "maxWireVersion", 25, "ok", 1.0))
	d2 := doc(t, bsonD("x", 1))
	for _, docs := range [][]bsoncore.Document{nil, {d1}, {d1, d2}} {
		b := AppendReply(nil, 5, 77, docs...)
		r, err := ParseReply(b)
		if err != nil {
			t.Fatal(err)
		}
		if r.Header != (Header{MessageLength: int32(len(b)), RequestID: 5, ResponseTo: 77, OpCode: OpReply}) ||
			r.ResponseFlags != ReplyAwaitCapable || r.CursorID != 0 || r.StartingFrom != 0 ||
			int(r.NumberReturned) != len(docs) || len(r.Documents) != len(docs) {
			t.Fatalf("%+v", r)
		}
		for i := range docs {
			if !bytes.Equal(r.Documents[i], docs[i]) {
				t.Fatalf("doc %d", i)
			}
		}
	}
	b := AppendReplyFull(nil, 1, 2, ReplyQueryFailure, -9, 3, d2)
	r, err := ParseReply(b)
	if err != nil || r.ResponseFlags != ReplyQueryFailure || r.CursorID != -9 || r.StartingFrom != 3 {
		t.Fatalf("%v %+v", err, r)
	}
}

func TestParseReplyErrors(t *testing.T) {
	d := doc(t, bsonD("ok", 1.0))
	good := AppendReply(nil, 1, 2, d, d)
	nrOff := HeaderLen + 16
	bad := slices.Clone(good)
	bad[len(bad)-1] = 3
	cases := map[string]struct {
		msg  []byte
		want error
	}{
		"wrong opcode":            {put32(good, 12, int32(OpQuery)), ErrUnexpectedOpCode},
		"fixed fields short":      {withLen(slices.Clone(good[:HeaderLen+19])), ErrTruncated},
		"numberReturned negative": {put32(good, nrOff, -1), ErrTruncated},
		"numberReturned huge":     {put32(good, nrOff, 1<<30), ErrTruncated},
		"fewer documents":         {put32(good, nrOff, 3), ErrTruncated},
		"more documents":          {put32(good, nrOff, 1), ErrLengthMismatch},
		"invalid document":        {bad, ErrInvalidBSON},
		"trailing garbage":        {withLen(append(slices.Clone(good), 1, 2, 3)), ErrLengthMismatch},
		"document overruns":       {put32(good, len(good)-len(d), 99), ErrInvalidBSON},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := ParseReply(c.msg)
			wantErr(t, err, c.want)
		})
	}
}
