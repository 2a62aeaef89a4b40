package proxy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/mongobouncer/mongobouncer/internal/uring"
)

// With io_uring the loop makes no read system call and no epoll_wait: every
// socket the loop waits on has a receive in flight on a loop thread's ring
// (a client's into its rbuf while it is idle, an upstream connection's into
// the reply buffer while a request is out on it), and a thread submits the
// receives it prepared and collects the completions of its ring in one
// io_uring_enter per batch. Writes stay plain non-blocking write calls, so
// everything that follows a write (a partial write handed to a goroutine,
// a request failed on a broken upstream) is as with epoll.
//
// A ring takes submissions from the thread that made it only, so each loop
// thread is locked to its OS thread. Any thread may act on any client, as
// with epoll: a receive goes on the ring of the thread that starts it, and
// its completion comes back to that thread. Code that runs elsewhere (a
// client's goroutine handing it to the loop, a checkout delivered after the
// loops stopped) has no ring: it posts the receive to the ready list for a
// loop thread to start (ringArm).
//
// The kernel holds a receive's socket and writes into its buffer until the
// receive completes, so neither is let go before: a client closed while a
// receive is in flight has its socket shut down, which completes the
// receive, and its descriptor closed by the completion; the operation's
// slot in loopThread.ops keeps the client and its buffers reachable until
// then.

// ringEntries sizes each thread's submission queue: a batch prepares at
// most one receive per event it handled.
const ringEntries = 256

// armKind says which receive an armItem asks a loop thread to start.
type armKind uint8

const (
	armClient armKind = iota // the client's next request
	armReply                 // the reply to the request out on the client's upstream connection
)

// Completion kinds, in the low byte of an operation's user data.
const (
	opStop uint64 = iota
	opWake
	opEvent
	opClient
	opUpstream
)

// errLoopStopped fails a request whose reply no loop thread can receive.
var errLoopStopped = errors.New("the event loop has stopped")

// loopThread is one io_uring loop thread's state, touched by that thread
// only: its ring, and the objects of the operations in flight on it by
// slot (the slot is the user data's upper bits), which keeps them and
// their buffers reachable while the kernel may write into them.
type loopThread struct {
	l       *loops
	ring    *uring.Ring
	ops     []any
	free    []uint32
	stopped bool
	stopBuf [1]byte
	wakeBuf [64]byte

	// The arm queue: receives other threads ask this one to start, for
	// clients whose home it is. qMu guards q; qN is its length, read
	// without the lock. busy is set from an Enter's return to the
	// thread's last look at q; evPending while a wake-up written to ev
	// (an eventfd) is not yet taken.
	qMu       sync.Mutex
	q         []armItem
	qN        atomic.Int32
	busy      atomic.Bool
	ev        int
	evPending atomic.Bool
	evBuf     [8]byte
	qRun      []armItem // q's items being run, reused
}

// armItem asks a loop thread to start a receive for c.
type armItem struct {
	c    *client
	kind armKind
}

// startRingLoops starts n loop threads, each with an io_uring.
func startRingLoops(n int) (*loops, error) {
	l, err := newLoops()
	if err != nil {
		return nil, err
	}
	l.ring = true
	started := make(chan error)
	for i := range max(n, 1) {
		ev, _, errno := syscall.Syscall(syscall.SYS_EVENTFD2, 0, syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0)
		if errno == 0 {
			th := &loopThread{l: l, ev: int(ev)}
			l.wg.Add(1)
			go l.runRing(th, i == 0, started)
			if err = <-started; err == nil {
				l.rings = append(l.rings, th)
				continue
			}
		} else {
			err = fmt.Errorf("eventfd: %w", errno)
		}
		// The threads started close their eventfds as they stop; stop
		// closes the pipes.
		l.stop()
		return nil, err
	}
	l.threads = len(l.rings)
	return l, nil
}

// home picks the thread a client entering the loop lives on, round-robin:
// its receives go on that thread's ring, so that each client's work stays
// on one thread and the clients are spread over all of them.
func (l *loops) home() *loopThread {
	return l.rings[int(l.next.Add(1)-1)%len(l.rings)]
}

// post asks th to start a receive for c. The protocol is the ready
// list's: th looks at q after clearing busy, and a poster that finds busy
// clear wakes it.
func (th *loopThread) post(c *client, kind armKind) {
	th.qMu.Lock()
	th.q = append(th.q, armItem{c: c, kind: kind})
	th.qN.Add(1)
	th.qMu.Unlock()
	if !th.busy.Load() && th.evPending.CompareAndSwap(false, true) {
		var one [8]byte
		binary.NativeEndian.PutUint64(one[:], 1)
		_, _ = syscall.Write(th.ev, one[:])
	}
}

