// Package childproc holds what the test helpers that run a server as a child
// process (devmongo, ferretdb) share: a bounded tail of its output, an
// exclusive lock so that parallel test binaries build it once, and process
// attributes that make the kernel kill it if the test binary dies without
// running its cleanups.
package childproc

import "sync"

// TailBuffer keeps the last Max bytes written to it: enough of a child's
// output to explain a failure without unbounded growth. Its zero Max keeps
// nothing; set Max before use.
type TailBuffer struct {
	Max int

	mu  sync.Mutex // guards buf
	buf []byte
}

// Write appends p, dropping the oldest bytes beyond Max.
func (b *TailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.Max; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

// String returns the bytes kept.
func (b *TailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
