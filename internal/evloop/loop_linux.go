package evloop

// The engine's core: the Loop (its threads, of one driver), the ready list
// of results posted by other goroutines, and the driver interface behind
// which epoll (epoll_linux.go) and io_uring (ring_linux.go) do the
// waiting. What the engine does with one endpoint is in endpoint_linux.go.
//
// A result posted while no loop thread is running wakes one through a
// pipe; loop threads run the ready list after each event, so a result
// posted by a loop thread (a connection checked in there, handed to the
// next waiting request) runs on that same thread without a wake-up.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// IO names an I/O model of the loop.
const (
	IOEpoll = "epoll"
	IOUring = "io_uring"
	// IOAdaptive is both: epoll at a light load, io_uring under load
	// (adapt_linux.go).
	IOAdaptive = "epoll+io_uring"
)

// ErrStopped fails a receive no loop thread will complete: the loop has
// stopped.
var ErrStopped = errors.New("the event loop has stopped")

// driver is one I/O model of the loop. The engine's core calls it to
// register sockets and to wait for bytes; it calls the core back
// (Endpoint.received, Endpoint.replied, Endpoint.ready) holding the
// endpoint's Mu. Plain writes are no driver's: they are the same write
// call on every model (Endpoint.Write, rawIO.writeVia).
type driver interface {
	// attachClient registers an endpoint's socket, a descriptor the loop
	// owns from now on.
	attachClient(ep *Endpoint, fd int) (registration, error)
	// attachUpstream registers an upstream connection's socket at the
	// loop's first use of it, in u's field of the driver's.
	attachUpstream(u *Upstream, fd int) error
	// detachClient hands the endpoint's descriptor over to another
	// driver (adapt_linux.go), or reports false, having done nothing,
	// when it cannot now. State Idle.
	detachClient(ep *Endpoint) (int, bool)
	// recvRequest waits for more of the endpoint's next request, into
	// ep.Win.Free(), which has room. State Idle.
	recvRequest(th Thread, ep *Endpoint)
	// recvReply waits for more of the reply on the endpoint's upstream,
	// into ep.lp.reply. State AwaitReply.
	recvReply(th Thread, ep *Endpoint)
	// closeClient releases the endpoint's socket: at once, or when a
	// receive in flight on it has ended. flush says the replies still in
	// the socket are to be let out (the server is closing).
	closeClient(ep *Endpoint, flush bool)
	// upstreamClosed hears that u's connection was closed by its owner:
	// a request waiting for its reply must fail.
	upstreamClosed(u *Upstream)
	// awaitSends waits, bounded by ctx, for the sends to endpoints closed
	// with flush that are still in flight.
	awaitSends(ctx context.Context) error
	// stop releases the driver's resources once its threads have ended.
	stop()
}

// fusedDriver is the optional side of a driver that sends and receives in
// one submission (io_uring), found by type assertion as net/http finds an
// alternate transport. Each returns false, having done nothing, when it
// cannot on thread th.
type fusedDriver interface {
	// sendRequest sends req on the endpoint's upstream and waits for the
	// reply, as rawIO.writeVia then recvReply would. State AwaitReply.
	sendRequest(th Thread, ep *Endpoint, req []byte) bool
	// sendReply sends msg to the endpoint and waits for its next request,
	// as Endpoint.Write then recvRequest would. State AwaitReply, the
	// window empty.
	sendReply(th Thread, ep *Endpoint, msg []byte) bool
}

// registration is a driver's hold on an endpoint's socket.
type registration interface {
	// fd is the loop's descriptor of the socket, -1 once closed.
	fd() int
	// entered says the endpoint was handed to the loop: its socket may
	// hold bytes whose readiness has passed.
	entered()
}