// runArms starts the receives other threads asked for.
func (th *loopThread) runArms() {
	for th.qN.Load() > 0 {
		th.qMu.Lock()
		th.qRun, th.q = th.q, th.qRun[:0]
		th.qN.Store(0)
		th.qMu.Unlock()
		for i, it := range th.qRun {
			it.c.ringArm(th, it.kind)
			th.qRun[i] = armItem{}
		}
	}
}

// runRing is one io_uring loop thread. The first thread also takes the
// ready list's wake-ups.
func (l *loops) runRing(th *loopThread, first bool, started chan<- error) {
	defer l.wg.Done()
	runtime.LockOSThread() // the ring takes submissions from this thread only
	defer runtime.UnlockOSThread()
	r, err := uring.New(ringEntries)
	if err != nil {
		_ = syscall.Close(th.ev)
	}
	started <- err
	if err != nil {
		return
	}
	th.ring = r
	r.Read(l.stopR, th.stopBuf[:], opStop)
	r.Read(th.ev, th.evBuf[:], opEvent)
	if first {
		r.Read(l.wakeR, th.wakeBuf[:], opWake)
	}
	complete := th.complete
	for !th.stopped {
		if err := r.Enter(1); err != nil {
			break
		}
		l.running.Add(1)
		th.busy.Store(true)
		r.Completions(complete)
		th.runArms()
		// As in run: a result posted while running was set is ours; and
		// so is an arm posted while busy was set.
		for {
			l.running.Add(-1)
			th.busy.Store(false)
			if l.readyN.Load() == 0 && th.qN.Load() == 0 {
				break
			}
			l.running.Add(1)
			th.busy.Store(true)
			l.runReady(th)
			th.runArms()
		}
	}
	th.teardown()
}

// slot records obj as the object of an operation of kind and returns the
// operation's user data.
func (th *loopThread) slot(obj any, kind uint64) uint64 {
	var i uint32
	if n := len(th.free); n > 0 {
		i = th.free[n-1]
		th.free = th.free[:n-1]
		th.ops[i] = obj
	} else {
		i = uint32(len(th.ops))
		th.ops = append(th.ops, obj)
	}
	return uint64(i)<<8 | kind
}

// take ends the operation of user data ud and returns its object.
func (th *loopThread) take(ud uint64) any {
	i := uint32(ud >> 8)
	obj := th.ops[i]
	th.ops[i] = nil
	th.free = append(th.free, i)
	return obj
}

// complete handles one completion, then the ready list.
func (th *loopThread) complete(ud uint64, res int32) {
	l := th.l
	switch ud & 0xff {
	case opStop:
		th.stopped = true
		return
	case opWake:
		l.wakePending.Store(false)
		if res > 0 || res == -int32(syscall.EAGAIN) || res == -int32(syscall.EINTR) {
			th.ring.Read(l.wakeR, th.wakeBuf[:], opWake)
		}
	case opEvent:
		th.evPending.Store(false)
		th.ring.Read(th.ev, th.evBuf[:], opEvent)
	case opClient:
		th.take(ud).(*client).ringReceived(th, res)
	case opUpstream:
		th.take(ud).(*loopUp).ringReceived(th, res)
	}
	l.runReady(th)
}

// teardown releases the ring, which cancels the receives in flight, then
// closes the descriptors whose close waited for one of them.
func (th *loopThread) teardown() {
	th.ring.Close()
	_ = syscall.Close(th.ev)
	for i, obj := range th.ops {
		th.ops[i] = nil
		switch o := obj.(type) {
		case *client:
			lc := &o.lc
			lc.mu.Lock()
			lc.armed = false
			if lc.state == lsClosed && lc.fd >= 0 {
				_ = syscall.Close(lc.fd)
				lc.fd = -1
			}
			lc.mu.Unlock()
		case *loopUp:
			o.mu.Lock()
			o.armed = false
			if o.closed && o.fd >= 0 {
				_ = syscall.Close(o.fd)
				o.fd = -1
			}
			o.mu.Unlock()
		}
	}
}

// ringArm starts the receive a ready item asks for, on loop thread th.
func (c *client) ringArm(th *loopThread, kind armKind) {
	lc := &c.lc
	lc.mu.Lock()
	lc.th = th
	switch {
	case kind == armClient && lc.state == lsIdle && !lc.armed:
		c.loopServe()
	case kind == armReply && lc.state == lsUpstream && lc.up != nil:
		c.ringArmReply()
	}
	lc.th = nil
	lc.mu.Unlock()
}

