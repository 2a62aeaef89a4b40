package loadgen

import (
	"encoding/binary"
	"errors"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/mongobouncer/mongobouncer/internal/uring"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// uringLoops are the event loops of a RelayUring, one per P.
type uringLoops struct {
	loops []*uringLoop
	next  atomic.Uint32
	wg    sync.WaitGroup
}

// uringLoop is one loop: a thread that owns an io_uring and the pairs
// given to it. Every socket always has a receive in flight; a whole
// message is sent to the peer with the next receive linked behind the
// send, so that the buffer is not written while it is being sent.
type uringLoop struct {
	efd   int
	ready chan error

	// mu guards pending and stopped: add queues pairs for the loop thread,
	// the only one allowed to submit.
	mu      sync.Mutex
	pending [][2]int
	stopped bool

	ends  []*uringEnd // by index; the loop thread's alone
	free  []uint32
	ebuf  [8]byte
	ring  *uring.Ring
	stopc bool
}

type uringEnd struct {
	idx      uint32
	fd       int
	peer     *uringEnd
	buf      []byte
	n        int // bytes in buf
	sent     int // bytes of buf being sent to peer
	inflight int
	closed   bool
}

const (
	uringTagEvent = iota
	uringTagRecv
	uringTagSend
)

func startUringLoops() (*uringLoops, error) {
	ls := &uringLoops{}
	for range runtime.GOMAXPROCS(0) {
		efd, _, errno := syscall.Syscall(syscall.SYS_EVENTFD2, 0, syscall.O_CLOEXEC, 0)
		if errno != 0 {
			ls.stop()
			return nil, errno
		}
		l := &uringLoop{efd: int(efd), ready: make(chan error, 1)}
		ls.wg.Add(1)
		go func() {
			defer ls.wg.Done()
			l.run()
		}()
		if err := <-l.ready; err != nil {
			ls.stop()
			return nil, err
		}
		ls.loops = append(ls.loops, l)
	}
	return ls, nil
}

func (ls *uringLoops) add(c, u net.Conn) error {
	cfd, ufd, err := detachPair(c, u)
	if err != nil {
		return err
	}
	l := ls.loops[int(ls.next.Add(1))%len(ls.loops)]
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		_ = syscall.Close(cfd)
		_ = syscall.Close(ufd)
		return errors.New("loadgen: relay closed")
	}
	l.pending = append(l.pending, [2]int{cfd, ufd})
	l.mu.Unlock()
	l.wake()
	return nil
}

func (l *uringLoop) wake() {
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	_, _ = syscall.Write(l.efd, one[:])
}

func (ls *uringLoops) stop() {
	for _, l := range ls.loops {
		l.mu.Lock()
		l.stopped = true
		l.mu.Unlock()
		l.wake()
	}
	ls.wg.Wait()
}

func (l *uringLoop) run() {
	runtime.LockOSThread() // the ring accepts submissions from this thread only
	defer runtime.UnlockOSThread()
	r, err := uring.New(1024)
	if err != nil {
		_ = syscall.Close(l.efd)
		l.ready <- err
		return
	}
	l.ring = r
	l.ready <- nil
	l.armEvent()
	for !l.stopc {
		if err := r.Enter(1); err != nil {
			break
		}
		r.Completions(l.complete)
	}
	for _, e := range l.ends {
		if e != nil && !e.closed {
			_ = syscall.Close(e.fd)
		}
	}
	r.Close() // cancels whatever is still in flight
	_ = syscall.Close(l.efd)
}

func (l *uringLoop) armEvent() {
	l.ring.Read(l.efd, l.ebuf[:], uringTagEvent)
}

func (l *uringLoop) newEnd(fd int) *uringEnd {
	e := &uringEnd{fd: fd, buf: make([]byte, MaxRelayMessage)}
	if n := len(l.free); n > 0 {
		e.idx = l.free[n-1]
		l.free = l.free[:n-1]
		l.ends[e.idx] = e
	} else {
		e.idx = uint32(len(l.ends))
		l.ends = append(l.ends, e)
	}
	return e
}

func (l *uringLoop) recv(e *uringEnd) {
	if e.n >= len(e.buf) {
		l.closePair(e)
		return
	}
	l.ring.Recv(e.fd, e.buf[e.n:], uint64(e.idx)<<8|uringTagRecv, true)
	e.inflight++
}

func (l *uringLoop) complete(ud uint64, res int32) {
	tag := ud & 0xff
	if tag == uringTagEvent {
		l.mu.Lock()
		pend := l.pending
		l.pending = nil
		stopped := l.stopped
		l.mu.Unlock()
		if stopped {
			l.stopc = true
			for _, p := range pend {
				_ = syscall.Close(p[0])
				_ = syscall.Close(p[1])
			}
			return
		}
		for _, p := range pend {
			a, b := l.newEnd(p[0]), l.newEnd(p[1])
			a.peer, b.peer = b, a
			l.recv(a)
			l.recv(b)
		}
		l.armEvent()
		return
	}
	e := l.ends[ud>>8]
	e.inflight--
	if e.closed {
		l.release(e)
		return
	}
	switch tag {
	case uringTagSend:
		if res < 0 || int(res) != e.sent {
			l.closePair(e)
		}
		// The linked receive completes on its own.
	case uringTagRecv:
		if res <= 0 {
			l.closePair(e)
			return
		}
		if e.sent > 0 { // the send behind which this receive was linked is done
			copy(e.buf, e.buf[e.sent:e.n])
			e.n -= e.sent
			// The receive wrote after the old end.
			copy(e.buf[e.n:], e.buf[e.n+e.sent:e.n+e.sent+int(res)])
			e.sent = 0
		}
		e.n += int(res)
		whole := 0
		for e.n-whole >= 4 {
			size := int(int32(binary.LittleEndian.Uint32(e.buf[whole:])))
			if size < wire.HeaderLen || size > MaxRelayMessage {
				l.closePair(e)
				return
			}
			if e.n-whole < size {
				break
			}
			whole += size
		}
		if whole == 0 {
			if e.n == len(e.buf) {
				l.closePair(e)
				return
			}
			l.recv(e)
			return
		}
		l.ring.Send(e.peer.fd, e.buf[:whole], uint64(e.idx)<<8|uringTagSend, true)
		e.inflight++
		e.sent = whole
		l.recv(e)
	}
}

// closePair shuts both sockets down, which completes their receives, and
// releases each end when nothing of it is in flight.
func (l *uringLoop) closePair(e *uringEnd) {
	for _, x := range []*uringEnd{e, e.peer} {
		if x.closed {
			continue
		}
		x.closed = true
		_ = syscall.Shutdown(x.fd, syscall.SHUT_RDWR)
		l.release(x)
	}
}

func (l *uringLoop) release(e *uringEnd) {
	if e.inflight > 0 || e.fd < 0 {
		return
	}
	_ = syscall.Close(e.fd)
	e.fd = -1
	l.ends[e.idx] = nil
	l.free = append(l.free, e.idx)
}