// loopPart is an endpoint's state on the loop, guarded by its Mu.
type loopPart struct {
	l *Loop
	// drv is the driver that serves the endpoint: the loop's, or on a
	// loop of both, the one the adapter chose (adapt_linux.go); sentAt
	// is when the request out was sent, for the adapter's load.
	drv    driver
	sentAt time.Duration
	// up is the upstream the request is out on (AwaitReply); reply is
	// the free end of the user's reply buffer that the receive fills.
	up    *Upstream
	reply []byte
}

// Options configure Start.
type Options struct {
	// IO is IOEpoll, IOUring or IOAdaptive; "" is IOAdaptive where the
	// kernel allows io_uring, else epoll, with a warning.
	IO string
	// Threads is the number of loop threads (at least 1).
	Threads int
	// Spin is how long an io_uring thread waits awake for a lone fast
	// reply (spin_linux.go); Spins counts those waits.
	Spin  time.Duration
	Spins *SpinCounts
	// Log hears of a thread that cannot go on.
	Log *slog.Logger
}

// Loop is the event loop: threads of one driver, or of both (IOAdaptive),
// and the ready list.
type Loop struct {
	drv driver
	// adapt, on a loop of both drivers, chooses between them; drv is
	// then io_uring's (adapt_linux.go).
	adapt   *adapter
	io      string
	log     *slog.Logger // for a thread that cannot go on
	threads int
	// stopped is set as Stop begins: from then on receives fail with
	// ErrStopped instead of waiting for a thread that will not come.
	stopped atomic.Bool
	// stopR and stopW are a pipe whose closed write end stops the threads.
	stopR, stopW int
	// wakeR and wakeW are a pipe that wakes a thread for the ready list;
	// wakePending is set while a wake-up is written and not yet taken.
	wakeR, wakeW int
	wakePending  atomic.Bool
	// running counts threads between a wait's return and their last look
	// at the ready list.
	running atomic.Int32
	// next spreads new descriptors over the threads, round-robin.
	next atomic.Uint32

	// readyMu guards ready and head: posted results to run, from head on;
	// and readyShut, set once Stop took the last of them. Post also
	// writes the wake-up pipe under it, and Stop closes the pipe only once
	// readyShut is set (see Stop). readyN, their number, lets threads skip
	// the lock when there is none.
	readyMu   sync.Mutex
	ready     []readyItem
	head      int
	readyShut bool
	readyN    atomic.Int32
	// done is closed by Stop, for the helpers that run beside the threads.
	done chan struct{}
	wg   sync.WaitGroup // the threads and the helpers
}

// readyItem is a posted result, for endpoint ep.
type readyItem struct {
	ep  *Endpoint
	v   any
	err error
}

// Start starts a loop of o.Threads threads on the I/O model o.IO.
func Start(o Options) (*Loop, error) {
	n := max(o.Threads, 1)
	switch o.IO {
	case IOUring:
		return startRing(n, o.Spin, o.Spins, o.Log, false)
	case IOEpoll:
		return startEpoll(n, o.Log)
	case IOAdaptive:
		return startRing(n, o.Spin, o.Spins, o.Log, true)
	}
	if RingSupported() {
		l, err := startRing(n, o.Spin, o.Spins, o.Log, true)
		if err == nil {
			return l, nil
		}
		o.Log.Warn("io_uring unavailable; the event loop uses epoll", "error", err)
	}
	return startEpoll(n, o.Log)
}

// newLoop makes the loop's stop and wake pipes.
func newLoop(io string, log *slog.Logger) (*Loop, error) {
	var p, w [2]int
	if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC|syscall.O_NONBLOCK); err != nil {
		return nil, fmt.Errorf("pipe2: %w", err)
	}
	if err := syscall.Pipe2(w[:], syscall.O_CLOEXEC|syscall.O_NONBLOCK); err != nil {
		closeFds(p[0], p[1])
		return nil, fmt.Errorf("pipe2: %w", err)
	}
	return &Loop{io: io, log: log, stopR: p[0], stopW: p[1], wakeR: w[0], wakeW: w[1], done: make(chan struct{})}, nil
}

