package wire

import (
	"bytes"
	"errors"
	"testing"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

func TestAppendToMsgBody(t *testing.T) {
	body := bsoncore.NewDocumentBuilder().AppendInt32("find", 1).AppendString("$db", "test").Build()
	seq := Sequence{Identifier: "documents", Documents: bsoncore.NewDocumentBuilder().AppendInt32("x", 1).Build()}
	rp := bsoncore.NewDocumentBuilder().AppendString("mode", "secondary").Build()
	elem := bsoncore.AppendDocumentElement(nil, "$readPreference", rp)
	for _, flags := range []MsgFlags{0, FlagChecksumPresent} {
		msg := AppendMsg(nil, 7, 0, flags, body, seq)
		out, err := AppendToMsgBody(nil, msg, elem)
		if err != nil {
			t.Fatalf("flags %v: %v", flags, err)
		}
		m, err := ParseMsg(out)
		if err != nil {
			t.Fatalf("flags %v: result does not parse: %v", flags, err)
		}
		h, _ := ParseHeader(out)
		if h.RequestID != 7 || m.Flags != flags || len(m.Sequences) != 1 || !bytes.Equal(m.Sequences[0].Documents, seq.Documents) {
			t.Errorf("flags %v: header or sections changed: %+v %+v", flags, h, m)
		}
		if got, err := m.Body.LookupErr("$readPreference", "mode"); err != nil || got.StringValue() != "secondary" {
			t.Errorf("flags %v: body %v", flags, m.Body)
		}
		if got := m.Body.Lookup("find").Int32(); got != 1 {
			t.Errorf("flags %v: find = %d", flags, got)
		}
		if flags&FlagChecksumPresent != 0 && !ChecksumOK(out) {
			t.Errorf("checksum not recomputed")
		}
	}
	msg := AppendMsg(nil, 7, 0, 0, body)
	if _, err := AppendToMsgBody(nil, msg, []byte{1, 2, 3}); !errors.Is(err, ErrInvalidBSON) {
		t.Errorf("bad element: %v", err)
	}
	// Framed as an element, but a string without its NUL: found by
	// FuzzAppendToMsgBody (testdata/fuzz/FuzzAppendToMsgBody/regression-element-string-without-nul).
	if _, err := AppendToMsgBody(nil, msg, []byte("\x02\x00\x02\x00\x00\x0000")); !errors.Is(err, ErrInvalidBSON) {
		t.Errorf("element with an invalid value: %v", err)
	}
	if _, err := AppendToMsgBody(nil, msg[:len(msg)-1], elem); err == nil {
		t.Errorf("truncated message accepted")
	}
}

func FuzzAppendToMsgBody(f *testing.F) {
	body := bsoncore.NewDocumentBuilder().AppendInt32("find", 1).Build()
	elem := bsoncore.AppendStringElement(nil, "k", "v")
	f.Add(AppendMsg(nil, 1, 0, 0, body), elem)
	f.Add(AppendMsg(nil, 1, 0, FlagChecksumPresent, body), elem)
	f.Add([]byte{}, []byte{})
	f.Fuzz(func(t *testing.T, msg, elem []byte) {
		out, err := AppendToMsgBody(nil, msg, elem)
		if err != nil {
			return
		}
		m, err := ParseMsg(out)
		if err != nil {
			t.Fatalf("result does not parse: %v", err)
		}
		if len(out) != len(msg)+len(elem) {
			t.Fatalf("length %d, want %d", len(out), len(msg)+len(elem))
		}
		if !bytes.HasSuffix(m.Body[:len(m.Body)-1], elem) {
			t.Fatalf("element not at the end of the body")
		}
	})
}
