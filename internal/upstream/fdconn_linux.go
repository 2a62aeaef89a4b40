package upstream

import (
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/mongobouncer/mongobouncer/internal/sysconn"
)

// fdConn is a net.Conn over a socket descriptor that is not in Go's
// netpoller. An event loop that keeps the socket in an epoll set of its own
// (the proxy's) then gets its readiness alone: in Go's netpoller too, every
// reply would also wake the runtime's poller thread for nothing, a context
// switch per request.
//
// Blocking reads and writes (the goroutine code, which uses the same pooled
// connections) wait in poll(2) on their own thread, in slices of at most
// pollSlice so that a deadline moved during a wait is seen. Close shuts the
// socket down first, which wakes such a wait at once, and closes the
// descriptor only when no operation uses it any more, so that no operation
// can ever reach a reused descriptor number.
type fdConn struct {
	fd           int
	laddr, raddr net.Addr

	// mu is held shared by every operation on fd for its duration, and
	// exclusively by Close to release fd.
	mu      sync.RWMutex
	closing atomic.Bool
	// rdl and wdl are the read and write deadlines (Unix nanoseconds), 0
	// for none.
	rdl, wdl atomic.Int64
}

// poll(2) events; package syscall does not name them.
const (
	pollIn  = 0x1
	pollOut = 0x4
)

// pollSlice bounds one wait, so that SetDeadline during a blocked
// operation takes effect within it.
const pollSlice = 250 * time.Millisecond

// detach moves nc's socket out of Go's netpoller: it returns an fdConn
// over a duplicate of nc's descriptor and closes nc, whose close takes the
// descriptor out of the netpoller. ok is false, and nc untouched, when nc
// is not a TCP or Unix socket or cannot be duplicated.
func detach(nc net.Conn) (net.Conn, bool) {
	switch nc.(type) {
	case *net.TCPConn, *net.UnixConn:
	default:
		return nil, false
	}
	fd, err := sysconn.Dup(nc)
	if err != nil {
		return nil, false
	}
	// The duplicate shares the open file description, so it is
	// non-blocking as Go made the original.
	c := &fdConn{fd: fd, laddr: nc.LocalAddr(), raddr: nc.RemoteAddr()}
	_ = nc.Close()
	return c, true
}

// acquire starts an operation; false when the connection is closed.
func (c *fdConn) acquire() bool {
	c.mu.RLock()
	if c.closing.Load() {
		c.mu.RUnlock()
		return false
	}
	return true
}

func (c *fdConn) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: c.laddr.Network(), Source: c.laddr, Addr: c.raddr, Err: err}
}

// wait blocks until fd is ready for events, the deadline in dl passes, or
// the connection is shut down. The caller holds mu shared.
func (c *fdConn) wait(events int16, dl *atomic.Int64) error {
	for {
		slice := pollSlice
		if d := dl.Load(); d != 0 {
			left := time.Until(time.Unix(0, d))
			if left <= 0 {
				return os.ErrDeadlineExceeded
			}
			slice = min(slice, left)
		}
		if c.closing.Load() {
			return net.ErrClosed
		}
		pfd := struct {
			fd      int32
			events  int16
			revents int16
		}{fd: int32(c.fd), events: events}
		ts := syscall.NsecToTimespec(int64(slice))
		n, _, e := syscall.Syscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&pfd)), 1,
			uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
		if e != 0 && e != syscall.EINTR {
			return e
		}
		if n > 0 {
			return nil
		}
	}
}

// Read implements net.Conn.
func (c *fdConn) Read(b []byte) (int, error) {
	if !c.acquire() {
		return 0, c.opError("read", net.ErrClosed)
	}
	defer c.mu.RUnlock()
	if len(b) == 0 {
		return 0, nil
	}
	for {
		n, err := syscall.Read(c.fd, b)
		switch {
		case err == nil && n > 0:
			return n, nil
		case err == nil:
			return 0, io.EOF
		case err == syscall.EINTR:
			continue
		case err != syscall.EAGAIN:
			return 0, c.opError("read", os.NewSyscallError("read", err))
		}
		if err := c.wait(pollIn, &c.rdl); err != nil {
			return 0, c.opError("read", err)
		}
	}
}

