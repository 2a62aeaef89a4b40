package gate

import (
	"net"
	"testing"
)

// SniffTLS against message prefixes that start like a TLS record: a
// message of 278 bytes starts with 0x16 and must stay plain.
func TestSniffTLSDecides(t *testing.T) {
	cases := []struct {
		in  []byte
		tls bool
	}{
		{[]byte{0x16, 0x01, 0x00, 0x00}, false}, // 278-byte message
		{[]byte{0x16, 0x03, 0x00, 0x00}, false}, // 790-byte message
		{[]byte{0x16, 0x03, 0x01, 0x02}, true},
		{[]byte{0x16, 0x03, 0x03, 0x00}, true},
		{[]byte{0x3a, 0x01, 0x00, 0x00}, false},
	}
	for _, c := range cases {
		a, b := net.Pipe()
		buf := make([]byte, 64)
		go func() {
			// One byte at a time: the decision waits for enough.
			for i := range c.in {
				_, _ = a.Write(c.in[i : i+1])
			}
			a.Close()
		}()
		n, got, err := SniffTLS(b, buf)
		b.Close()
		if err != nil || got != c.tls {
			t.Errorf("% x: tls %v (%v), want %v", c.in, got, err, c.tls)
		}
		if n == 0 || string(buf[:n]) != string(c.in[:n]) {
			t.Errorf("% x: the bytes read were not kept (%d: % x)", c.in, n, buf[:n])
		}
	}
	// A client that leaves before its bytes tell: the error, and what came.
	a, b := net.Pipe()
	go func() { _, _ = a.Write([]byte{0x16}); a.Close() }()
	buf := make([]byte, 64)
	if n, _, err := SniffTLS(b, buf); err == nil || n != 1 {
		t.Fatalf("undecided and gone: %d bytes, %v", n, err)
	}
}

func FuzzTLSRecordStart(f *testing.F) {
	for _, seed := range [][]byte{nil, {0x16}, {0x16, 0x03}, {0x16, 0x03, 0x01}, {0x16, 0x01, 0x00}, {0x3a, 0x01, 0x00, 0x00}} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		isTLS, decided := TLSRecordStart(b)
		if isTLS && !decided {
			t.Fatal("TLS without a decision")
		}
		if decided != (len(b) >= 3 || len(b) > 0 && b[0] != tlsRecordHandshake) {
			t.Fatalf("% x: decided %v", b, decided)
		}
		// More bytes never change a decision.
		if more, d := TLSRecordStart(append(append([]byte(nil), b...), 0x16, 0x03, 0x03)); decided && (!d || more != isTLS) {
			t.Fatalf("% x: the decision changed with more bytes", b)
		}
		if isTLS && (b[0] != 0x16 || b[1] != 3) {
			t.Fatalf("% x taken for TLS", b)
		}
	})
}
