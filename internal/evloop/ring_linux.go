package evloop

// The io_uring driver of the event loop. It makes no read system call and
// no epoll_wait: every socket the loop waits on has a receive in flight on
// a loop thread's ring (an endpoint's into its window while it is idle, an
// upstream connection's into the reply buffer while a request is out on
// it), and a thread submits the receives it prepared and collects the
// completions of its ring in one io_uring_enter per batch. A request sent
// on a loop thread goes on the ring too, as a send linked to the receive
// of its reply: the kernel starts the receive once the whole request is
// sent, or cancels it when the send fails; one completion (the receive's,
// or the failed send's) ends the wait. That spares a write call per
// request, and the preemption that often follows it when the write wakes
// the upstream: the thread sends and sleeps in one io_uring_enter. A reply
// goes to its client the same way, linked to the receive of the client's
// next request, when it fits the client's window and the client has nothing
// else to serve (sendReply): the common request-reply round costs the
// thread no write call at all. Larger replies, replies to pipelining
// clients and requests sent off the loop threads stay plain non-blocking
// write calls, so everything that follows such a write (a partial write
// handed to a goroutine) is as with epoll.
//
// A ring takes submissions from the thread that made it only, so each loop
// thread is locked to its OS thread. A client's receives go on the ring of
// its home thread (assigned round-robin as it first enters the loop); a
// reply's receive goes on the ring of the thread that sent the request.
// Code that runs elsewhere (off the loop threads, or on another thread for
// a client's next request) posts the receive to the home thread's arm
// queue, unless the client moves: each thread measures its utilisation,
// and clients are packed onto the threads that have headroom, so that a
// light load keeps one thread busy rather than two waking each other, and
// spread again when a thread nears saturation (loop_place_linux.go).
//
// The kernel holds a receive's socket and writes into its buffer until the
// receive completes, so neither is let go before: a client closed while a
// receive is in flight has its socket shut down, which completes the
// receive, and its descriptor closed by the completion; the operation's
// slot in ringThread.ops keeps the client and its buffers reachable until
// then; when the server closes, the replies still in the socket are let
// out first (loop_ringclose_linux.go). Upstream connections are received
// on a duplicate descriptor of the driver's own, so that the pool's Close
// cannot hand the number to another socket while a receive on it waits to
// be submitted.

import (
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/sysconn"
	"github.com/mongobouncer/mongobouncer/internal/uring"
)

// ringEntries sizes each thread's submission queue: a batch prepares at
// most one receive per event it handled.
const ringEntries = 256

// armKind says which receive an armItem asks a loop thread to start.
type armKind uint8

const (
	armClient armKind = iota // the client's next request
	armReply                 // the reply to the request out on the client's upstream connection
	armClose                 // shut the closed client's socket down, ending its receive in flight
)

// Completion kinds, in the low byte of an operation's user data.
const (
	opStop uint64 = iota
	opWake
	opEvent
	opClient
	opUpstream
	opSend  // a request's failed send, whose linked receive of the reply was cancelled (uring.Ring.SendThenRecv)
	opReply // a reply's failed send, whose linked receive of the client's next request was cancelled
)

// RingSupported reports whether the kernel allows io_uring here.
func RingSupported() bool { return uring.Supported() }

// ringDriver is the loop on io_uring.
type ringDriver struct {
	l       *Loop
	threads []*ringThread
	// spinMax is Options.LoopSpin (loop_spin_linux.go); spins are the
	// server's counts of the threads' spins.
	spinMax time.Duration
	spins   *SpinCounts
	// lingering counts closed clients whose descriptor waits for a
	// receive in flight, maybe behind a reply's send
	// (loop_ringclose_linux.go).
	lingering atomic.Int64
	// all is closed once threads is complete (or the start failed): the
	// threads read it from then on (placement looks at each other).
	all chan struct{}
}

// ringThread is one io_uring loop thread's state, touched by that thread
// only: its ring, and the objects of the operations in flight on it by
// slot (the slot is the user data's upper bits), which keeps them and
// their buffers reachable while the kernel may write into them.
type ringThread struct {
	d       *ringDriver
	ring    *uring.Ring
	ops     []any
	free    []uint32
	stopped bool
	stopBuf [1]byte
	wakeBuf [64]byte

	// The arm queue: receives other threads ask this one to start, for
	// clients whose home it is. qMu guards q and qShut, set once teardown
	// closes ev; qN is q's length, read without the lock. busy is set from
	// an Enter's return to the thread's last look at q; evPending while a
	// wake-up written to ev (an eventfd) is not yet taken.
	qMu       sync.Mutex
	q         []armItem
	qShut     bool
	qN        atomic.Int32
	busy      atomic.Bool
	ev        int
	evPending atomic.Bool
	evBuf     [8]byte
	qRun      []armItem // q's items being run, reused

	// load is the thread's utilisation and client count, for placing
	// clients (loop_place_linux.go).
	load threadLoad
	// spin is what the thread knows of its replies, to wait for a lone
	// one awake (loop_spin_linux.go).
	spin spinState
}

