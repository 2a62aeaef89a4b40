package wire

import (
	"bytes"
	"errors"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

func TestMessageLength(t *testing.T) {
	msg := AppendMsg(nil, 1, 0, 0, mustDoc(t, bson.D{{Key: "ping", Value: 1}}))
	for _, tc := range []struct {
		name string
		b    []byte
		max  int
		want int
		err  error
	}{
		{"empty", nil, 0, HeaderLen, nil},
		{"three bytes", msg[:3], 0, HeaderLen, nil},
		{"length known", msg[:4], 0, len(msg), nil},
		{"whole", msg, 0, len(msg), nil},
		{"too small", []byte{15, 0, 0, 0}, 0, 0, ErrMessageTooSmall},
		{"negative", []byte{0, 0, 0, 0x80}, 0, 0, ErrMessageTooSmall},
		{"over the limit", msg, len(msg) - 1, 0, ErrMessageTooLarge},
		{"at the limit", msg, len(msg), len(msg), nil},
		{"over the default", []byte{0x01, 0x6c, 0xdc, 0x02}, 0, 0, ErrMessageTooLarge},
	} {
		got, err := MessageLength(tc.b, tc.max)
		if !errors.Is(err, tc.err) || got != tc.want {
			t.Errorf("%s: MessageLength = %d, %v; want %d, %v", tc.name, got, err, tc.want, tc.err)
		}
	}
}

// GrowMessage keeps the bytes, reuses a buffer with room, and otherwise
// allocates exactly the declared length.
func TestGrowMessage(t *testing.T) {
	b := make([]byte, 4, 64)
	copy(b, "abcd")
	if g := GrowMessage(b, 64); &g[:1][0] != &b[:1][0] {
		t.Fatal("a buffer with room was copied")
	}
	g := GrowMessage(b, 100)
	if cap(g) != 100 || string(g) != "abcd" {
		t.Fatalf("grown to cap %d with %q, want cap 100 with abcd", cap(g), g)
	}
	// A header that claims a large message buys a buffer for what has
	// come, doubling as more comes.
	g = GrowMessage(make([]byte, HeaderLen), DefaultMaxMessageSize)
	if cap(g) != firstReadSize {
		t.Fatalf("first growth toward %d bytes: cap %d, want %d", DefaultMaxMessageSize, cap(g), firstReadSize)
	}
	g = GrowMessage(g[:cap(g)], DefaultMaxMessageSize)
	if cap(g) != 2*firstReadSize || len(g) != firstReadSize {
		t.Fatalf("second growth: len %d cap %d", len(g), cap(g))
	}
}

// NextMessage frames a message that arrives in pieces, and counts bytes
// past it.
func TestNextMessage(t *testing.T) {
	msg := AppendMsg(nil, 1, 0, 0, mustDoc(t, bson.D{{Key: "ping", Value: 1}}))
	for i := range len(msg) {
		f, err := NextMessage(msg[:i], 0)
		if err != nil || f.Msg != nil {
			t.Fatalf("%d bytes: %+v, %v; want incomplete", i, f, err)
		}
		if i >= 4 && f.Need != len(msg) {
			t.Fatalf("%d bytes: need %d, want %d", i, f.Need, len(msg))
		}
	}
	two := append(append([]byte(nil), msg...), msg[:5]...)
	f, err := NextMessage(two, 0)
	if err != nil || !bytes.Equal(f.Msg, msg) || f.Extra != 5 {
		t.Fatalf("message and 5 bytes: %+v, %v", f, err)
	}
	if cap(f.Msg) != len(msg) {
		t.Fatal("the framed message's capacity reaches into the next one")
	}
	if _, err := NextMessage(msg, len(msg)-1); !errors.Is(err, ErrMessageTooLarge) {
		t.Fatalf("over the limit: %v", err)
	}
}

func TestCheckReply(t *testing.T) {
	body := mustDoc(t, bson.D{{Key: "ok", Value: 1.0}})
	reply := AppendMsg(nil, 9, 7, 0, body)
	if err := CheckReply(reply, "a", 7, true); err != nil {
		t.Fatal(err)
	}
	if err := CheckReply(reply, "a", 8, true); !errors.Is(err, ErrUnexpectedReply) {
		t.Fatalf("reply to another request: %v", err)
	}
	if err := CheckReply(reply, "a", 8, false); err != nil {
		t.Fatalf("a stream's later reply is not checked against the request: %v", err)
	}
	sum := AppendMsg(nil, 9, 7, FlagChecksumPresent, body)
	if err := CheckReply(sum, "a", 7, true); err != nil {
		t.Fatal(err)
	}
	sum[len(sum)-1] ^= 1
	if err := CheckReply(sum, "a", 7, true); !errors.Is(err, ErrBadChecksum) {
		t.Fatalf("bad checksum: %v", err)
	}
	if err := CheckReply(reply[:10], "a", 7, true); !errors.Is(err, ErrMessageTooSmall) {
		t.Fatalf("short reply: %v", err)
	}
}

func TestReplyView(t *testing.T) {
	body := mustDoc(t, bson.D{{Key: "ok", Value: 1.0}})
	seq := Sequence{Identifier: "documents", Documents: body}
	for _, tc := range []struct {
		name  string
		msg   []byte
		flags MsgFlags
	}{
		{"plain", AppendMsg(nil, 1, 2, 0, body), 0},
		{"checksum and stream", AppendMsg(nil, 1, 2, FlagChecksumPresent|FlagMoreToCome, body), FlagChecksumPresent | FlagMoreToCome},
		{"with a sequence", AppendMsg(nil, 1, 2, 0, body, seq), 0},
	} {
		flags, b := ReplyView(tc.msg)
		if flags != tc.flags || !bytes.Equal(b, body) {
			t.Errorf("%s: flags %v body %x", tc.name, flags, b)
		}
	}
	if _, b := ReplyView(AppendReply(nil, 1, 2, body)); b != nil {
		t.Error("an OP_REPLY has no OP_MSG body")
	}
}

// FuzzFrame feeds arbitrary received bytes to the framing the relays use:
// nothing may panic, and what is framed is a prefix of the input no longer
// than the limit.
func FuzzFrame(f *testing.F) {
	body, _ := bson.Marshal(bson.D{{Key: "ok", Value: 1.0}})
	f.Add(AppendMsg(nil, 1, 2, 0, body), 1000)
	f.Add(AppendMsg(nil, 1, 2, FlagChecksumPresent|FlagMoreToCome, body), 0)
	f.Add(AppendMsg(nil, 1, 2, 0, body, Sequence{Identifier: "documents", Documents: body}), 64)
	f.Fuzz(func(t *testing.T, b []byte, max int) {
		fr, err := NextMessage(b, max)
		if err != nil || fr.Msg == nil {
			return
		}
		if len(fr.Msg)+fr.Extra != len(b) || !bytes.Equal(fr.Msg, b[:len(fr.Msg)]) {
			t.Fatalf("framed %d + %d of %d bytes", len(fr.Msg), fr.Extra, len(b))
		}
		_ = CheckReply(fr.Msg, "a", 0, true)
		_, _ = ReplyView(fr.Msg)
	})
}

func mustDoc(t *testing.T, d bson.D) []byte {
	t.Helper()
	b, err := bson.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
