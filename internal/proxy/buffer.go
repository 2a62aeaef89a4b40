package proxy

// Pooled byte buffers for messages and replies, so that memory follows
// load rather than the number of connections.

import "sync"

// buffer is a pooled byte slice. Idle clients hold none: a client takes a
// buffer when a message arrives and returns it when the reply is sent, so
// memory follows load rather than the number of connections.
type buffer struct{ b []byte }

// maxPooledBuffer keeps rare huge messages from pinning memory in the pool.
const maxPooledBuffer = 1 << 20

var buffers = sync.Pool{New: func() any { return &buffer{b: make([]byte, 0, 16*1024)} }}

// getBuffer returns a buffer with capacity for at least n bytes and length n.
func getBuffer(n int) *buffer {
	buf := buffers.Get().(*buffer)
	if cap(buf.b) < n {
		buf.b = make([]byte, n)
	}
	buf.b = buf.b[:n]
	return buf
}

func putBuffer(buf *buffer) {
	if buf == nil || cap(buf.b) > maxPooledBuffer {
		return
	}
	buf.b = buf.b[:0]
	buffers.Put(buf)
}
