package wire

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// mustProtocolError fails unless err is nil or a *ProtocolError matching a
// package sentinel: parsers must never leak other error types.
func mustProtocolError(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		return
	}
	var pe *ProtocolError
	if !errors.As(err, &pe) || pe.Err == nil {
		t.Fatalf("not a ProtocolError: %v", err)
	}
}

func FuzzParseMsg(f *testing.F) {
	body := doc(f, bsonD("insert", "c", "$db", "d", "lsid", bsonD("id", "x")))
	d1 := doc(f, bsonD("_id", 1, "a", []any{1, "b"}))
	f.Add(AppendMsg(nil, 1, 0, 0, body))
	f.Add(AppendMsg(nil, 1, 0, FlagChecksumPresent|FlagExhaustAllowed, body, Sequence{Identifier: "documents", Documents: concatDocs(d1, d1)}))
	f.Add(rawMsg(0, false, sec1("updates", d1), sec0(body)))
	f.Add(rawMsg(0, false, sec0(body), sec1Size(100, "documents", d1)))
	f.Add(rawMsg(1<<3, false, sec0(body)))
	f.Add(rawMsg(0, false, sec0(everyType(f))))
	f.Fuzz(func(t *testing.T, msg []byte) {
		var m Msg
		err := ParseMsgInto(msg, &m)
		mustProtocolError(t, err)
		// The relay's check agrees with the parser's on the checksum.
		if ok := ChecksumOK(msg); err == nil && !ok || errors.Is(err, ErrBadChecksum) && ok {
			t.Fatalf("ChecksumOK %v, ParseMsg: %v", ok, err)
		}
		if err != nil {
			return
		}
		// A valid message re-encodes to one that parses to the same view.
		out := AppendMsg(nil, m.Header.RequestID, m.Header.ResponseTo, m.Flags, m.Body, m.Sequences...)
		m2, err := ParseMsg(out)
		if err != nil {
			t.Fatalf("re-encoded message rejected: %v", err)
		}
		if !bytes.Equal(m2.Body, m.Body) || len(m2.Sequences) != len(m.Sequences) || m2.Flags != m.Flags {
			t.Fatal("re-encoded message differs")
		}
		for i := range m.Sequences {
			if m2.Sequences[i].Identifier != m.Sequences[i].Identifier || !bytes.Equal(m2.Sequences[i].Documents, m.Sequences[i].Documents) {
				t.Fatal("sequence differs")
			}
		}
		if name := CommandName(m.Body); name != string(firstKey(m.Body)) {
			t.Fatalf("CommandName %q", name)
		}
		// Stripping the checksum keeps the message valid.
		stripped, err := ClearMsgFlags(append([]byte(nil), msg...), FlagChecksumPresent|FlagExhaustAllowed)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ParseMsg(stripped); err != nil {
			t.Fatalf("stripped message rejected: %v", err)
		}
		_ = CanCompress(msg)
	})
}

func FuzzParseQuery(f *testing.F) {
	q := doc(f, bsonD("isMaster", 1, "client", bsonD("a", "b")))
	f.Add(AppendQuery(nil, 1, 0, "admin.$cmd", 0, -1, q))
	f.Add(withLen(append(AppendQuery(nil, 1, 0, "db.coll", 5, 10, q), q...)))
	f.Fuzz(func(t *testing.T, msg []byte) {
		qu, err := ParseQuery(msg)
		mustProtocolError(t, err)
		if err != nil {
			return
		}
		out := AppendQuery(nil, qu.Header.RequestID, qu.Flags, qu.FullCollectionName, qu.NumberToSkip, qu.NumberToReturn, qu.Query)
		if qu.ReturnFieldsSelector == nil && (!bytes.Equal(out[:8], msg[:8]) || !bytes.Equal(out[12:], msg[12:])) {
			t.Fatal("re-encoded query differs")
		}
		if _, err := ParseQuery(out); err != nil {
			t.Fatalf("re-encoded query rejected: %v", err)
		}
	})
}

