package proxy

// The event loop's core: its threads, the ready list of checkouts that
// ended, the idle sweeper, and the driver interface behind which epoll
// (loop_epoll_linux.go) and io_uring (loop_ring_linux.go) do the waiting.
// What the loop does with a client's request is in loop_client_linux.go.
//
// The loop serves the common request without any goroutine: a plain
// OP_MSG command, outside a transaction and an exhaust stream, on a route
// in statement or transaction mode whose server is selectable
// (admitLoop, admit.go). Every other message goes to the client's goroutine,
// which hands the client back to the loop when it is idle again with
// nothing pinned.
//
// Waiting for a connection takes no goroutine either: the request waits in
// the pool's queue as a pool.CheckOutFunc, whose callback (run by whoever
// frees a connection, under the pool's lock) only posts the result to the
// ready list. Loop threads run the ready list after each event, so a
// connection checked in by a loop thread goes to the next waiting request
// on that same thread without a wake-up; a result posted while no loop
// thread is running wakes one through a pipe.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/uring"
)

// EventLoopSupported reports whether this platform has the event loop.
const EventLoopSupported = true

// loopDriver is one I/O model of the event loop. The request logic
// (loop_client_linux.go) calls it to wait for bytes and to send them, and
// the driver calls back c.clientReceived and c.replyReceived with what
// arrived, holding the client's ownMu. th is the loop thread a call runs
// on, nil off the loop threads (a client's goroutine handing it to the
// loop, or a checkout delivered after the loops stopped).
type loopDriver interface {
	// attachClient registers a client socket (a descriptor the loop owns)
	// as the client enters the loop for the first time.
	attachClient(c *client, fd int) (loopSock, error)
	// attachUpstream registers an upstream connection's socket at the
	// loop's first use of it.
	attachUpstream(lu *loopUp, fd int) (any, error)
	// recvClient waits for more of the client's next request, into
	// c.rbuf[c.rhi:], which has room. It holds ownMu, state lsIdle.
	recvClient(th loopThread, c *client)
	// recvReply waits for more of the reply on the client's upstream
	// connection, into the free end of lc.buf, which has room. It holds
	// ownMu, state lsUpstream.
	recvReply(th loopThread, c *client)
	// send writes b to the client's socket, or to its upstream
	// connection's, without blocking; it returns how much was written.
	sendClient(c *client, b []byte) (int, error)
	sendUpstream(lu *loopUp, b []byte) (int, error)
	// sendRequest sends the request b on the client's upstream connection
	// and waits for the reply in one go, as sendUpstream then recvReply
	// would, when the driver can on thread th; it returns false, having
	// done nothing, when it cannot. It holds ownMu, state lsUpstream.
	sendRequest(th loopThread, c *client, b []byte) bool
	// sendReply sends the reply msg to the client and waits for its next
	// request in one go, as sendClient then recvClient would, when the
	// driver can on thread th and the client has nothing else in rbuf; it
	// returns false, having done nothing, when it cannot. It holds ownMu,
	// state lsUpstream, the connection released.
	sendReply(th loopThread, c *client, msg []byte) bool
	// closeClient releases the client's socket: at once, or when a
	// receive in flight on it has ended. It holds ownMu.
	closeClient(c *client)
	// upstreamClosed hears that the pool closed lu's connection: a request
	// waiting for its reply must fail.
	upstreamClosed(lu *loopUp)
	// awaitSends waits, bounded by ctx, for the sends to clients closed by
	// Server.Close that are still in flight, so that stopping the loop
	// does not cut them short.
	awaitSends(ctx context.Context) error
	// stop releases the driver's resources once its threads have ended.
	stop()
}

// loopThread is a loop thread as its driver knows it; nil off the loop.
type loopThread interface{ loopThread() }

// loopSock is a driver's registration of a client socket.
type loopSock interface {
	// fd is the loop's descriptor of the socket, -1 once closed.
	fd() int
	// entered says the client was handed to the loop: its socket may hold
	// bytes whose readiness has passed.
	entered()
}

// loopClient is a client's event-loop state, guarded by ownMu. The loop
// threads, the client's goroutine, the idle sweeper and Server.Close take
// ownMu before they act on the client; a client's goroutine holds it only
// at the hand-overs.
type loopClient struct {
	ownMu sync.Mutex
	state loopState
	// off is set when the loop cannot take this client (no descriptor).
	off bool
	// lingered is set once the client's socket was handed to
	// Server.flush (linger_linux.go).
	lingered bool
	// drv and sock are the driver and its registration of the loop's own
	// descriptor of the client socket, set at the first hand-over.
	drv  loopDriver
	sock loopSock
	// lastActive (monoNow) is when the last request ended, for the idle timeout.
	lastActive time.Duration
	// serving is set while loopServe runs; again asks it to run once more
	// (loopServe).
	serving, again bool
	// unsent is set while the request in flight is still at the front of
	// rbuf (lsWaiting).
	unsent bool
	// deliver is the request's pool.CheckOutFunc callback, made once.
	deliver func(*pool.Conn, error)
	// up is the upstream connection the request is out on (lsUpstream),
	// buf the reply as it arrives.
	up  *loopUp
	buf *buffer
}

