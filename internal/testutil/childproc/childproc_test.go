package childproc

import "testing"

func TestTailBuffer(t *testing.T) {
	b := &TailBuffer{Max: 4}
	b.Write([]byte("abc"))
	b.Write([]byte("defg"))
	if got := b.String(); got != "defg" {
		t.Fatalf("tail = %q, want %q", got, "defg")
	}
}
