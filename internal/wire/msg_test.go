package wire

import (
	"bytes"
	"hash/crc32"
	"slices"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// rawMsg assembles an OP_MSG from raw section bytes, with a correct
// messageLength and, if withSum, a correct checksum.
func rawMsg(flags MsgFlags, withSum bool, sections ...[]byte) []byte {
	b := AppendHeader(nil, Header{RequestID: 7, OpCode: OpMsg})
	b = le.AppendUint32(b, uint32(flags))
	for _, s := range sections {
		b = append(b, s...)
	}
	if withSum {
		b = append(b, 0, 0, 0, 0)
	}
	withLen(b)
	if withSum {
		le.PutUint32(b[len(b)-4:], crc32.Checksum(b[:len(b)-4], castagnoli))
	}
	return b
}

func sec0(d []byte) []byte { return append([]byte{0}, d...) }

func sec1(ident string, docs []byte) []byte {
	return sec1Size(int32(4+len(ident)+1+len(docs)), ident, docs)
}

func sec1Size(size int32, ident string, docs []byte) []byte {
	b := []byte{1}
	b = le.AppendUint32(b, uint32(size))
	b = append(b, ident...)
	b = append(b, 0)
	return append(b, docs...)
}

func TestCRC32CVector(t *testing.T) {
	// The standard CRC-32C check value (RFC 3720, B.4).
	if got := crc32.Checksum([]byte("123456789"), castagnoli); got != 0xE3069283 {
		t.Fatalf("crc32c = %#x", got)
	}
}

func TestMsgRoundTrip(t *testing.T) {
	body := doc(t, bsonD("insert", "coll", "$db", "test", "ordered", true))
	d1 := doc(t, bsonD("_id", 1, "x", "a"))
	d2 := doc(t, bsonD("_id", 2, "y", bsonD("nested", []any{1, "two", 3.0})))
	seqs := []Sequence{{Identifier: "documents", Documents: concatDocs(d1, d2)}, {Identifier: "custom", Documents: nil}}
	for _, flags := range []MsgFlags{0, FlagMoreToCome, FlagChecksumPresent, FlagChecksumPresent | FlagExhaustAllowed, 1 << 20} {
		for _, ss := range [][]Sequence{nil, seqs} {
			prefix := []byte("prefix")
			b := AppendMsg(slices.Clone(prefix), 11, 22, flags, body, ss...)
			if !bytes.Equal(b[:len(prefix)], prefix) {
				t.Fatal("prefix clobbered")
			}
			b = b[len(prefix):]
			if len(b) != MsgSize(flags, body, ss...) {
				t.Fatalf("len %d, MsgSize %d", len(b), MsgSize(flags, body, ss...))
			}
			m, err := ParseMsg(b)
			if err != nil {
				t.Fatalf("flags %v: %v", flags, err)
			}
			if m.Header != (Header{MessageLength: int32(len(b)), RequestID: 11, ResponseTo: 22, OpCode: OpMsg}) {
				t.Fatalf("header %+v", m.Header)
			}
			if m.Flags != flags || !bytes.Equal(m.Body, body) || len(m.Sequences) != len(ss) {
				t.Fatalf("got %+v", m)
			}
			for i := range ss {
				if m.Sequences[i].Identifier != ss[i].Identifier || !bytes.Equal(m.Sequences[i].Documents, ss[i].Documents) {
					t.Fatalf("sequence %d: %+v", i, m.Sequences[i])
				}
			}
			if flags.Has(FlagChecksumPresent) {
				if m.Checksum != le.Uint32(b[len(b)-4:]) || m.Checksum == 0 {
					t.Fatalf("checksum %#x", m.Checksum)
				}
			} else if m.Checksum != 0 {
				t.Fatal("checksum without flag")
			}
			if CommandName(m.Body) != "insert" {
				t.Fatal(CommandName(m.Body))
			}
		}
	}
}

func TestParseMsgAliasesBuffer(t *testing.T) {
	body := doc(t, bsonD("ping", 1))
	b := AppendMsg(nil, 1, 0, 0, body, Sequence{Identifier: "documents", Documents: body})
	m, err := ParseMsg(b)
	if err != nil {
		t.Fatal(err)
	}
	if &m.Body[0] != &b[HeaderLen+5] {
		t.Fatal("body is a copy")
	}
	if &m.Sequences[0].Documents[0] != &b[len(b)-len(body)] {
		t.Fatal("sequence is a copy")
	}
}

func TestSequenceBeforeBody(t *testing.T) {
	body := doc(t, bsonD("update", "c", "$db", "d"))
	u := doc(t, bsonD("q", bsonD(), "u", bsonD("$set", bsonD("a", 1))))
	b := rawMsg(0, false, sec1("updates", u), sec0(body))
	m, err := ParseMsg(b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(m.Body, body) || len(m.Sequences) != 1 || m.Sequences[0].Len() != 1 {
		t.Fatalf("%+v", m)
	}
}

func TestSequenceIteration(t *testing.T) {
	var docs []bsoncore.Document
	for i := range 5 {
		docs = append(docs, doc(t, bsonD("i", i)))
	}
	s := Sequence{Identifier: "documents", Documents: concatDocs(docs...)}
	i := 0
	for d := range s.All() {
		if !bytes.Equal(d, docs[i]) {
			t.Fatalf("doc %d differs", i)
		}
		i++
		if i == 3 {
			break
		}
	}
	if i != 3 || s.Len() != 5 {
		t.Fatalf("i %d len %d", i, s.Len())
	}
	// Malformed hand-built sequences stop without panicking.
	bad := Sequence{Documents: append(concatDocs(docs[0]), 0xff, 0xff, 0xff, 0x7f, 0)}
	if bad.Len() != 1 {
		t.Fatalf("bad len %d", bad.Len())
	}
}

func TestParseMsgErrors(t *testing.T) {
	body := doc(t, bsonD("find", "c", "$db", "d"))
	d1 := doc(t, bsonD("a", 1))
	good := rawMsg(0, false, sec0(body))
	if _, err := ParseMsg(good); err != nil {
		t.Fatal(err)
	}
	badBSON := slices.Clone(body)
	badBSON[4] = 0x42 // unknown element type
	noNul := slices.Clone(body)
	noNul[len(noNul)-1] = 1
	withSum := rawMsg(FlagChecksumPresent, true, sec0(body))
	withSum[len(withSum)-1] ^= 0xff
	sumFlagNoRoom := rawMsg(FlagChecksumPresent, false, sec0(body)) // last 4 body bytes read as checksum

	cases := []struct {
		name string
		msg  []byte
		want error
	}{
		{"empty", nil, ErrMessageTooSmall},
		{"shorter than header", good[:15], ErrMessageTooSmall},
		{"messageLength under 16", put32(good, 0, 12), ErrMessageTooSmall},
		{"messageLength beyond slice", put32(good, 0, int32(len(good)+1)), ErrTruncated},
		{"slice beyond messageLength", append(slices.Clone(good), 0), ErrLengthMismatch},
		{"wrong opcode", put32(good, 12, int32(OpQuery)), ErrUnexpectedOpCode},
		{"unknown opcode", put32(good, 12, 4242), ErrUnknownOpCode},
		{"header only", withLen(slices.Clone(good[:HeaderLen])), ErrTruncated},
		{"flags only", withLen(slices.Clone(good[:HeaderLen+4])), ErrTruncated},
		{"unknown required flag bit 2", rawMsg(1<<2, false, sec0(body)), ErrUnknownFlags},
		{"unknown required flag bit 15", rawMsg(1<<15, false, sec0(body)), ErrUnknownFlags},
		{"bad checksum", withSum, ErrBadChecksum},
		{"checksum flag without checksum", sumFlagNoRoom, ErrBadChecksum},
		{"no kind-0 section", rawMsg(0, false, sec1("documents", d1)), ErrBadSection},
		{"two kind-0 sections", rawMsg(0, false, sec0(body), sec0(body)), ErrBadSection},
		{"unknown section kind", rawMsg(0, false, sec0(body), []byte{2, 5, 0, 0, 0, 0}), ErrBadSection},
		{"unknown section kind at end", rawMsg(0, false, sec0(body), []byte{9}), ErrBadSection},
		{"section kind without size", rawMsg(0, false, sec0(body), []byte{1, 6, 0}), ErrTruncated},
		{"body truncated", withLen(slices.Clone(good[:len(good)-1])), ErrInvalidBSON},
		{"body length too small", rawMsg(0, false, sec0([]byte{4, 0, 0, 0, 0})), ErrInvalidBSON},
		{"body length negative", rawMsg(0, false, sec0([]byte{0, 0, 0, 0x80, 0})), ErrInvalidBSON},
		{"body invalid element", rawMsg(0, false, sec0(badBSON)), ErrInvalidBSON},
		{"body missing terminator", rawMsg(0, false, sec0(noNul)), ErrInvalidBSON},
		{"body with trailing bytes", rawMsg(0, false, sec0(body), []byte{0}), ErrTruncated},
		{"kind-1 size below minimum", rawMsg(0, false, sec0(body), sec1Size(5, "", nil)), ErrBadSection},
		{"kind-1 size negative", rawMsg(0, false, sec0(body), sec1Size(-8, "documents", d1)), ErrBadSection},
		{"kind-1 size overruns message", rawMsg(0, false, sec0(body), sec1Size(int32(4+10+len(d1)+1), "documents", d1)), ErrBadSection},
		{"kind-1 size cuts a document", rawMsg(0, false, sec0(body), sec1Size(int32(4+10+len(d1)-1), "documents", d1), []byte{0}), ErrInvalidBSON},
		{"kind-1 size shorter than identifier", rawMsg(0, false, sec0(body), sec1Size(7, "documents", nil)), ErrBadSection},
		{"kind-1 empty identifier", rawMsg(0, false, sec0(body), sec1("", d1)), ErrBadSection},
		{"kind-1 duplicate identifier", rawMsg(0, false, sec0(body), sec1("documents", d1), sec1("documents", d1)), ErrBadSection},
		{"kind-1 invalid document", rawMsg(0, false, sec0(body), sec1("documents", badBSON)), ErrInvalidBSON},
		{"kind-1 trailing garbage", rawMsg(0, false, sec0(body), sec1("documents", append(slices.Clone(d1), 1, 2))), ErrInvalidBSON},
		{"kind-1 document length overrun", rawMsg(0, false, sec0(body), sec1("documents", put32(d1, 0, 100))), ErrInvalidBSON},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := Msg{Sequences: make([]Sequence, 0, 4)}
			err := ParseMsgInto(c.msg, &m)
			wantErr(t, err, c.want)
			if m.Body != nil || len(m.Sequences) != 0 || m.Flags != 0 {
				t.Fatalf("m not reset: %+v", m)
			}
			if cap(m.Sequences) != 4 {
				t.Fatal("sequences backing array dropped")
			}
		})
	}
}

