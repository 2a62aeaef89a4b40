package wire

import (
	"bytes"
	"errors"
	"io"
	"runtime"
	"testing"
	"testing/iotest"
)

func TestOpCodeString(t *testing.T) {
	cases := map[OpCode]string{
		OpReply: "OP_REPLY", OpUpdate: "OP_UPDATE", OpInsert: "OP_INSERT", OpQuery: "OP_QUERY",
		OpGetMore: "OP_GET_MORE", OpDelete: "OP_DELETE", OpKillCursors: "OP_KILL_CURSORS",
		OpCompressed: "OP_COMPRESSED", OpMsg: "OP_MSG", 2003: "OpCode(2003)", -1: "OpCode(-1)",
	}
	for op, want := range cases {
		if got := op.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", int32(op), got, want)
		}
		if known := op.Known(); known != (want[:3] == "OP_") {
			t.Errorf("%d.Known() = %v", int32(op), known)
		}
	}
}

func TestHeaderRoundTrip(t *testing.T) {
	h := Header{MessageLength: 1234, RequestID: -7, ResponseTo: 1 << 30, OpCode: OpMsg}
	b := AppendHeader([]byte("xx"), h)
	if len(b) != 2+HeaderLen {
		t.Fatalf("len = %d", len(b))
	}
	got, err := ParseHeader(b[2:])
	if err != nil || got != h {
		t.Fatalf("ParseHeader = %+v, %v; want %+v", got, err, h)
	}
}

func TestParseHeaderErrors(t *testing.T) {
	_, err := ParseHeader(make([]byte, 15))
	wantErr(t, err, ErrTruncated)
	for _, n := range []int32{0, 15, -1, -1 << 31} {
		b := AppendHeader(nil, Header{MessageLength: n, OpCode: OpMsg})
		_, err := ParseHeader(b)
		wantErr(t, err, ErrMessageTooSmall)
	}
}

func TestSetIDs(t *testing.T) {
	b := AppendHeader(nil, Header{MessageLength: 16, RequestID: 1, ResponseTo: 2, OpCode: OpReply})
	SetRequestID(b, 99)
	SetResponseTo(b, -5)
	h, _ := ParseHeader(b)
	if h.RequestID != 99 || h.ResponseTo != -5 || h.MessageLength != 16 || h.OpCode != OpReply {
		t.Fatalf("got %+v", h)
	}
	short := []byte{1, 2, 3}
	SetRequestID(short, 1) // must not panic
	SetResponseTo(short, 1)
	if !bytes.Equal(short, []byte{1, 2, 3}) {
		t.Fatal("short slice modified")
	}
}

// countingReader records how many bytes were taken from it.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// oneByteReader returns at most one byte per Read, to exercise short reads.
type oneByteReader struct{ r io.Reader }

func (o oneByteReader) Read(p []byte) (int, error) {
	if len(p) > 1 {
		p = p[:1]
	}
	return o.r.Read(p)
}