func FuzzParseReply(f *testing.F) {
	d := doc(f, bsonD("ok", 1.0, "ismaster", true))
	f.Add(AppendReply(nil, 1, 2, d))
	f.Add(AppendReply(nil, 1, 2, d, d, d))
	f.Add(AppendReply(nil, 1, 2))
	f.Fuzz(func(t *testing.T, msg []byte) {
		r, err := ParseReply(msg)
		mustProtocolError(t, err)
		if err != nil {
			return
		}
		out := AppendReplyFull(nil, r.Header.RequestID, r.Header.ResponseTo, r.ResponseFlags, r.CursorID, r.StartingFrom, r.Documents...)
		if !bytes.Equal(out, msg) {
			t.Fatal("re-encoded reply differs")
		}
	})
}

func FuzzDecompress(f *testing.F) {
	for _, msg := range sampleMessages(f) {
		if len(msg) > 4096 {
			continue
		}
		for _, id := range allCompressors {
			c, err := Compress(nil, msg, id)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(c)
		}
	}
	f.Add(wrap(OpMsg, 1<<20, CompressorZstd, []byte{0x28, 0xb5, 0x2f, 0xfd, 0, 0x58, 0x1, 0, 0}))
	f.Add(wrap(OpMsg, 100, CompressorZlib, []byte{0x78, 0x9c}))
	f.Fuzz(func(t *testing.T, msg []byte) {
		const limit = 1 << 20
		out, err := Decompress(nil, msg, limit)
		mustProtocolError(t, err)
		// What a message makes us allocate is bounded by what its payload
		// could decompress to, never by a size it merely declares.
		if len(msg) >= CompressedHeaderLen {
			ratio := maxRatioZstd
			switch CompressorID(msg[CompressedHeaderLen-1]) {
			case CompressorNoop:
				ratio = 1
			case CompressorSnappy:
				ratio = maxRatioSnappy
			case CompressorZlib:
				ratio = maxRatioZlib
			}
			// Twice: the allocator rounds up to its size classes.
			if cap(out) > 2*(HeaderLen+ratio*(len(msg)-CompressedHeaderLen)) {
				t.Fatalf("allocated %d bytes for a %d-byte message", cap(out), len(msg))
			}
		}
		if err != nil {
			if len(out) != 0 {
				t.Fatal("output on error")
			}
			return
		}
		ch, _ := ParseCompressedHeader(msg)
		if len(out) != HeaderLen+int(ch.UncompressedSize) || len(out) > limit {
			t.Fatalf("output %d bytes, declared %d", len(out), ch.UncompressedSize)
		}
		h, err := ParseHeader(out)
		if err != nil || int(h.MessageLength) != len(out) || h.OpCode != ch.OriginalOpCode || h.RequestID != ch.Header.RequestID {
			t.Fatalf("rebuilt header %+v: %v", h, err)
		}
		// Whatever decompressed must survive a round trip with every codec.
		for _, id := range allCompressors {
			c, err := Compress(nil, out, id)
			if err != nil {
				t.Fatal(err)
			}
			back, err := Decompress(nil, c, limit)
			if err != nil || !bytes.Equal(back, out) {
				t.Fatalf("%v round trip: %v", id, err)
			}
		}
	})
}