func TestTooManySequences(t *testing.T) {
	body := doc(t, bsonD("insert", "c"))
	secs := [][]byte{sec0(body)}
	for i := range maxSequences {
		secs = append(secs, sec1("s"+strings.Repeat("x", i), nil))
	}
	if _, err := ParseMsg(rawMsg(0, false, secs...)); err != nil {
		t.Fatalf("at the cap: %v", err)
	}
	secs = append(secs, sec1("one-more", nil))
	_, err := ParseMsg(rawMsg(0, false, secs...))
	wantErr(t, err, ErrBadSection)
}

func TestOptionalFlagsIgnored(t *testing.T) {
	body := doc(t, bsonD("getMore", int64(5), "collection", "c"))
	m, err := ParseMsg(rawMsg(FlagExhaustAllowed|1<<17|1<<31, false, sec0(body)))
	if err != nil {
		t.Fatal(err)
	}
	if !m.Flags.Has(FlagExhaustAllowed) || m.Flags.Has(FlagMoreToCome) {
		t.Fatalf("flags %v", m.Flags)
	}
	if s := m.Flags.String(); s != "exhaustAllowed|0x80020000" {
		t.Fatalf("String = %q", s)
	}
	if s := (FlagChecksumPresent | FlagMoreToCome).String(); s != "checksumPresent|moreToCome" {
		t.Fatalf("String = %q", s)
	}
}