// IO names the I/O model the loop runs on: IOEpoll, IOUring or IOAdaptive.
func (l *Loop) IO() string { return l.io }

// Threads is the number of loop threads.
func (l *Loop) Threads() int { return l.threads }

// Go runs f beside the threads until Stop, which closes done and waits
// for f to return.
func (l *Loop) Go(f func(done <-chan struct{})) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		f(l.done)
	}()
}

// AwaitSends waits, bounded by ctx, for the replies still being sent to
// endpoints closed with flush (Endpoint.Close): stopping the loop would
// cut them short.
func (l *Loop) AwaitSends(ctx context.Context) error { return l.drv.awaitSends(ctx) }

// ringDrv and epollDrv are the loop's drivers of each kind (nil when it
// has none).
func (l *Loop) ringDrv() *ringDriver {
	d, _ := l.drv.(*ringDriver)
	return d
}

func (l *Loop) epollDrv() *epollDriver {
	if l.adapt != nil {
		return l.adapt.lite
	}
	d, _ := l.drv.(*epollDriver)
	return d
}

// Stop ends the loop threads and waits for them and the helpers (Go).
// Results posted too late for a thread are resumed here, off the loop
// (th nil); later ones are the poster's (Post returns false).
//
// The wake-up pipe is closed only after readyShut is set, and Post writes
// it only under readyMu with readyShut unset: a Post racing Stop must never
// write to the pipe's descriptor number once it is closed, since the number
// may by then be another connection's socket (a byte written there would
// corrupt that connection's stream).
func (l *Loop) Stop() {
	l.stopped.Store(true)
	l.stop()
	l.readyMu.Lock()
	late := l.ready[l.head:]
	l.ready, l.head, l.readyShut = nil, 0, true
	l.readyN.Store(0)
	l.readyMu.Unlock()
	l.closePipes()
	if testHookPipesClosed != nil {
		testHookPipesClosed()
	}
	for _, it := range late {
		it.ep.Resume(nil, it.v, it.err)
	}
}

// testHookPipesClosed, when set, runs as Stop has closed the pipes (tests).
var testHookPipesClosed func()

// Stopped reports whether Stop has begun.
func (l *Loop) Stopped() bool { return l.stopped.Load() }

// stop ends the threads and releases the driver; Stop closes the other
// pipe ends once no Post can write to them.
func (l *Loop) stop() {
	close(l.done)
	_ = syscall.Close(l.stopW)
	l.wg.Wait()
	l.drv.stop()
	if l.adapt != nil {
		l.adapt.lite.stop()
	}
}

// closePipes closes what stop leaves of the pipes (its read ends and the
// wake-up pipe), once no Post can write them: after readyShut, or on a
// loop that was never returned.
func (l *Loop) closePipes() { closeFds(l.stopR, l.wakeR, l.wakeW) }

func closeFds(fds ...int) {
	for _, fd := range fds {
		_ = syscall.Close(fd)
	}
}

// Post queues a result for ep (v and err, handed to its Handler.Resumed
// on a loop thread). It only takes readyMu and, when no thread is running,
// writes the wake-up pipe, so it may run under its caller's locks (a
// pool's CheckOutFunc callback). It reports false, having queued nothing,
// once the loop has stopped: the caller resumes ep itself, off the loop.
func (l *Loop) Post(ep *Endpoint, v any, err error) bool {
	l.readyMu.Lock()
	defer l.readyMu.Unlock()
	if l.readyShut {
		return false
	}
	l.ready = append(l.ready, readyItem{ep: ep, v: v, err: err})
	l.readyN.Add(1)
	if l.running.Load() == 0 && l.wakePending.CompareAndSwap(false, true) {
		// Under readyMu, so that Stop cannot close the pipe meanwhile
		// (see Stop). The pipe is non-blocking and holds one byte at a
		// time (wakePending), so the write never waits.
		one := [1]byte{1}
		_, _ = syscall.Write(l.wakeW, one[:])
	}
	return true
}