func (*ringThread) loopThread() {}

// armItem asks a loop thread to start a receive on rc (or, armClose, to
// end one).
type armItem struct {
	rc   *ringClient
	kind armKind
}

// ringClient is an endpoint socket's registration, guarded by the
// endpoint's Mu. armed is set while a receive into its window is in
// flight, which happens only while Idle; closed is set by closeClient,
// and an endpoint closed meanwhile keeps its descriptor until that receive
// completes. home is the thread its receives go on, which placeRecv may
// change; left is set once the endpoint no longer counts among its home's
// clients. placed is a placement sendReply made but could not use, for
// recvRequest to follow rather than decide again. lingering is set while
// the closed endpoint's descriptor waits for that receive; flush says its
// replies are let out (ringclose_linux.go).
type ringClient struct {
	ep        *Endpoint
	fdn       int
	closed    bool
	home      *ringThread
	placed    *ringThread
	armed     bool
	left      bool
	lingering bool
	flush     bool
}

func (r *ringClient) fd() int  { return r.fdn }
func (r *ringClient) entered() {}

// ringUp is an upstream connection's registration: a duplicate descriptor
// the driver receives (and sends requests) on. mu guards fd, armed (a
// receive, or a send and its linked receive, is in flight), closed (the
// pool closed the connection: fd is shut down, and closed once nothing is
// in flight) and sendErr (why a request's send failed).
type ringUp struct {
	u  *Upstream
	mu sync.Mutex
	// reply is the buffer a receive in flight fills: held here so that
	// the operation's slot keeps it reachable.
	reply   []byte
	sentAt  time.Duration // when the request awaiting its reply was sent (monoNow), 0 once its reply began
	fdn     int
	armed   bool
	closed  bool
	sendErr error
}

// startRing starts n loop threads, each with an io_uring, and with adapt
// as many epoll threads beside them, for a light load (adapt_linux.go).
func startRing(n int, spinMax time.Duration, spins *SpinCounts, log *slog.Logger, adapt bool) (*Loop, error) {
	if spins == nil {
		spins = new(SpinCounts)
	}
	l, err := newLoop(IOUring, log)
	if err != nil {
		return nil, err
	}
	d := &ringDriver{l: l, all: make(chan struct{}), spinMax: spinMax, spins: spins}
	l.drv = d
	started := make(chan error)
	for i := range max(n, 1) {
		ev, _, errno := syscall.Syscall(syscall.SYS_EVENTFD2, 0, syscall.O_CLOEXEC|syscall.O_NONBLOCK, 0)
		if errno == 0 {
			th := &ringThread{d: d, ev: int(ev)}
			l.wg.Add(1)
			go d.run(th, i == 0, started)
			if err = <-started; err == nil {
				d.threads = append(d.threads, th)
				continue
			}
		} else {
			err = fmt.Errorf("eventfd: %w", errno)
		}
		// The threads started close their eventfds as they stop. No
		// Post can reach a loop that was never returned.
		close(d.all)
		l.stop()
		l.closePipes()
		return nil, err
	}
	l.threads = len(d.threads)
	close(d.all)
	if adapt {
		lite, err := newEpollDriver(l, n, false)
		if err != nil {
			l.stop()
			l.closePipes()
			return nil, err
		}
		lite.lazy = true
		l.adapt = &adapter{lite: lite, heavy: d}
		l.adapt.start.Store(int64(monoNow()))
		l.io = IOAdaptive
		lite.start()
	}
	return l, nil
}

// home picks the thread a client entering the loop lives on, round-robin:
// its receives go on that thread's ring, so that each client's work stays
// on one thread and the clients are spread over all of them.
func (d *ringDriver) home() *ringThread {
	return d.threads[int(d.l.next.Add(1)-1)%len(d.threads)]
}