func FuzzReadMessage(f *testing.F) {
	m := AppendMsg(nil, 1, 0, 0, doc(f, bsonD("ping", 1)))
	f.Add(m, 0)
	f.Add(append(append([]byte(nil), m...), m...), 64)
	f.Add(m[:20], 0)
	f.Add(put32(m, 0, 1<<30), 1000)
	f.Fuzz(func(t *testing.T, stream []byte, bufCap int) {
		if bufCap < 0 || bufCap > 1<<16 {
			bufCap = 0
		}
		const limit = 1 << 16
		r := bytes.NewReader(stream)
		buf := make([]byte, 0, bufCap)
		total := 0
		for range 1000 {
			msg, err := ReadMessage(r, buf, limit)
			if err == io.EOF {
				if total != len(stream) {
					t.Fatalf("EOF after %d of %d bytes", total, len(stream))
				}
				return
			}
			mustProtocolError(t, err)
			if err != nil {
				return
			}
			n := int(int32(le.Uint32(msg)))
			if n != len(msg) || n < HeaderLen || n > limit || !bytes.Equal(msg, stream[total:total+n]) {
				t.Fatalf("bad message of %d bytes", len(msg))
			}
			total += n
			buf = msg[:0]
		}
	})
}

// FuzzValidateDocument checks ValidateDocument against the driver's own
// validation: whatever the proxy lets through as a well-formed document, the
// driver's readers must be able to walk. CommandName must agree with the
// first key on anything, valid or not.
func FuzzValidateDocument(f *testing.F) {
	f.Add([]byte(everyType(f)))
	f.Add([]byte(doc(f, bsonD("insert", "c", "$db", "d", "lsid", bsonD("id", "x")))))
	f.Add(nest(20))
	f.Add([]byte{5, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		err := ValidateDocument(b)
		mustProtocolError(t, err)
		name := CommandName(b)
		if err != nil {
			return
		}
		if name != string(firstKey(b)) {
			t.Fatalf("CommandName %q, first key %q", name, firstKey(b))
		}
		if derr := bsoncore.Document(b).Validate(); derr != nil {
			t.Fatalf("ValidateDocument accepted what the driver refuses: %v", derr)
		}
	})
}

// FuzzChecksum runs the helpers the relay applies to messages it passes on
// unparsed (ChecksumOK, PeekMsgFlags, CanCompress) and the in-place
// rewriters (UpdateChecksum, ClearMsgFlags) on arbitrary bytes: none may
// panic, a rewritten message must carry a correct checksum, and clearing
// checksumPresent must shorten the message by exactly the checksum.
func FuzzChecksum(f *testing.F) {
	body := doc(f, bsonD("ping", 1, "$db", "admin"))
	f.Add(AppendMsg(nil, 1, 0, FlagChecksumPresent, body))
	f.Add(AppendMsg(nil, 1, 0, FlagChecksumPresent|FlagExhaustAllowed, body, Sequence{Identifier: "documents", Documents: body}))
	f.Add(AppendMsg(nil, 1, 0, 0, body))
	f.Add(rawMsg(FlagChecksumPresent, false))
	f.Fuzz(func(t *testing.T, msg []byte) {
		ok := ChecksumOK(msg)
		flags, isMsg := PeekMsgFlags(msg)
		if !isMsg && !ok {
			t.Fatal("checksum refused on a message that is not OP_MSG")
		}
		_ = CanCompress(msg)

		upd := append([]byte(nil), msg...)
		UpdateChecksum(upd)
		if !ChecksumOK(upd) && len(upd) >= HeaderLen+8 {
			t.Fatal("checksum wrong after UpdateChecksum")
		}
		if !bytes.Equal(upd[:max(0, len(upd)-4)], msg[:max(0, len(msg)-4)]) {
			t.Fatal("UpdateChecksum changed more than the checksum")
		}

		cl, err := ClearMsgFlags(append([]byte(nil), msg...), FlagChecksumPresent|FlagExhaustAllowed)
		mustProtocolError(t, err)
		if err != nil {
			return
		}
		want := len(msg)
		if flags&FlagChecksumPresent != 0 {
			want -= 4
		}
		if len(cl) != want {
			t.Fatalf("ClearMsgFlags: %d bytes, want %d", len(cl), want)
		}
		if f2, _ := PeekMsgFlags(cl); f2&(FlagChecksumPresent|FlagExhaustAllowed) != 0 || !ChecksumOK(cl) {
			t.Fatalf("ClearMsgFlags left flags %v", f2)
		}
	})
}