// loopUp is the loop's registration of one upstream connection.
type loopUp struct {
	uc pool.Upstream
	rc syscall.RawConn
	// owner is the client whose request is out on the connection, nil when
	// the loop has nothing in flight on it.
	owner atomic.Pointer[client]
	// io is used by the owner only, under its ownMu.
	io rawIO
	// drv and sock are the driver that registered the connection and its
	// registration, set once.
	drv  loopDriver
	sock any
}

// loops is the event loop: threads of one driver, and the ready list.
type loops struct {
	drv     loopDriver
	log     *slog.Logger // for a thread that cannot go on
	threads int
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

	// readyMu guards ready and head: checkout results to run, from head on.
	// readyN, their number, lets threads skip the lock when there is none.
	readyMu sync.Mutex
	ready   []readyItem
	head    int
	readyN  atomic.Int32
	// done is closed by stop, for the helpers that run beside the threads.
	done chan struct{}
	wg   sync.WaitGroup // the threads and the helpers
}

// readyItem is the result of a queued checkout, for client c.
type readyItem struct {
	c   *client
	pc  *pool.Conn
	err error
}

// errLoopStopped fails a request whose reply no loop thread can receive.
var errLoopStopped = errors.New("the event loop has stopped")

// newLoops makes the loops' stop and wake pipes.
func newLoops(log *slog.Logger) (*loops, error) {
	var p, w [2]int
	if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC|syscall.O_NONBLOCK); err != nil {
		return nil, fmt.Errorf("pipe2: %w", err)
	}
	if err := syscall.Pipe2(w[:], syscall.O_CLOEXEC|syscall.O_NONBLOCK); err != nil {
		closeFds(p[0], p[1])
		return nil, fmt.Errorf("pipe2: %w", err)
	}
	return &loops{log: log, stopR: p[0], stopW: p[1], wakeR: w[0], wakeW: w[1], done: make(chan struct{})}, nil
}

// stop ends the loop threads and waits for them.
func (l *loops) stop() {
	close(l.done)
	_ = syscall.Close(l.stopW)
	l.wg.Wait()
	l.drv.stop()
	closeFds(l.stopR, l.wakeR, l.wakeW)
}

func closeFds(fds ...int) {
	for _, fd := range fds {
		_ = syscall.Close(fd)
	}
}

// post queues a checkout's result for a loop thread. It is a
// pool.CheckOutFunc callback's work: called under the pool's lock, it only
// takes readyMu and, when no thread is running, writes the wake-up pipe.
func (l *loops) post(it readyItem) {
	l.readyMu.Lock()
	l.ready = append(l.ready, it)
	l.readyN.Add(1)
	l.readyMu.Unlock()
	if l.running.Load() == 0 && l.wakePending.CompareAndSwap(false, true) {
		one := [1]byte{1}
		_, _ = syscall.Write(l.wakeW, one[:])
	}
}

// runReady resumes the requests whose checkouts ended, oldest first, on
// loop thread th.
func (l *loops) runReady(th loopThread) {
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
		it.c.loopResume(th, it.pc, it.err)
	}
}

// settle ends a thread's round of work: a result posted while running was
// counted is this thread's to run, so it looks again after leaving the
// count (post looks at running after adding to the list).
func (l *loops) settle(th loopThread) {
	for {
		l.running.Add(-1)
		if l.readyN.Load() == 0 {
			return
		}
		l.running.Add(1)
		l.runReady(th)
	}
}

// loopsFor returns the server's loops, starting them at first use, or nil
// when the event loop is off or cannot start.
func (s *Server) loopsFor() *loops {
	if l := s.loopsPtr.Load(); l != nil {
		return l
	}
	if !s.opts.EventLoop {
		return nil
	}
	l, err := s.startLoops()
	if err != nil {
		s.log.Warn("event loop unavailable; every client is served by its goroutine", "error", err)
	}
	return l
}