// post asks th to start a receive for ep. The protocol is the ready
// list's: th looks at q after clearing busy, and a poster that finds busy
// clear wakes it.
//
// The wake-up is written under qMu with qShut unset: threads stop one by
// one, and another thread, an epoll thread or the sweeper may post to one
// that closed ev, whose number may be another connection's socket by then.
// Such a post has nothing to do: teardown closes a closed client's socket.
func (th *ringThread) post(rc *ringClient, kind armKind) {
	th.qMu.Lock()
	defer th.qMu.Unlock()
	if th.qShut {
		return
	}
	th.q = append(th.q, armItem{rc: rc, kind: kind})
	th.qN.Add(1)
	if !th.busy.Load() && th.evPending.CompareAndSwap(false, true) {
		var one [8]byte
		binary.NativeEndian.PutUint64(one[:], 1)
		_, _ = syscall.Write(th.ev, one[:])
	}
}

// runArms starts the receives other threads asked for.
func (th *ringThread) runArms() {
	for th.qN.Load() > 0 {
		th.qMu.Lock()
		th.qRun, th.q = th.q, th.qRun[:0]
		th.qN.Store(0)
		th.qMu.Unlock()
		for i, it := range th.qRun {
			th.arm(it)
			th.qRun[i] = armItem{}
		}
	}
}

// arm starts the receive an arm item asks for, if it is still wanted.
func (th *ringThread) arm(it armItem) {
	rc := it.rc
	ep := rc.ep
	ep.Mu.Lock()
	defer ep.Mu.Unlock()
	defer ep.h.Recover()
	switch it.kind {
	case armClient:
		if !rc.closed && !rc.armed {
			ep.ready(th.d, th)
		}
	case armReply:
		if !rc.closed && ep.wanted(th.d, ep.lp.up) {
			th.d.recvReply(th, ep)
		}
	case armClose:
		if rc.armed && rc.fdn >= 0 {
			// A reply prepared on this ring (sendReply) is submitted
			// first: the shutdown is for the receive after it.
			_ = th.ring.Enter(0)
			th.d.shutClosed(rc)
		}
	}
}

