package evloop

// Lingering at close. When its user closes a socket, what was written to
// the peer may still sit in it: in the kernel's send queue, not yet taken
// by a peer that reads slowly. Closing a TCP socket with input still
// unread (a pipelining peer's next requests) resets the connection, and a
// reset drops every byte still queued, so the peer would lose replies it
// was owed. So the user may hand the socket, on a descriptor of its own,
// to a Flusher: its reading side is shut and its input discarded, and
// Flusher.Await closes it once the kernel has nothing of it left to send,
// bounded by Await's context. Replies the io_uring driver sent on its ring
// have a wait of their own before they reach the socket
// (ringclose_linux.go, Loop.AwaitSends). When to linger is the user's
// policy (proxy: from Server.Close on); this is the mechanics.

import (
	"context"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/mongobouncer/mongobouncer/internal/sysconn"
)

// discardMax bounds the input a lingering socket discards at a time: a
// client that keeps sending cannot hold the close.
const discardMax = 1 << 20

// Flusher holds the sockets handed to it until their replies are out. mu
// guards fds and done (once set, sockets are closed at once); a user may
// call Linger under its endpoint's Mu (mu is a leaf).
type Flusher struct {
	mu   sync.Mutex
	fds  []int
	done bool
}

// LingerFd hands a duplicate of fd (an endpoint's descriptor, Endpoint.Fd)
// to f; a descriptor that cannot be duplicated is left alone.
func (f *Flusher) LingerFd(fd int) {
	if d, err := sysconn.DupFd(fd); err == nil {
		f.linger(d)
	}
}

// LingerConn hands a duplicate of nc's socket to f (nc is a socket's
// net.Conn, not a TLS layer over one).
func (f *Flusher) LingerConn(nc net.Conn) {
	if d, err := sysconn.Dup(nc); err == nil {
		f.linger(d)
	}
}

// Lingering reports how many sockets f still holds (for tests).
func (f *Flusher) Lingering() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.fds)
}

// linger shuts fd's reading side, drops its input and keeps it until its
// replies are out.
func (f *Flusher) linger(fd int) {
	_ = syscall.Shutdown(fd, syscall.SHUT_RD)
	discardInput(fd)
	f.add(fd)
}

func (f *Flusher) add(fd int) {
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
func (f *Flusher) sweep(force bool) int {
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

// Await waits, bounded by ctx, until every lingering socket has sent what
// it had, closing each as it has; when ctx ends it closes the rest, cut
// short. Later sockets are closed at once.
func (f *Flusher) Await(ctx context.Context) error {
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