func TestReadMessage(t *testing.T) {
	m1 := AppendMsg(nil, 1, 0, 0, doc(t, bsonD("ping", 1)))
	m2 := AppendMsg(nil, 2, 0, FlagChecksumPresent, doc(t, bsonD("find", "c")))
	stream := append(append([]byte(nil), m1...), m2...)

	t.Run("reuses buffer", func(t *testing.T) {
		buf := make([]byte, 0, 4096)
		r := bytes.NewReader(stream)
		got, err := ReadMessage(r, buf, 0)
		if err != nil || !bytes.Equal(got, m1) {
			t.Fatalf("first: %v", err)
		}
		if &got[0] != &buf[:1][0] {
			t.Fatal("did not reuse buf")
		}
		got, err = ReadMessage(oneByteReader{r}, got[:0], 0)
		if err != nil || !bytes.Equal(got, m2) {
			t.Fatalf("second: %v", err)
		}
		if _, err := ReadMessage(r, got[:0], 0); err != io.EOF {
			t.Fatalf("at end: %v, want io.EOF", err)
		}
	})
	t.Run("allocates exactly", func(t *testing.T) {
		for _, buf := range [][]byte{nil, make([]byte, 0, 20)} {
			got, err := ReadMessage(bytes.NewReader(m1), buf, 0)
			if err != nil || !bytes.Equal(got, m1) {
				t.Fatalf("err %v", err)
			}
			if cap(got) != len(m1) {
				t.Fatalf("cap %d, want %d", cap(got), len(m1))
			}
		}
	})
	t.Run("too large rejected after header", func(t *testing.T) {
		big := put32(m1, 0, 1<<30)
		cr := &countingReader{r: bytes.NewReader(big)}
		_, err := ReadMessage(cr, nil, 1000)
		wantErr(t, err, ErrMessageTooLarge)
		if cr.n != HeaderLen {
			t.Fatalf("read %d bytes, want %d", cr.n, HeaderLen)
		}
		// Exactly maxSize is fine.
		if _, err := ReadMessage(bytes.NewReader(m1), nil, len(m1)); err != nil {
			t.Fatal(err)
		}
		_, err = ReadMessage(bytes.NewReader(m1), nil, len(m1)-1)
		wantErr(t, err, ErrMessageTooLarge)
		// Default limit.
		_, err = ReadMessage(bytes.NewReader(put32(m1, 0, DefaultMaxMessageSize+1)), nil, 0)
		wantErr(t, err, ErrMessageTooLarge)
	})
	t.Run("too small", func(t *testing.T) {
		for _, n := range []int32{15, 0, -100} {
			_, err := ReadMessage(bytes.NewReader(put32(m1, 0, n)), nil, 0)
			wantErr(t, err, ErrMessageTooSmall)
		}
	})
	t.Run("truncated", func(t *testing.T) {
		for _, n := range []int{1, 15, 16, len(m1) - 1} {
			_, err := ReadMessage(bytes.NewReader(m1[:n]), nil, 0)
			wantErr(t, err, ErrTruncated, io.ErrUnexpectedEOF)
		}
		if _, err := ReadMessage(bytes.NewReader(nil), nil, 0); err != io.EOF {
			t.Fatalf("empty stream: %v, want io.EOF", err)
		}
	})
	t.Run("header only message", func(t *testing.T) {
		h := AppendHeader(nil, Header{MessageLength: 16, OpCode: OpMsg})
		got, err := ReadMessage(bytes.NewReader(h), nil, 0)
		if err != nil || len(got) != 16 {
			t.Fatalf("%v %d", err, len(got))
		}
	})
	t.Run("read error passes through", func(t *testing.T) {
		boom := errors.New("boom")
		r := io.MultiReader(bytes.NewReader(m1[:20]), errReader{boom})
		_, err := ReadMessage(r, nil, 0)
		if !errors.Is(err, boom) {
			t.Fatalf("got %v", err)
		}
	})
}

// TestReadMessageGrowsWithData checks that ReadMessage allocates for the
// bytes that arrive, not for the length a header declares: a peer that
// announces 40 MB and sends a header alone must not cost 40 MB.
func TestReadMessageGrowsWithData(t *testing.T) {
	hdr := AppendHeader(nil, Header{MessageLength: 40_000_000, RequestID: 1, OpCode: OpMsg})
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 10 {
		_, err := ReadMessage(bytes.NewReader(hdr), nil, 0)
		wantErr(t, err, ErrTruncated)
	}
	runtime.ReadMemStats(&after)
	if d := after.TotalAlloc - before.TotalAlloc; d > 2<<20 {
		t.Fatalf("allocated %d bytes for 10 bare headers", d)
	}

	// A message larger than the first allocation still arrives whole,
	// also when the reader hands it over in pieces.
	big := make([]byte, 3<<20+5)
	for i := range big {
		big[i] = byte(i * 7)
	}
	copy(big, AppendHeader(nil, Header{MessageLength: int32(len(big)), RequestID: 2, OpCode: OpMsg}))
	for _, r := range []io.Reader{bytes.NewReader(big), iotest.HalfReader(bytes.NewReader(big))} {
		got, err := ReadMessage(r, make([]byte, 0, 100), 0)
		if err != nil || !bytes.Equal(got, big) {
			t.Fatalf("big message: %v", err)
		}
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

func TestReadMessageNoAllocWithBuffer(t *testing.T) {
	m := AppendMsg(nil, 1, 0, 0, doc(t, bsonD("ping", 1)))
	r := bytes.NewReader(m)
	buf := make([]byte, 0, 1024)
	allocs := testing.AllocsPerRun(100, func() {
		r.Reset(m)
		if _, err := ReadMessage(r, buf, 0); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("allocs = %v", allocs)
	}
}
