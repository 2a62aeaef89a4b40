package evloop

// The read window: the one small buffer an endpoint receives into, on the
// loop and on its own goroutine alike, so that a small request costs one
// read and an idle endpoint nothing more.

// WindowSize is the read window's size: small enough to keep idle
// endpoints cheap, large enough for most requests to arrive in one read.
const WindowSize = 512

// Window holds bytes received but not yet consumed: Buf[Lo:Hi].
type Window struct {
	Buf    [WindowSize]byte
	Lo, Hi int
}

// Pending returns the bytes not yet consumed.
func (w *Window) Pending() []byte { return w.Buf[w.Lo:w.Hi] }

// Len is how many bytes are pending.
func (w *Window) Len() int { return w.Hi - w.Lo }

// Free returns the room after the pending bytes, for the next receive.
func (w *Window) Free() []byte { return w.Buf[w.Hi:] }

// Consume drops n bytes, a request being handled, from the front. The
// bytes stay where they are until the next Compact, so slices of them
// remain valid meanwhile.
func (w *Window) Consume(n int) {
	w.Lo += n
	if w.Lo == w.Hi {
		w.Lo, w.Hi = 0, 0
	}
}

// Compact moves the pending bytes to the front, making Free as large as it
// can be.
func (w *Window) Compact() {
	if w.Lo > 0 {
		w.Hi = copy(w.Buf[:], w.Buf[w.Lo:w.Hi])
		w.Lo = 0
	}
}

// Reset empties the window.
func (w *Window) Reset() { w.Lo, w.Hi = 0, 0 }