// run is one io_uring loop thread. The first thread also takes the ready
// list's wake-ups.
func (d *ringDriver) run(th *ringThread, first bool, started chan<- error) {
	l := d.l
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
	<-d.all
	for !th.stopped {
		if !th.spinWait() {
			if err := r.Enter(1); err != nil && !enterGoesOn(l, err) {
				break
			}
		}
		th.tick()
		l.running.Add(1)
		th.busy.Store(true)
		r.Completions(complete)
		th.runArms()
		// As with the ready list (loops.settle): a result posted while
		// running was counted is this thread's to run, and so is an arm
		// posted while busy was set.
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

// enterGoesOn reports whether a thread whose wait failed with err goes on:
// a completion queue the kernel could not flush at once (EAGAIN, EBUSY)
// is taken as the thread goes on, and completions the kernel had to drop
// (EBADR) leave their clients waiting until their idle timeout, but the
// thread's other clients served. Any other error means the ring is
// unusable, and the thread's clients are no longer served: said loudly.
func enterGoesOn(l *Loop, err error) bool {
	switch err {
	case syscall.EAGAIN, syscall.EBUSY:
		return true
	case syscall.EBADR:
		l.log.Error("io_uring dropped completions: some clients wait until client_idle_timeout", "error", err)
		return true
	}
	l.log.Error("event loop thread stopped: its endpoints are no longer served", "io", "io_uring", "error", err)
	return false
}

// slot records obj as the object of an operation of kind and returns the
// operation's user data.
func (th *ringThread) slot(obj any, kind uint64) uint64 {
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
func (th *ringThread) take(ud uint64) any {
	i := uint32(ud >> 8)
	obj := th.ops[i]
	th.ops[i] = nil
	th.free = append(th.free, i)
	return obj
}

// complete handles one completion, then the ready list.
func (th *ringThread) complete(ud uint64, res int32) {
	l := th.d.l
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
		th.clientDone(th.take(ud).(*ringClient), res)
	case opUpstream:
		th.replyDone(th.take(ud).(*ringUp), res)
	case opSend:
		th.sendFailed(th.take(ud).(*ringUp), res)
	case opReply:
		// A failed or short send of a reply: the client's stream is cut,
		// and the receive linked to it was cancelled.
		if res >= 0 {
			res = -int32(syscall.EPIPE)
		}
		th.clientDone(th.take(ud).(*ringClient), res)
	}
	l.runReady(th)
}

// disarm marks an endpoint's receive, which the ring's release cancelled,
// no longer in flight, under Mu; a closed endpoint's descriptor, whose
// close waited for it, is closed.
func (th *ringThread) disarm(rc *ringClient) {
	ep := rc.ep
	ep.Mu.Lock()
	defer ep.Mu.Unlock()
	rc.armed = false
	if rc.closed {
		th.d.closeLingering(rc)
	}
}

// teardown releases the ring, which cancels the receives in flight, then
// closes the descriptors whose close waited for one of them.
func (th *ringThread) teardown() {
	// Replies prepared since the last Enter go out before the ring, and
	// the receives linked to them, are dropped.
	_ = th.ring.Enter(0)
	th.ring.Close()
	th.qMu.Lock()
	th.qShut = true // no post writes ev from now on (post)
	th.qMu.Unlock()
	_ = syscall.Close(th.ev)
	for i, obj := range th.ops {
		th.ops[i] = nil
		switch o := obj.(type) {
		case *ringClient:
			th.disarm(o)
		case *ringUp:
			o.mu.Lock()
			o.armed = false
			if o.closed && o.fdn >= 0 {
				_ = syscall.Close(o.fdn)
				o.fdn = -1
			}
			o.mu.Unlock()
		}
	}
}

// clientDone handles the completion of a receive into an endpoint's
// window.
func (th *ringThread) clientDone(rc *ringClient, res int32) {
	ep := rc.ep
	ep.Mu.Lock()
	defer ep.Mu.Unlock()
	defer ep.h.Recover()
	rc.armed = false
	switch {
	case rc.closed:
		// Closed while the receive was in flight: closeClient left the
		// descriptor to this completion.
		th.d.closeLingering(rc)
	case res < 0:
		ep.received(th.d, th, 0, syscall.Errno(-res))
	default:
		ep.received(th.d, th, int(res), nil)
	}
}

// sendFailed handles the completion of a request's send, which only a
// failed or short send has: the receive of the reply it was linked to is
// cancelled without a completion (its slot is the one named), so this
// one ends the wait, failing the request.
func (th *ringThread) sendFailed(ru *ringUp, res int32) {
	ru.mu.Lock()
	if res < 0 {
		ru.sendErr = syscall.Errno(-res)
	} else {
		ru.sendErr = io.ErrShortWrite
	}
	ru.mu.Unlock()
	th.replyDone(ru, res)
}

// replyDone handles the completion of a receive of a reply.
func (th *ringThread) replyDone(ru *ringUp, res int32) {
	th.spin.out--
	ru.mu.Lock()
	th.spin.replied(ru.sentAt, th.load.now)
	ru.sentAt = 0
	ru.armed = false
	closed := ru.closed
	sendErr := ru.sendErr
	ru.sendErr = nil
	ru.reply = nil
	if closed && ru.fdn >= 0 {
		_ = syscall.Close(ru.fdn)
		ru.fdn = -1
	}
	ru.mu.Unlock()
	ep := ru.u.owner.Load()
	if ep == nil {
		return
	}
	ep.Mu.Lock()
	defer ep.Mu.Unlock()
	defer ep.h.Recover()
	switch {
	case sendErr != nil:
		ep.replied(th.d, th, ru.u, 0, "write", sendErr)
	case closed:
		ep.replied(th.d, th, ru.u, 0, "read", net.ErrClosed)
	case res < 0:
		ep.replied(th.d, th, ru.u, 0, "read", syscall.Errno(-res))
	default:
		ep.replied(th.d, th, ru.u, int(res), "read", nil)
	}
}

func (d *ringDriver) attachClient(ep *Endpoint, fd int) (registration, error) {
	h := d.home()
	h.load.clients.Add(1)
	return &ringClient{ep: ep, fdn: fd, home: h}, nil
}

func (d *ringDriver) attachUpstream(u *Upstream, fd int) error {
	dup, err := sysconn.DupFd(fd)
	if err != nil {
		return err
	}
	u.ring = &ringUp{u: u, fdn: dup}
	return nil
}

// recvRequest starts a receive into the free end of the window (compacted
// by Endpoint.RecvRequest) on the endpoint's home thread, which placeRecv
// may change.
func (d *ringDriver) recvRequest(th Thread, ep *Endpoint) {
	rc := ep.reg.(*ringClient)
	if rc.armed {
		return
	}
	t, _ := th.(*ringThread)
	if t == nil {
		// Off the loop threads: ask the home thread.
		rc.home.post(rc, armClient)
		return
	}
	to := rc.placed
	rc.placed = nil
	if to != rc.home || to == t {
		to = d.placeRecv(t, rc)
	}
	if to != t {
		to.post(rc, armClient)
		return
	}
	rc.armed = true
	t.ring.Recv(rc.fdn, ep.Win.Free(), t.slot(rc, opClient), true)
}

// recvReply starts a receive of the reply into the reply buffer, on the
// calling thread's ring.
func (d *ringDriver) recvReply(th Thread, ep *Endpoint) {
	u := ep.lp.up
	t, _ := th.(*ringThread)
	if t == nil {
		// Off the loop threads (a request sent as the endpoint entered
		// the loop): the home thread receives.
		rc := ep.reg.(*ringClient)
		rc.home.post(rc, armReply)
		return
	}
	ru := u.ring
	ru.mu.Lock()
	if ru.closed || ru.armed {
		ru.mu.Unlock()
		ep.h.Failed(th, "read", net.ErrClosed)
		return
	}
	ru.armed = true
	ru.reply = ep.lp.reply
	t.spin.out++
	t.ring.Recv(ru.fdn, ru.reply, t.slot(ru, opUpstream), true)
	ru.mu.Unlock()
}

// sendRequest prepares, on th's ring, the send of the request req linked
// to the receive of its reply into the reply buffer. req stays untouched
// while the endpoint waits for the reply (Endpoint.SendRequest), and the
// reply's receive, which ends that wait, completes only after the send.
func (d *ringDriver) sendRequest(th Thread, ep *Endpoint, req []byte) bool {
	t, _ := th.(*ringThread)
	if t == nil {
		return false
	}
	u := ep.lp.up
	ru := u.ring
	ru.mu.Lock()
	if ru.closed || ru.armed {
		ru.mu.Unlock()
		ep.h.Failed(th, "write", net.ErrClosed)
		return true
	}
	ru.armed = true
	ru.sendErr = nil
	ru.sentAt = monoNow()
	ru.reply = ep.lp.reply
	t.spin.out++
	recv := t.slot(ru, opUpstream)
	t.ring.SendThenRecv(ru.fdn, req, recv&^0xff|opSend, ru.reply, recv)
	ru.mu.Unlock()
	return true
}

// sendReply prepares, on th's ring, the send of the reply msg linked to the
// receive of the endpoint's next request. msg is copied to the front of
// the (empty) window, which the receive fills only once the send is whole;
// a failed or short send cancels the receive, and its own completion ends
// the endpoint's stream. So the reply costs no write call and no
// completion, and the endpoint no memory beyond its window while it
// idles. A send the socket cannot take at once waits in the kernel, not on
// the thread. Only for a reply that fits the window, whose next receive
// stays on this thread; the user decides the rest (not once its server
// drains: a reply sent so is not known to have left, and a reply sent
// just before a close with flush is waited for by awaitSends). An
// endpoint closed before the thread's next Enter has submitted the send
// does not have it cut short: closeClient leaves the shutdown to this
// thread.
func (d *ringDriver) sendReply(th Thread, ep *Endpoint, msg []byte) bool {
	t, _ := th.(*ringThread)
	rc := ep.reg.(*ringClient)
	if t == nil || len(msg) > len(ep.Win.Buf) || rc.armed || rc.fdn < 0 {
		return false
	}
	if to := d.placeRecv(t, rc); to != t {
		rc.placed = to
		return false
	}
	ep.Win.Reset()
	n := copy(ep.Win.Buf[:], msg)
	rc.armed = true
	recv := t.slot(rc, opClient)
	t.ring.SendThenRecv(rc.fdn, ep.Win.Buf[:n], recv&^0xff|opReply, ep.Win.Buf[:], recv)
	return true
}

// upstreamClosed: a receive in flight ends with the socket shut down, and
// its completion fails the request and closes the descriptor; otherwise
// the descriptor is closed now, and a request about to receive on it
// fails in recvReply.
func (d *ringDriver) upstreamClosed(u *Upstream) {
	ru := u.ring
	ru.mu.Lock()
	defer ru.mu.Unlock()
	ru.closed = true
	if ru.fdn < 0 {
		return
	}
	if ru.armed {
		_ = syscall.Shutdown(ru.fdn, syscall.SHUT_RDWR)
		return
	}
	_ = syscall.Close(ru.fdn)
	ru.fdn = -1
}

// stop has nothing left to release: each thread tore its ring down.
func (d *ringDriver) stop() {}