// Write implements net.Conn: it writes all of b or returns an error.
func (c *fdConn) Write(b []byte) (int, error) {
	if !c.acquire() {
		return 0, c.opError("write", net.ErrClosed)
	}
	defer c.mu.RUnlock()
	done := 0
	for done < len(b) {
		n, err := syscall.Write(c.fd, b[done:])
		if n > 0 {
			done += n
		}
		switch {
		case err == nil || err == syscall.EINTR:
			continue
		case err != syscall.EAGAIN:
			return done, c.opError("write", os.NewSyscallError("write", err))
		}
		if err := c.wait(pollOut, &c.wdl); err != nil {
			return done, c.opError("write", err)
		}
	}
	return done, nil
}

// Close implements net.Conn. It never waits on the network: shutting the
// socket down ends every wait at once.
func (c *fdConn) Close() error {
	if !c.closing.CompareAndSwap(false, true) {
		return c.opError("close", net.ErrClosed)
	}
	_ = syscall.Shutdown(c.fd, syscall.SHUT_RDWR)
	c.mu.Lock()
	err := syscall.Close(c.fd)
	c.mu.Unlock()
	if err != nil {
		return c.opError("close", os.NewSyscallError("close", err))
	}
	return nil
}

// LocalAddr implements net.Conn.
func (c *fdConn) LocalAddr() net.Addr { return c.laddr }

// RemoteAddr implements net.Conn.
func (c *fdConn) RemoteAddr() net.Addr { return c.raddr }

// SetDeadline implements net.Conn.
func (c *fdConn) SetDeadline(t time.Time) error {
	c.rdl.Store(deadlineNanos(t))
	c.wdl.Store(deadlineNanos(t))
	return nil
}

// SetReadDeadline implements net.Conn.
func (c *fdConn) SetReadDeadline(t time.Time) error {
	c.rdl.Store(deadlineNanos(t))
	return nil
}

// SetWriteDeadline implements net.Conn.
func (c *fdConn) SetWriteDeadline(t time.Time) error {
	c.wdl.Store(deadlineNanos(t))
	return nil
}

func deadlineNanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return max(t.UnixNano(), 1)
}

// SyscallConn implements syscall.Conn, for the event loop's non-blocking
// I/O: each call runs while the descriptor cannot be released.
func (c *fdConn) SyscallConn() (syscall.RawConn, error) { return fdRawConn{c}, nil }

// fdRawConn is fdConn's syscall.RawConn.
type fdRawConn struct{ c *fdConn }

// Control implements syscall.RawConn.
func (r fdRawConn) Control(f func(fd uintptr)) error {
	if !r.c.acquire() {
		return r.c.opError("raw-control", net.ErrClosed)
	}
	defer r.c.mu.RUnlock()
	f(uintptr(r.c.fd))
	return nil
}

// Read implements syscall.RawConn: f is called until it returns true,
// waiting for readability between calls.
func (r fdRawConn) Read(f func(fd uintptr) bool) error { return r.do("raw-read", f, pollIn, &r.c.rdl) }

// Write implements syscall.RawConn, as Read for writability.
func (r fdRawConn) Write(f func(fd uintptr) bool) error {
	return r.do("raw-write", f, pollOut, &r.c.wdl)
}

func (r fdRawConn) do(op string, f func(fd uintptr) bool, events int16, dl *atomic.Int64) error {
	if !r.c.acquire() {
		return r.c.opError(op, net.ErrClosed)
	}
	defer r.c.mu.RUnlock()
	for !f(uintptr(r.c.fd)) {
		if err := r.c.wait(events, dl); err != nil {
			return r.c.opError(op, err)
		}
	}
	return nil
}