// startLoops starts the loops once. Auto prefers io_uring and falls back to
// epoll with a warning; LoopIOUring never falls back (New starts the loops
// at once then, and fails where the ring cannot start).
func (s *Server) startLoops() (*loops, error) {
	s.loopsMu.Lock()
	defer s.loopsMu.Unlock()
	if l := s.loopsPtr.Load(); l != nil || s.loopsOff {
		return l, nil
	}
	n := s.opts.LoopThreads
	if n <= 0 {
		n = runtime.GOMAXPROCS(0)
	}
	var l *loops
	var err error
	switch {
	case s.opts.LoopIO == LoopIOUring:
		l, err = startRing(n, s.opts.LoopSpin, &s.loopSpins, s.log)
	case s.opts.LoopIO != LoopIOEpoll && uring.Supported():
		if l, err = startRing(n, s.opts.LoopSpin, &s.loopSpins, s.log); err != nil {
			s.log.Warn("io_uring unavailable; the event loop uses epoll", "error", err)
		}
		if l == nil {
			l, err = startEpoll(n, s.log)
		}
	default:
		l, err = startEpoll(n, s.log)
	}
	if err != nil {
		s.loopsOff = true
		return nil, err
	}
	s.loopsPtr.Store(l)
	l.wg.Add(1)
	go s.sweepIdle(l)
	return l, nil
}

// awaitLoopSends waits, bounded by ctx, for the replies still being sent to
// clients that Close has closed (loopDriver.awaitSends).
func (s *Server) awaitLoopSends(ctx context.Context) error {
	if l := s.loopsPtr.Load(); l != nil {
		return l.drv.awaitSends(ctx)
	}
	return nil
}

// stopLoops stops the loops, if they were started, for good. Requests
// still in their hands (Close ran out of time) are abandoned: their
// connections closed, their clients disconnected.
func (s *Server) stopLoops() {
	s.loopsMu.Lock()
	l := s.loopsPtr.Swap(nil)
	s.loopsOff = true
	s.loopsMu.Unlock()
	if l == nil {
		return
	}
	l.stop()
	// Checkout results posted too late for a thread (later ones find no
	// loops and abandon on their own, in loopResume).
	l.readyMu.Lock()
	late := l.ready[l.head:]
	l.ready, l.head = nil, 0
	l.readyN.Store(0)
	l.readyMu.Unlock()
	for _, it := range late {
		it.c.loopResume(nil, it.pc, it.err)
	}
	for _, c := range s.snapshot() {
		c.abandonUpstream()
	}
}

// abandonUpstream abandons the request a loop client has out on an
// upstream connection, if any, under ownMu.
func (c *client) abandonUpstream() {
	lc := &c.lc
	lc.ownMu.Lock()
	defer lc.ownMu.Unlock()
	if lc.state == lsUpstream {
		c.loopAbandon(nil)
	}
}

// sweepIdle closes loop-owned clients idle longer than client_idle_timeout,
// and those client_login_timeout closes (loopLoginExpired); goroutine-owned
// ones have a read deadline instead.
func (s *Server) sweepIdle(l *loops) {
	defer l.wg.Done()
	t := time.NewTimer(time.Second)
	defer t.Stop()
	for {
		// Sweep at an eighth of the shortest timeout in force, so that a
		// client is closed at most that much late: at most a second late
		// for client_idle_timeout, while client_login_timeout (60s by
		// default, and in force by default) does not make every idle
		// client's lock taken every second.
		idle := time.Duration(s.idleTimeout.Load())
		if tb := s.table.Load(); tb != nil {
			for _, r := range tb.all {
				if t := time.Duration(r.idle.Load()); t > 0 && (idle <= 0 || t < idle) {
					idle = t
				}
			}
		}
		var every time.Duration
		if idle > 0 {
			every = min(max(idle/8, 5*time.Millisecond), time.Second)
		}
		if login := time.Duration(s.loginTimeout.Load()); login > 0 {
			if e := max(login/8, 5*time.Millisecond); every == 0 || e < every {
				every = e
			}
		}
		sweep := every > 0
		if !sweep {
			every = time.Second
		}
		t.Reset(every)
		select {
		case <-l.done:
			return
		case <-s.sweepKick:
			// A shorter client_login_timeout: wait by the new one.
			continue
		case <-t.C:
		}
		if !sweep {
			continue
		}
		// Read again: a reload during the wait may have lengthened it.
		login := time.Duration(s.loginTimeout.Load())
		now := monoNow()
		for _, c := range s.snapshot() {
			c.sweepOne(now, login)
		}
	}
}

// sweepOne closes a loop-owned idle client past client_idle_timeout or
// client_login_timeout (login), under ownMu.
func (c *client) sweepOne(now, login time.Duration) {
	lc := &c.lc
	lc.ownMu.Lock()
	defer lc.ownMu.Unlock()
	if lc.state != lsIdle {
		return
	}
	if timeout := c.idleTimeout(); timeout > 0 && now-lc.lastActive > timeout {
		c.loopClose()
	} else if why, waited := c.loopLoginExpired(now, login); why != "" {
		c.loginTimedOut(why, waited, login)
		c.loopClose()
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

// read reads once from rc, retrying only on EINTR.
func (r *rawIO) read(rc syscall.RawConn, b []byte) (int, error) { return r.do(rc, b, false) }

// write writes once to rc, retrying only on EINTR.
func (r *rawIO) write(rc syscall.RawConn, b []byte) (int, error) { return r.do(rc, b, true) }

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