// runReady resumes the posted results, oldest first, on loop thread th.
func (l *Loop) runReady(th Thread) {
	for l.readyN.Load() > 0 {
		l.readyMu.Lock()
		if l.head == len(l.ready) {
			l.readyMu.Unlock()
			return
		}
		it := l.ready[l.head]
		l.ready[l.head] = readyItem{}
		if l.head++; l.head == len(l.ready) {
			l.ready, l.head = l.ready[:0], 0
		}
		l.readyN.Add(-1)
		l.readyMu.Unlock()
		it.ep.Resume(th, it.v, it.err)
	}
}

// settle ends a thread's round of work: a result posted while running was
// counted is this thread's to run, so it looks again after leaving the
// count (Post looks at running after adding to the list).
func (l *Loop) settle(th Thread) {
	for {
		l.running.Add(-1)
		if l.readyN.Load() == 0 {
			return
		}
		l.running.Add(1)
		l.runReady(th)
	}
}

// rawIO does one non-blocking read or write through a syscall.RawConn
// without allocating: the callbacks are made once. The RawConn keeps a
// concurrent Close from handing the descriptor's number to another socket
// under the call.
type rawIO struct {
	b      []byte
	n      int
	err    error
	rd, wr func(uintptr) bool
}

func (r *rawIO) doRead(fd uintptr) bool {
	r.n, r.err = sysRead(int(fd), r.b)
	return true
}

func (r *rawIO) doWrite(fd uintptr) bool {
	r.n, r.err = sysWrite(int(fd), r.b)
	return true
}

// readVia reads once from rc, retrying only on EINTR.
func (r *rawIO) readVia(rc syscall.RawConn, b []byte) (int, error) { return r.do(rc, b, false) }

// writeVia writes once to rc, retrying only on EINTR.
func (r *rawIO) writeVia(rc syscall.RawConn, b []byte) (int, error) { return r.do(rc, b, true) }

func (r *rawIO) do(rc syscall.RawConn, b []byte, write bool) (int, error) {
	if r.rd == nil {
		r.rd, r.wr = r.doRead, r.doWrite
	}
	for {
		r.b = b
		var err error
		if write {
			err = rc.Write(r.wr)
		} else {
			err = rc.Read(r.rd)
		}
		if err != nil {
			r.b = nil
			return 0, err
		}
		if r.err != syscall.EINTR {
			n, err := r.n, r.err
			r.b, r.err = nil, nil
			return max(n, 0), err
		}
	}
}

// sysRead and sysWrite are read(2) and write(2) on a non-blocking
// descriptor. They never block, so they skip the scheduler's bookkeeping
// around a call that might (entersyscall, exitsyscall).
func sysRead(fd int, b []byte) (int, error) { return rawRW(syscall.SYS_READ, fd, b) }

func sysWrite(fd int, b []byte) (int, error) { return rawRW(syscall.SYS_WRITE, fd, b) }

func rawRW(trap uintptr, fd int, b []byte) (int, error) {
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	n, _, e := syscall.RawSyscall(trap, uintptr(fd), uintptr(p), uintptr(len(b)))
	if e != 0 {
		return -1, e
	}
	return int(n), nil
}

// readFd and writeFd are read and write on a descriptor the caller owns.
func readFd(fd int, b []byte) (int, error) {
	for {
		n, err := sysRead(fd, b)
		if err != syscall.EINTR {
			return max(n, 0), err
		}
	}
}

func writeFd(fd int, b []byte) (int, error) {
	for {
		n, err := sysWrite(fd, b)
		if err != syscall.EINTR {
			return max(n, 0), err
		}
	}
}

// monoEpoch anchors monoNow.
var monoEpoch = time.Now()

// monoNow reads only the monotonic clock, half the cost of time.Now (which
// reads the wall clock too).
func monoNow() time.Duration { return time.Since(monoEpoch) }