func TestChecksumUpdateAndClear(t *testing.T) {
	body := doc(t, bsonD("getMore", int64(5), "collection", "c", "$db", "d"))
	d1 := doc(t, bsonD("a", 1))
	orig := AppendMsg(nil, 1, 0, FlagChecksumPresent|FlagExhaustAllowed, body, Sequence{Identifier: "documents", Documents: d1})
	if _, err := ParseMsg(orig); err != nil {
		t.Fatal(err)
	}

	// Rewriting an id invalidates the checksum until it is updated.
	b := slices.Clone(orig)
	SetRequestID(b, 42)
	_, err := ParseMsg(b)
	wantErr(t, err, ErrBadChecksum)
	if !ChecksumOK(orig) || ChecksumOK(b) || ChecksumOK(b[:HeaderLen+6]) {
		t.Fatal("ChecksumOK disagrees with ParseMsg")
	}
	if plain := AppendMsg(nil, 1, 0, 0, body); !ChecksumOK(plain) || !ChecksumOK(AppendReply(nil, 1, 0, body)) {
		t.Fatal("ChecksumOK refuses a message without a checksum")
	}
	UpdateChecksum(b)
	m, err := ParseMsg(b)
	if err != nil || m.Header.RequestID != 42 {
		t.Fatalf("after UpdateChecksum: %v", err)
	}

	// Clearing exhaustAllowed keeps a valid checksum.
	b2, err := ClearMsgFlags(slices.Clone(b), FlagExhaustAllowed)
	if err != nil {
		t.Fatal(err)
	}
	m, err = ParseMsg(b2)
	if err != nil || m.Flags != FlagChecksumPresent || len(b2) != len(b) {
		t.Fatalf("clear exhaust: %v %v", err, m.Flags)
	}

	// Clearing checksumPresent drops the 4 bytes and fixes the length.
	b3, err := ClearMsgFlags(slices.Clone(b), FlagChecksumPresent|FlagExhaustAllowed)
	if err != nil {
		t.Fatal(err)
	}
	if len(b3) != len(b)-4 {
		t.Fatalf("len %d", len(b3))
	}
	m, err = ParseMsg(b3)
	if err != nil || m.Flags != 0 || m.Checksum != 0 || len(m.Sequences) != 1 {
		t.Fatalf("clear checksum: %v %+v", err, m)
	}
	want := AppendMsg(nil, 42, 0, 0, body, Sequence{Identifier: "documents", Documents: d1})
	if !bytes.Equal(b3, want) {
		t.Fatal("stripped message differs from a freshly built one")
	}

	// Clearing a flag that is not set changes nothing.
	b4, err := ClearMsgFlags(slices.Clone(b3), FlagMoreToCome|FlagChecksumPresent)
	if err != nil || !bytes.Equal(b4, b3) {
		t.Fatalf("no-op clear: %v", err)
	}

	// Not an OP_MSG.
	q := AppendQuery(nil, 1, 0, "admin.$cmd", 0, -1, body)
	_, err = ClearMsgFlags(q, FlagChecksumPresent)
	wantErr(t, err, ErrUnexpectedOpCode)
	// UpdateChecksum ignores messages without the flag and short ones.
	before := slices.Clone(b3)
	UpdateChecksum(b3)
	UpdateChecksum(q)
	UpdateChecksum(b3[:10])
	if !bytes.Equal(before, b3) {
		t.Fatal("UpdateChecksum changed a message without checksum")
	}
}

