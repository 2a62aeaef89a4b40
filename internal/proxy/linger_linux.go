package proxy

// Lingering at close. When the server closes, what was written to a client
// may still sit in its socket: in the kernel's send queue, not yet taken
// by a client that reads slowly. Closing a TCP socket with input still
// unread (a pipelining client's next requests) resets the connection, and
// a reset drops every byte still queued, so the client would lose replies
// it was owed. So from Server.Close on, a client's socket is kept open on
// a descriptor of its own (lingerOnClose) whose reading side is shut and
// whose input is discarded, and Close closes that descriptor once the
// kernel has nothing of the socket left to send (awaitFlush), bounded by
// Close's context. Replies the io_uring driver sent on its ring have a
// wait of their own before they reach the socket (loop_ringclose_linux.go).

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/mongobouncer/mongobouncer/internal/sysconn"
)

// discardMax bounds the input a lingering socket discards at a time: a
// client that keeps sending cannot hold the close.
const discardMax = 1 << 20

// flusher holds the client sockets Server.Close lets their replies out of.
// mu guards fds and done (once set, sockets are closed at once); it is
// taken under a client's ownMu, never the other way round.
type flusher struct {
	mu   sync.Mutex
	fds  []int
	done bool
}

// lingerOnClose hands a duplicate of the client's socket to s.flush when
// the server is closing, before its own descriptors are closed. It holds
// ownMu.
func (c *client) lingerOnClose() {
	lc := &c.lc
	if lc.lingered || !c.s.closing.Load() {
		return
	}
	lc.lingered = true
	fd, err := -1, error(nil)
	switch {
	case lc.Fd() >= 0:
		fd, err = sysconn.DupFd(lc.Fd())
	case c.nc != nil:
		nc := c.nc
		if t, ok := nc.(*tlsClientConn); ok {
			nc = t.raw
		}
		fd, err = sysconn.Dup(nc)
	default:
		return
	}
	if err != nil {
		return
	}
	_ = syscall.Shutdown(fd, syscall.SHUT_RD)
	discardInput(fd)
	c.s.flush.add(fd)
}

func (f *flusher) add(fd int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.done {
		_ = syscall.Close(fd)
		return
	}
	f.fds = append(f.fds, fd)
}

// sweep closes the sockets that have nothing left to send (all of them
// with force), and reports how many are left.
func (f *flusher) sweep(force bool) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	left := f.fds[:0]
	for _, fd := range f.fds {
		switch {
		case force:
			abortClose(fd)
		case unsent(fd):
			left = append(left, fd)
		default:
			discardInput(fd)
			_ = syscall.Close(fd)
		}
	}
	clear(f.fds[len(left):])
	f.fds = left
	return len(left)
}

// await waits, bounded by ctx, until every lingering socket has sent what
// it had, closing each as it has; when ctx ends it closes the rest, cut
// short. Later sockets are closed at once.
func (f *flusher) await(ctx context.Context) error {
	defer func() {
		f.mu.Lock()
		f.done = true
		f.mu.Unlock()
		f.sweep(true)
	}()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		n := f.sweep(false)
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("mongobouncer: %d client connections with replies unsent at close: %w", n, ctx.Err())
		case <-tick.C:
		}
	}
}

// abortClose closes fd with a reset: what it had left to send is dropped,
// and the peer hears at once that the connection is gone, where a plain
// close would leave the socket sending behind a client that reads nothing.
func abortClose(fd int) {
	_ = syscall.SetsockoptLinger(fd, syscall.SOL_SOCKET, syscall.SO_LINGER, &syscall.Linger{Onoff: 1, Linger: 0})
	_ = syscall.Close(fd)
}

// unsent reports whether the socket still has bytes the peer has not
// acknowledged (TCP) or read (Unix) and may yet take; false when it
// cannot tell. A TCP connection the peer reset keeps reporting the bytes
// it dropped, so a closed one has nothing left to send.
func unsent(fd int) bool {
	var n int32
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.TIOCOUTQ, uintptr(unsafe.Pointer(&n))); errno != 0 || n <= 0 {
		return false
	}
	return !tcpClosed(fd)
}

// tcpClosed reports whether fd is a TCP socket in state TCP_CLOSE (reset,
// or timed out): the first byte of TCP_INFO is the state.
func tcpClosed(fd int) bool {
	const stateClose = 7
	var info [8]byte
	l := uint32(len(info))
	_, _, errno := syscall.Syscall6(syscall.SYS_GETSOCKOPT, uintptr(fd), syscall.IPPROTO_TCP, syscall.TCP_INFO,
		uintptr(unsafe.Pointer(&info[0])), uintptr(unsafe.Pointer(&l)), 0)
	return errno == 0 && l >= 1 && info[0] == stateClose
}

// discardInput reads and drops what the socket has received (a closed
// client's next requests), up to discardMax, so that closing it does not
// reset the connection. The socket is non-blocking, and its reading side
// shut: a read returns 0 once nothing is left.
func discardInput(fd int) {
	var buf [4096]byte
	for total := 0; total < discardMax; {
		n, err := syscall.Read(fd, buf[:])
		if err == syscall.EINTR {
			continue
		}
		if n <= 0 || err != nil {
			return
		}
		total += n
	}
}