// ringArmClient starts a receive into the free end of rbuf (compacted by
// loopServe). It holds lc.mu, state lsIdle.
func (c *client) ringArmClient() {
	lc := &c.lc
	if lc.armed {
		return
	}
	if c.rhi == len(c.rbuf) {
		// loopServe hands a message larger than rbuf to a goroutine
		// before this: unreachable, but never a zero-length receive.
		c.toGoroutine()
		return
	}
	th := lc.th
	if th != lc.home {
		// Off the client's home thread: ask it. A client waits on
		// its home thread's ring, which keeps the threads' shares even.
		lc.home.post(c, armClient)
		return
	}
	lc.armed = true
	th.ring.Recv(lc.fd, c.rbuf[c.rhi:], th.slot(c, opClient), true)
}

// ringReceived handles the completion of a receive into rbuf.
func (c *client) ringReceived(th *loopThread, res int32) {
	lc := &c.lc
	lc.mu.Lock()
	lc.armed = false
	switch {
	case lc.state != lsIdle:
		// Closed while the receive was in flight: loopForget left the
		// descriptor to this completion.
		if lc.state == lsClosed && lc.fd >= 0 {
			_ = syscall.Close(lc.fd)
			lc.fd = -1
		}
	case res <= 0: // end of stream, or an error
		c.loopClose()
	default:
		lc.th = th
		c.rhi += int(res)
		c.loopServe()
		lc.th = nil
	}
	lc.mu.Unlock()
}

// ringArmReply starts a receive of the reply into the free end of the
// reply buffer. It holds lc.mu, state lsUpstream.
func (c *client) ringArmReply() {
	lc := &c.lc
	lu := lc.up
	th := lc.th
	if th == nil {
		// Off the loop threads (a request sent as the client entered
		// the loop, or resumed after the loops stopped).
		if c.s.loopsPtr.Load() == nil {
			c.loopFail(lu.uc.IOError("read", errLoopStopped))
			return
		}
		lc.home.post(c, armReply)
		return
	}
	if lc.buf == nil {
		lc.buf = getBuffer(16 * 1024)
		lc.buf.b = lc.buf.b[:0]
	}
	b := lc.buf.b
	lu.mu.Lock()
	if lu.closed || lu.armed {
		lu.mu.Unlock()
		c.loopFail(lu.uc.IOError("read", net.ErrClosed))
		return
	}
	lu.armed = true
	th.ring.Recv(lu.fd, b[len(b):cap(b)], th.slot(lu, opUpstream), true)
	lu.mu.Unlock()
}

// ringReceived handles the completion of a receive of a reply.
func (lu *loopUp) ringReceived(th *loopThread, res int32) {
	lu.mu.Lock()
	lu.armed = false
	closed := lu.closed
	if closed && lu.fd >= 0 {
		_ = syscall.Close(lu.fd)
		lu.fd = -1
	}
	lu.mu.Unlock()
	c := lu.owner.Load()
	if c == nil {
		return
	}
	lc := &c.lc
	lc.mu.Lock()
	if lc.state == lsUpstream && lc.up == lu {
		lc.th = th
		switch {
		case closed:
			c.loopFail(lu.uc.IOError("read", net.ErrClosed))
		case res == 0:
			c.loopFail(lu.uc.IOError("read", io.EOF))
		case res < 0:
			c.loopFail(lu.uc.IOError("read", syscall.Errno(-res)))
		default:
			c.ringReply(int(res))
		}
		lc.th = nil
	}
	lc.mu.Unlock()
}

// ringReply takes n more bytes of the reply and relays it once it is
// whole, or receives the rest. It holds lc.mu, state lsUpstream.
func (c *client) ringReply(n int) {
	lc := &c.lc
	lu := lc.up
	b := lc.buf.b
	b = b[:len(b)+n]
	if len(b) >= 4 {
		need := int(int32(binary.LittleEndian.Uint32(b)))
		if err := replyLengthError(need, lu.uc.MaxMessageSize()); err != nil {
			lc.buf.b = b[:0]
			c.loopFail(lu.uc.IOError("read", err))
			return
		}
		if len(b) >= need {
			c.loopReplied(b, need)
			return
		}
		if cap(b) < need {
			// Grown to the declared length only, which is bounded above.
			nb := make([]byte, len(b), need)
			copy(nb, b)
			b = nb
		}
	}
	lc.buf.b = b
	c.ringArmReply()
}

// ringClosed is UpstreamClosed with io_uring: a receive in flight ends
// with the socket shut down, and its completion fails the request and
// closes the descriptor; otherwise the descriptor is closed now, and a
// request about to receive on it fails in ringArmReply.
func (lu *loopUp) ringClosed() {
	lu.mu.Lock()
	defer lu.mu.Unlock()
	lu.closed = true
	if lu.fd < 0 {
		return
	}
	if lu.armed {
		_ = syscall.Shutdown(lu.fd, syscall.SHUT_RDWR)
		return
	}
	_ = syscall.Close(lu.fd)
	lu.fd = -1
}