func TestPeekMsgFlags(t *testing.T) {
	b := AppendMsg(nil, 1, 0, FlagMoreToCome, doc(t, bsonD("insert", "c")))
	if f, ok := PeekMsgFlags(b); !ok || f != FlagMoreToCome {
		t.Fatalf("%v %v", f, ok)
	}
	if _, ok := PeekMsgFlags(b[:19]); ok {
		t.Fatal("short message accepted")
	}
	if _, ok := PeekMsgFlags(AppendReply(nil, 1, 2)); ok {
		t.Fatal("OP_REPLY accepted")
	}
}

func TestMsgZeroAlloc(t *testing.T) {
	body := doc(t, bsonD("find", "coll", "filter", bsonD("a", 1), "$db", "test", "lsid", bsonD("id", "x")))
	d1 := doc(t, bsonD("_id", 1))
	plain := AppendMsg(nil, 1, 0, 0, body)
	withSeq := AppendMsg(nil, 1, 0, FlagChecksumPresent, body, Sequence{Identifier: "documents", Documents: concatDocs(d1, d1)})

	if a := testing.AllocsPerRun(200, func() {
		if _, err := ParseMsg(plain); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Errorf("ParseMsg without sequences: %v allocs", a)
	}
	var m Msg
	if a := testing.AllocsPerRun(200, func() {
		if err := ParseMsgInto(withSeq, &m); err != nil {
			t.Fatal(err)
		}
	}); a != 0 {
		t.Errorf("ParseMsgInto with sequences: %v allocs", a)
	}
	buf := make([]byte, 0, 4096)
	seq := Sequence{Identifier: "documents", Documents: d1}
	if a := testing.AllocsPerRun(200, func() {
		buf = AppendMsg(buf[:0], 1, 2, FlagChecksumPresent, body, seq)
	}); a != 0 {
		t.Errorf("AppendMsg: %v allocs", a)
	}
	if a := testing.AllocsPerRun(200, func() {
		_ = CommandName(body)
	}); a != 0 {
		t.Errorf("CommandName: %v allocs", a)
	}
}
