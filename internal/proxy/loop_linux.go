package proxy

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/sysconn"
	"github.com/mongobouncer/mongobouncer/internal/topology"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
	"github.com/mongobouncer/mongobouncer/internal/uring"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// The event loop serves the common request without any goroutine: a plain
// OP_MSG command, outside a transaction and an exhaust stream, on a route
// in statement or transaction mode whose server is selectable. The loop
// reads the request, writes it to the upstream, reads the reply when the
// upstream socket says it is there, and writes it to the client, with
// non-blocking system calls on a few threads, each with an edge-triggered
// epoll set. Every other message goes to the client's goroutine, which runs
// the code it always ran and hands the client back to the loop when the
// client is idle again with nothing pinned.
//
// Ownership: a client belongs either to its goroutine or to the loop, as
// loopClient.state says, and only the owner reads its socket. A client in
// the loop has no goroutine and no net.Conn in Go's netpoller: its socket is
// a descriptor of its own (lc.fd), so that readiness wakes only the loop.
//
// Upstream connections stay the pool's: the loop borrows their sockets
// through syscall.RawConn, which keeps a concurrent Close from reusing the
// descriptor under it, and registers each in one epoll set once (pooled
// sockets are out of Go's netpoller: upstream.Options.Detach). A Close
// calls loopUp.UpstreamClosed, so a loop waiting for a reply on a connection
// the pool interrupts hears of it.
//
// Waiting for a connection takes no goroutine either: the request waits in
// the pool's queue as a pool.CheckOutFunc, whose callback (run by whoever
// frees a connection, under the pool's lock) only posts the result to the
// loops' ready list. Loop threads run the ready list after each event, so a
// connection checked in by a loop thread goes to the next waiting request on
// that same thread without a wake-up; a result posted while no loop thread is
// running wakes one through a pipe.

// loopClient is a client's event-loop state, guarded by mu. The loop
// threads, the client's goroutine, the idle sweeper and Server.Close take mu
// before they act on the client; a client's goroutine holds it only at the
// hand-overs.
type loopClient struct {
	mu    sync.Mutex
	state loopState
	// edge records readiness the loop saw while it did not own the socket.
	edge bool
	// off is set when the loop cannot take this client (no descriptor).
	off bool
	// fd is the loop's own descriptor of the client socket, -1 before the
	// first hand-over; ent is its registration in an epoll set.
	fd  int
	ent *loopEntry
	io  rawIO
	// With io_uring: home is the loop thread whose ring receives the
	// client's requests (nil with epoll); th is the loop thread acting on
	// the client, set while it holds mu, nil for everyone else; armed is
	// set while a receive into rbuf is in flight, which happens only in
	// lsIdle. A client closed meanwhile keeps fd until that receive
	// completes.
	home  *loopThread
	th    *loopThread
	armed bool
	// lastActive (monoNow) is when the last request ended, for the idle timeout.
	lastActive time.Duration

	// The request in flight (lsWaiting, lsUpstream). unsent is set while
	// it is still at the front of rbuf; retried once a cleared pool's
	// checkout was retried.
	unsent  bool
	retried bool
	// deliver is the request's pool.CheckOutFunc callback, made once.
	deliver func(*pool.Conn, error)
	route   *Route
	srv     *topology.Server
	pc      *pool.Conn
	up      *loopUp
	buf     *buffer // the reply, as it arrives
	start   time.Duration
	reqID   int32
	bytesIn int
}

// initLoop prepares a new client's loop state.
func (c *client) initLoop() { c.lc.fd = -1 }

// loopUp is the loop's registration of one upstream connection.
type loopUp struct {
	uc *upstream.Conn
	rc syscall.RawConn
	// owner is the client whose request is out on the connection, nil when
	// the loop has nothing in flight on it.
	owner atomic.Pointer[client]
	// io is used by the owner only, under its loopClient.mu.
	io rawIO

	// With io_uring (ring), the loop receives replies on a descriptor of
	// its own, so that the pool's Close cannot hand the number to another
	// socket while a receive on it waits to be submitted. mu guards fd,
	// armed (a receive is in flight) and closed (the pool closed the
	// connection: fd is shut down, and closed once nothing is in flight).
	ring   bool
	mu     sync.Mutex
	fd     int
	armed  bool
	closed bool
}

// loopEntry is what an epoll event names: a client or an upstream.
type loopEntry struct {
	fd int
	c  *client
	u  *loopUp
}

// loops is the event loop: threads, each with an epoll set, or each with
// an io_uring (ring; loop_ring_linux.go).
type loops struct {
	ring         bool
	threads      int
	eps          []int         // with epoll
	rings        []*loopThread // with io_uring
	next         atomic.Uint32 // round-robin over eps for new descriptors
	stopR, stopW int
	// wakeR and wakeW are a pipe that wakes a thread for the ready list;
	// wakePending is set while a wake-up is written and not yet taken.
	wakeR, wakeW int
	wakePending  atomic.Bool
	// running counts threads between an epoll_wait's return and their last
	// look at the ready list.
	running atomic.Int32

	// readyMu guards ready and head: checkout results to run, from head on.
	// readyN, their number, lets threads skip the lock when there is none.
	readyMu sync.Mutex
	ready   []readyItem
	head    int
	readyN  atomic.Int32
	// done is closed by stop, for the helpers that run beside the threads.
	done chan struct{}
	wg   sync.WaitGroup // the threads and the helpers

	// mu guards growth of tab; entries are stored and read atomically.
	mu sync.Mutex
	// tab maps a descriptor to its registration.
	tab atomic.Pointer[[]atomic.Pointer[loopEntry]]
}

// readyItem is the result of a queued checkout, for client c.
type readyItem struct {
	c   *client
	pc  *pool.Conn
	err error
}

// epollET is EPOLLET as the uint32 that EpollEvent.Events holds.
const epollET = 1 << 31

// EventLoopSupported reports whether this platform has the event loop.
const EventLoopSupported = true

// startLoops starts n loop threads, each with an epoll set of its own.
//
// One set per thread rather than one shared set: a descriptor's events go
// to its own thread, which takes them at its next epoll_wait while it is
// busy, instead of waking another thread (a context switch, and the
// socket's cache lines moved to another core) for each of them. Any thread
// may still act on any client: everything is under the client's lock.
func startLoops(n int) (_ *loops, err error) {
	l, err := newLoops()
	if err != nil {
		return nil, err
	}
	fds := []int{l.stopR, l.stopW, l.wakeR, l.wakeW}
	defer func() {
		if err != nil {
			closeFds(fds...)
		}
	}()
	for i := range max(n, 1) {
		ep, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
		if err != nil {
			return nil, fmt.Errorf("epoll_create1: %w", err)
		}
		fds = append(fds, ep)
		// Level-triggered: once the write end is closed, every thread's
		// epoll_wait returns it, so all of them stop.
		ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(l.stopR)}
		if err := syscall.EpollCtl(ep, syscall.EPOLL_CTL_ADD, l.stopR, &ev); err != nil {
			return nil, fmt.Errorf("epoll_ctl: %w", err)
		}
		if i == 0 {
			// One thread is enough to take a wake-up: it runs the
			// whole ready list.
			ev = syscall.EpollEvent{Events: syscall.EPOLLIN | epollET, Fd: int32(l.wakeR)}
			if err := syscall.EpollCtl(ep, syscall.EPOLL_CTL_ADD, l.wakeR, &ev); err != nil {
				return nil, fmt.Errorf("epoll_ctl: %w", err)
			}
		}
		l.eps = append(l.eps, ep)
	}
	l.threads = len(l.eps)
	tab := make([]atomic.Pointer[loopEntry], 1024)
	l.tab.Store(&tab)
	for _, ep := range l.eps {
		l.wg.Add(1)
		go l.run(ep)
	}
	return l, nil
}

// newLoops makes the loops' stop and wake pipes.
func newLoops() (*loops, error) {
	var p, w [2]int
	if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC|syscall.O_NONBLOCK); err != nil {
		return nil, fmt.Errorf("pipe2: %w", err)
	}
	if err := syscall.Pipe2(w[:], syscall.O_CLOEXEC|syscall.O_NONBLOCK); err != nil {
		closeFds(p[0], p[1])
		return nil, fmt.Errorf("pipe2: %w", err)
	}
	return &loops{stopR: p[0], stopW: p[1], wakeR: w[0], wakeW: w[1], done: make(chan struct{})}, nil
}

// stop ends the loop threads and waits for them. Registered sockets are
// their owners' to close.
func (l *loops) stop() {
	close(l.done)
	_ = syscall.Close(l.stopW)
	l.wg.Wait()
	closeFds(l.eps...)
	closeFds(l.stopR, l.wakeR, l.wakeW)
}

func closeFds(fds ...int) {
	for _, fd := range fds {
		_ = syscall.Close(fd)
	}
}

func (l *loops) run(ep int) {
	defer l.wg.Done()
	evs := make([]syscall.EpollEvent, 64)
	for {
		n, err := syscall.EpollWait(ep, evs, -1)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return
		}
		l.running.Add(1)
		tab := *l.tab.Load()
		for i := range evs[:n] {
			fd := int(evs[i].Fd)
			switch {
			case fd == l.stopR:
				l.running.Add(-1)
				return
			case fd == l.wakeR:
				// Drain, then clear: cleared first, a post in between could
				// set it again and write a byte that the drain eats, and
				// with wakePending left set no later post would wake a
				// thread. (Its item is this thread's to run: runReady below.)
				var b [64]byte
				for {
					if m, _ := syscall.Read(l.wakeR, b[:]); m < len(b) {
						break
					}
				}
				l.wakePending.Store(false)
			case fd < 0 || fd >= len(tab):
			default:
				e := tab[fd].Load()
				switch {
				case e == nil:
				case e.c != nil:
					e.c.loopReadable()
				default:
					e.u.readable()
				}
			}
			l.runReady(nil)
		}
		// A result posted while running was set is this thread's to run:
		// look again after clearing it (post looks at running after
		// adding to the list).
		for {
			l.running.Add(-1)
			if l.readyN.Load() == 0 {
				break
			}
			l.running.Add(1)
			l.runReady(nil)
		}
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

// runReady resumes the requests whose checkouts ended, oldest first; th is
// the calling thread with io_uring, nil with epoll.
func (l *loops) runReady(th *loopThread) {
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

// add registers fd, edge-triggered, for e.
func (l *loops) add(fd int, e *loopEntry) error {
	l.mu.Lock()
	tab := *l.tab.Load()
	if fd >= len(tab) {
		bigger := make([]atomic.Pointer[loopEntry], max(2*len(tab), fd+1))
		for i := range tab {
			bigger[i].Store(tab[i].Load())
		}
		l.tab.Store(&bigger)
		tab = bigger
	}
	tab[fd].Store(e)
	l.mu.Unlock()
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP | epollET, Fd: int32(fd)}
	// Round-robin over the threads' sets.
	ep := l.eps[int(l.next.Add(1)-1)%len(l.eps)]
	if err := syscall.EpollCtl(ep, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
		l.forget(e)
		return fmt.Errorf("epoll_ctl: %w", err)
	}
	return nil
}

// forget drops e's registration from the table (its descriptor leaves the
// epoll set when it is closed). An event already taken for e's descriptor
// finds nothing, or the next registration of the same number, whose handler
// tolerates spurious readiness.
func (l *loops) forget(e *loopEntry) {
	l.mu.Lock()
	tab := *l.tab.Load()
	if e.fd < len(tab) {
		tab[e.fd].CompareAndSwap(e, nil)
	}
	l.mu.Unlock()
}

// rawIO does one non-blocking read or write through a syscall.RawConn, or
// on a descriptor the caller owns, without allocating: the callbacks are
// made once.
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

func (r *rawIO) result() (int, error) {
	n, err := r.n, r.err
	r.b, r.err = nil, nil
	if n < 0 {
		n = 0
	}
	return n, err
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
			return r.result()
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

// loopsFor returns the server's loops, starting them at first use, or nil
// when the event loop is off or cannot start.
func (s *Server) loopsFor() *loops {
	if l := s.loopsPtr.Load(); l != nil {
		return l
	}
	if !s.opts.EventLoop {
		return nil
	}
	s.loopsMu.Lock()
	defer s.loopsMu.Unlock()
	if l := s.loopsPtr.Load(); l != nil || s.loopsOff {
		return l
	}
	n := s.opts.LoopThreads
	if n <= 0 {
		n = runtime.GOMAXPROCS(0)
	}
	var l *loops
	var err error
	if s.opts.LoopIO != LoopIOEpoll && uring.Supported() {
		if l, err = startRingLoops(n); err != nil {
			s.log.Warn("io_uring unavailable; the event loop uses epoll", "error", err)
		}
	}
	if l == nil {
		l, err = startLoops(n)
	}
	if err != nil {
		s.loopsOff = true
		s.log.Warn("event loop unavailable; every client is served by its goroutine", "error", err)
		return nil
	}
	s.loopsPtr.Store(l)
	l.wg.Add(1)
	go s.sweepIdle(l)
	return l
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
		lc := &c.lc
		lc.mu.Lock()
		if lc.state == lsUpstream {
			c.loopAbandon(nil)
		}
		lc.mu.Unlock()
	}
}

// sweepIdle closes loop-owned clients idle longer than client_idle_timeout
// (goroutine-owned ones have a read deadline instead).
func (s *Server) sweepIdle(l *loops) {
	defer l.wg.Done()
	t := time.NewTimer(time.Second)
	defer t.Stop()
	for {
		// Sweep at an eighth of the shortest timeout in force, so that a
		// client is closed at most that much late.
		shortest := time.Duration(s.idleTimeout.Load())
		if tb := s.table.Load(); tb != nil {
			for _, r := range tb.all {
				if t := time.Duration(r.idle.Load()); t > 0 && (shortest <= 0 || t < shortest) {
					shortest = t
				}
			}
		}
		every := time.Second
		if shortest > 0 {
			every = min(max(shortest/8, 5*time.Millisecond), time.Second)
		}
		t.Reset(every)
		select {
		case <-l.done:
			return
		case <-t.C:
		}
		if shortest <= 0 {
			continue
		}
		now := monoNow()
		for _, c := range s.snapshot() {
			lc := &c.lc
			lc.mu.Lock()
			if lc.state == lsIdle {
				if timeout := c.idleTimeout(); timeout > 0 && now-lc.lastActive > timeout {
					c.loopClose()
				}
			}
			lc.mu.Unlock()
		}
	}
}

// enterLoop hands an idle client from its goroutine to the loop. When it
// returns true the loop owns the client and the goroutine must return
// without touching it.
func (c *client) enterLoop() bool {
	lc := &c.lc
	if lc.off || c.hasPinOrOpen() {
		return false
	}
	l := c.s.loopsFor()
	if l == nil {
		return false
	}
	lc.mu.Lock()
	defer lc.mu.Unlock()
	// Close disconnects the clients after setting closing, each under
	// lc.mu: a client that enters the loop before is disconnected there,
	// one that would enter after stays with its goroutine, which finds its
	// connection closed.
	if lc.state != lsGoroutine || c.s.closing.Load() {
		return false
	}
	if lc.fd < 0 {
		fd, err := sysconn.Dup(c.nc)
		if err != nil {
			lc.off = true
			return false
		}
		if !l.ring {
			e := &loopEntry{fd: fd, c: c}
			if err := l.add(fd, e); err != nil {
				_ = syscall.Close(fd)
				lc.off = true
				return false
			}
			lc.ent = e
		}
		lc.fd = fd
		if l.ring {
			lc.home = l.home()
		}
	}
	// Out of Go's netpoller: readiness now wakes the loop only.
	_ = c.nc.Close()
	c.nc = nil
	c.deadline = false
	lc.lastActive = monoNow()
	lc.state = lsIdle
	lc.edge = false
	c.state.Store(uint32(stateIdle))
	// Bytes may have come before the hand-over, and their edge has passed.
	c.loopServe()
	return true
}

// toGoroutine gives the client back to a goroutine, which handles what is
// in rbuf with the goroutine code. It holds lc.mu.
func (c *client) toGoroutine() {
	lc := &c.lc
	nc, err := fileConn(lc.fd)
	if err != nil {
		c.log.Warn("cannot give client back to a goroutine", "error", err)
		c.loopClose()
		return
	}
	c.nc = nc
	lc.state = lsGoroutine
	go c.run()
}

// fileConn makes a net.Conn (in Go's netpoller) of a duplicate of fd.
func fileConn(fd int) (net.Conn, error) {
	d, err := sysconn.DupFd(fd)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(d), "client")
	defer f.Close()
	return net.FileConn(f)
}

// loopReadable runs on a loop thread when the client's socket may be
// readable.
func (c *client) loopReadable() {
	lc := &c.lc
	lc.mu.Lock()
	switch lc.state {
	case lsIdle:
		c.loopServe()
	case lsClosed:
	default:
		lc.edge = true
	}
	lc.mu.Unlock()
}

// loopServe reads the client until it has a whole message, then serves it
// on the loop or hands it to a goroutine. It holds lc.mu, state lsIdle.
func (c *client) loopServe() {
	lc := &c.lc
	drained := false
	for {
		if avail := c.rhi - c.rlo; avail >= wire.HeaderLen {
			n := int(int32(binary.LittleEndian.Uint32(c.rbuf[c.rlo:])))
			if n < wire.HeaderLen || n > len(c.rbuf) || n > c.maxMsg {
				// Larger than the inline buffer, or malformed: the
				// goroutine reads the rest, or answers the error.
				c.toGoroutine()
				return
			}
			if avail >= n {
				if !c.loopRequest(c.rbuf[c.rlo : c.rlo+n]) {
					c.toGoroutine()
				}
				return
			}
		}
		if drained {
			// A short read emptied the socket: the next edge says when
			// more has come.
			return
		}
		if c.rlo > 0 {
			c.rhi = copy(c.rbuf[:], c.rbuf[c.rlo:c.rhi])
			c.rlo = 0
		}
		if lc.home != nil {
			c.ringArmClient()
			return
		}
		room := len(c.rbuf) - c.rhi
		m, err := readFd(lc.fd, c.rbuf[c.rhi:])
		// edge stays set while the socket may hold more than was read (a
		// read that filled rbuf), since no new edge will say so: loopAfter
		// reads on after the reply, even with rbuf empty by then.
		lc.edge = err == nil && m == room
		if err == syscall.EAGAIN {
			return
		}
		if err != nil || m == 0 {
			c.loopClose()
			return
		}
		c.rhi += m
		drained = m < room
	}
}

// loopRequest serves msg on the loop when it is a request the loop handles
// and a connection is available now; otherwise it returns false having
// changed nothing. It holds lc.mu, state lsIdle.
func (c *client) loopRequest(msg []byte) bool {
	if wire.OpCode(int32(binary.LittleEndian.Uint32(msg[12:]))) != wire.OpMsg {
		return false
	}
	if err := wire.ParseMsgInto(msg, &c.msg); err != nil {
		return false
	}
	if c.msg.Flags&(wire.FlagExhaustAllowed|wire.FlagMoreToCome) != 0 {
		return false
	}
	req := &c.req
	req.inspect(c.msg.Body)
	switch req.info.kind {
	case kindOther, kindGetMore, kindKillCursors:
	default:
		return false
	}
	if _, inTxn := req.key(); inTxn || req.startTxn || len(req.db) == 0 ||
		string(req.db) == AdminDatabase || c.s.draining.Load() {
		return false
	}
	var route *Route
	if c.only != "" {
		route = c.s.Route(c.only)
	} else {
		route = c.s.routeFor(req.db)
	}
	if route == nil || route.noLoop.Load() || route.PoolMode() == ModeSession || route.Paused() ||
		(route.multi && req.info.kind != kindOther) {
		return false
	}
	srv := route.Topology.TrySelectServer()
	if srv == nil {
		return false
	}
	// The request is the loop's from here on.
	c.useRoute(route)
	lc := &c.lc
	lc.route, lc.srv = route, srv
	lc.start = monoNow()
	lc.reqID = int32(binary.LittleEndian.Uint32(msg[4:]))
	lc.bytesIn = len(msg)
	lc.unsent = true
	c.requests.Add(1)
	c.bytesOut = 0
	c.okReply = false
	c.mu.Lock()
	c.busy = true
	c.mu.Unlock()
	c.loopCheckOut()
	return true
}

// loopCheckOut checks a connection out for the request, or queues the
// request in the pool until one is free. It holds lc.mu.
func (c *client) loopCheckOut() {
	lc := &c.lc
	if lc.deliver == nil {
		lc.deliver = c.loopDelivered
	}
	pc, queued, err := lc.srv.Pool().CheckOutFunc(lc.deliver)
	if queued {
		lc.state = lsWaiting
		c.state.Store(uint32(stateWaiting))
		return
	}
	c.loopCheckedOut(pc, err)
}

// loopDelivered is the CheckOutFunc callback of a queued request: under the
// pool's lock, it only posts the result to a loop thread.
func (c *client) loopDelivered(pc *pool.Conn, err error) {
	if l := c.s.loopsPtr.Load(); l != nil {
		l.post(readyItem{c: c, pc: pc, err: err})
		return
	}
	// The loops have stopped (the server is closing): finish on a
	// goroutine, which must not run under the pool's lock.
	go c.loopResume(nil, pc, err)
}

// loopResume continues a request whose queued checkout ended, on loop
// thread th (nil with epoll, or when the loops have stopped). While it
// waits (lsWaiting) nothing but this ends the request, so the state is
// still lsWaiting here.
func (c *client) loopResume(th *loopThread, pc *pool.Conn, err error) {
	lc := &c.lc
	lc.mu.Lock()
	if th == nil && c.s.loopsPtr.Load() == nil {
		// No loop thread would receive the reply.
		c.loopAbandon(pc)
		lc.mu.Unlock()
		return
	}
	lc.th = th
	c.loopCheckedOut(pc, err)
	lc.th = nil
	lc.mu.Unlock()
}

// loopAbandon ends the request of a client whose loops have stopped (Close
// ran out of time with it in flight): no thread will receive its reply, so
// its connection (pc, when a queued checkout delivers one) is closed rather
// than pooled, and the client is disconnected. It holds lc.mu.
func (c *client) loopAbandon(pc *pool.Conn) {
	lc := &c.lc
	switch lc.state {
	case lsUpstream:
		lc.up.owner.Store(nil)
		lc.pc.MarkErrored(errLoopStopped)
		c.loopEnd()
	case lsWaiting:
		if pc != nil {
			pc.MarkErrored(errLoopStopped)
			_ = lc.srv.Pool().CheckIn(pc)
		}
		lc.unsent = false
		c.mu.Lock()
		c.busy = false
		c.mu.Unlock()
	default:
		return
	}
	c.loopClose()
}

// loopCheckedOut sends the request on the connection it was given, or
// answers the checkout's error. It holds lc.mu.
func (c *client) loopCheckedOut(pc *pool.Conn, err error) {
	lc := &c.lc
	route, srv := lc.route, lc.srv
	if err != nil && !lc.retried && clearedAndReady(err, srv) {
		// Cleared and ready again meanwhile: one more try, as the
		// goroutine code does.
		lc.retried = true
		c.loopCheckOut()
		return
	}
	lc.retried = false
	c.state.Store(uint32(stateActive))
	if err != nil {
		srv.HandleError(err, nil)
		c.loopErrorReply(c.s.upstreamError(route, err, &c.req, false))
		return
	}
	route.held.Add(1)
	lu := c.s.loopUpFor(pc.Upstream().(*upstream.Conn))
	if lu == nil {
		// TLS or compression toward this upstream: its requests stay on
		// goroutines. The request is still in rbuf; it starts over there.
		route.noLoop.Store(true)
		route.checkIn(srv, pc)
		c.requests.Add(^uint64(0))
		c.mu.Lock()
		c.busy = false
		c.mu.Unlock()
		lc.route, lc.srv, lc.unsent = nil, nil, false
		c.toGoroutine()
		return
	}
	c.loopSend(pc, lu)
}

// loopSend writes the request (still at the front of rbuf) to pc's socket.
// It holds lc.mu.
func (c *client) loopSend(pc *pool.Conn, lu *loopUp) {
	lc := &c.lc
	msg := c.rbuf[c.rlo : c.rlo+lc.bytesIn]
	c.consume(lc.bytesIn)
	lc.unsent = false
	lc.pc, lc.up = pc, lu
	lc.state = lsUpstream
	lu.owner.Store(c)
	n, err := lu.io.write(lu.rc, msg)
	if err == nil && n < len(msg) {
		// A small request that does not fit the socket's send buffer: the
		// upstream has stopped reading.
		err = syscall.EAGAIN
	}
	if err != nil {
		c.loopFail(lu.uc.IOError("write", err))
		return
	}
	if lu.ring {
		c.ringArmReply()
	}
}

// consume drops n bytes, a request being handled, from the front of rbuf.
// The bytes stay where they are until the next read, so the request's
// slices remain valid.
func (c *client) consume(n int) {
	c.rlo += n
	if c.rlo == c.rhi {
		c.rlo, c.rhi = 0, 0
	}
}

// loopUpFor returns the loop's registration of uc, registering it at its
// first use, or nil when the loop cannot use it.
func (s *Server) loopUpFor(uc *upstream.Conn) *loopUp {
	if a, ok := uc.Attachment().(*loopUp); ok {
		return a
	}
	if _, on := uc.Compressor(); on {
		return nil
	}
	rc, ok := uc.RawConn()
	if !ok {
		return nil
	}
	l := s.loopsPtr.Load()
	if l == nil {
		return nil
	}
	lu := &loopUp{uc: uc, rc: rc, ring: l.ring, fd: -1}
	var err error
	if cerr := rc.Control(func(fd uintptr) {
		if l.ring {
			lu.fd, err = sysconn.DupFd(int(fd))
			return
		}
		err = l.add(int(fd), &loopEntry{fd: int(fd), u: lu})
	}); cerr != nil {
		err = cerr
	}
	if err != nil {
		return nil
	}
	uc.SetAttachment(lu)
	return lu
}

// UpstreamClosed is called by upstream.Conn.Close: a request in flight on
// the connection fails now, on a goroutine of its own, since the close may
// have dropped the event that would have woken the loop.
func (lu *loopUp) UpstreamClosed() {
	if lu.ring {
		lu.ringClosed()
		return
	}
	if lu.owner.Load() != nil {
		go lu.readable()
	}
}

// readable runs on a loop thread when the upstream socket may be readable.
func (lu *loopUp) readable() {
	c := lu.owner.Load()
	if c == nil {
		return
	}
	lc := &c.lc
	lc.mu.Lock()
	if lc.state == lsUpstream && lc.up == lu {
		c.loopReply()
	}
	lc.mu.Unlock()
}

// loopReply reads the upstream's reply and, once it is whole, relays it.
// It holds lc.mu, state lsUpstream.
func (c *client) loopReply() {
	lc := &c.lc
	lu := lc.up
	if lc.buf == nil {
		lc.buf = getBuffer(16 * 1024)
		lc.buf.b = lc.buf.b[:0]
	}
	b := lc.buf.b
	maxMsg := lu.uc.MaxMessageSize()
	drained := false
	need := wire.HeaderLen
	for {
		if len(b) >= 4 {
			need = int(int32(binary.LittleEndian.Uint32(b)))
			if err := replyLengthError(need, maxMsg); err != nil {
				lc.buf.b = b[:0]
				c.loopFail(lu.uc.IOError("read", err))
				return
			}
			if len(b) >= need {
				break
			}
		}
		if drained {
			// The socket is empty before the reply is whole: the next edge
			// says when more has come.
			lc.buf.b = b
			return
		}
		if cap(b) < need {
			// Grown to the declared length only, which is bounded above.
			nb := make([]byte, len(b), need)
			copy(nb, b)
			b = nb
		}
		room := cap(b) - len(b)
		m, err := lu.io.read(lu.rc, b[len(b):cap(b)])
		if err == syscall.EAGAIN {
			lc.buf.b = b
			return
		}
		if err == nil && m == 0 {
			err = io.EOF
		}
		if err != nil {
			lc.buf.b = b[:0]
			c.loopFail(lu.uc.IOError("read", err))
			return
		}
		b = b[:len(b)+m]
		drained = m < room
	}
	c.loopReplied(b, need)
}

// replyLengthError reports a reply length outside [wire.HeaderLen, maxMsg].
func replyLengthError(n, maxMsg int) error {
	if n < wire.HeaderLen || n > maxMsg {
		return fmt.Errorf("reply length %d is outside [%d, %d]: %w", n, wire.HeaderLen, maxMsg, wire.ErrMessageTooLarge)
	}
	return nil
}

// loopReplied relays the whole reply at the front of b, need bytes long.
// It holds lc.mu, state lsUpstream.
func (c *client) loopReplied(b []byte, need int) {
	lc := &c.lc
	lu := lc.up
	reply := b[:need]
	lc.buf.b = b[:0]
	route, srv := lc.route, lc.srv
	flags, body := replyView(reply)
	ri := inspectReply(body)
	c.okReply = ri.ok
	if !ri.ok && ri.code != 0 {
		c.s.opts.Observer.UpstreamError(route.Name, ri.code)
	}
	if flags&wire.FlagMoreToCome != 0 || len(b) > need {
		c.loopFail(fmt.Errorf("upstream %s sent more than one reply to a request without exhaustAllowed", srv.Address()))
		return
	}
	if err := checkReply(reply, srv.Address(), lc.reqID, true); err != nil {
		c.loopFail(err)
		return
	}
	c.track(route, srv, &c.req, txnKey{}, false, ri, nil)
	lu.owner.Store(nil)
	c.loopEnd()
	if !c.loopWrite(reply) {
		return
	}
	c.loopAfter()
}

// loopFail ends the request in flight with a retryable error reply, as fail
// and upstreamError do for the goroutine code. It holds lc.mu.
func (c *client) loopFail(err error) {
	lc := &c.lc
	route, srv, pc := lc.route, lc.srv, lc.pc
	lc.up.owner.Store(nil)
	pc.MarkErrored(err)
	srv.HandleError(err, pc)
	c.s.log.Warn("upstream error", "route", route.Name, "server", srv.Address(), "client", c.id, "error", err)
	c.loopEnd()
	c.loopErrorReply(c.s.upstreamError(route, err, &c.req, false))
}

// loopErrorReply answers the request with an error reply body; the client
// stays connected. It holds lc.mu, the request's connection returned.
func (c *client) loopErrorReply(body []byte) {
	lc := &c.lc
	if lc.unsent {
		c.consume(lc.bytesIn)
		lc.unsent = false
	}
	c.okReply = false
	c.mu.Lock()
	c.busy = false
	c.mu.Unlock()
	c.state.Store(uint32(stateIdle))
	c.nextID++
	out := getBuffer(len(body) + 64)
	msg := wire.AppendMsg(out.b[:0], c.nextID, lc.reqID, 0, body)
	ok := c.loopWrite(msg)
	putBuffer(out)
	if ok {
		c.loopAfter()
	}
}

// loopEnd returns the request's connection to its pool and marks the client
// idle, as release does.
func (c *client) loopEnd() {
	lc := &c.lc
	lc.route.checkIn(lc.srv, lc.pc)
	lc.pc, lc.up = nil, nil
	c.mu.Lock()
	c.busy = false
	c.mu.Unlock()
	c.state.Store(uint32(stateIdle))
}

// loopAfter finishes a request whose reply was written, then serves what
// the client sent meanwhile. It holds lc.mu.
func (c *client) loopAfter() {
	lc := &c.lc
	c.loopAccount()
	lc.state = lsIdle
	if lc.edge || c.rhi != c.rlo || lc.home != nil {
		// With io_uring, loopServe starts the next receive.
		c.loopServe()
	}
}

// loopAccount reports the request that ended to the Observer, as forward
// does, and drops its state. It holds lc.mu.
func (c *client) loopAccount() {
	lc := &c.lc
	if lc.route == nil {
		return
	}
	name := c.req.info.name
	if !c.req.info.known {
		name = "other"
	}
	now := monoNow()
	c.s.opts.Observer.Request(lc.route.Name, name, lc.bytesIn, c.bytesOut, now-lc.start, c.okReply)
	lc.route, lc.srv = nil, nil
	lc.lastActive = now
	putBuffer(lc.buf)
	lc.buf = nil
}

// loopWrite writes msg to the client. A client that does not read never
// blocks the loop: what the socket does not take goes to a goroutine, which
// writes it and serves the client from then on. It returns false when the
// loop no longer owns the client. It holds lc.mu.
func (c *client) loopWrite(msg []byte) bool {
	lc := &c.lc
	n, err := writeFd(lc.fd, msg)
	c.bytesOut += n
	if err == nil && n == len(msg) {
		return true
	}
	if err != nil && err != syscall.EAGAIN {
		c.loopAccount()
		c.loopClose()
		return false
	}
	rest := getBuffer(len(msg) - n)
	copy(rest.b, msg[n:])
	c.bytesOut += len(rest.b)
	c.loopAccount()
	nc, ferr := fileConn(lc.fd)
	if ferr != nil {
		putBuffer(rest)
		c.loopClose()
		return false
	}
	c.nc = nc
	lc.state = lsGoroutine
	go func() {
		_, werr := nc.Write(rest.b)
		putBuffer(rest)
		if werr != nil {
			c.finish(errClientGone)
			return
		}
		c.run()
	}()
	return false
}

// loopClose finishes a loop-owned client. It holds lc.mu.
func (c *client) loopClose() {
	c.loopAccount()
	c.lc.state = lsClosed
	c.finishLocked(errClientGone)
}

// loopForget drops the loop's registration and descriptor of the client.
// It holds lc.mu.
func (c *client) loopForget() {
	lc := &c.lc
	if lc.fd < 0 {
		return
	}
	if lc.armed {
		// A receive is in flight on the descriptor: shutting the socket
		// down ends it, and its completion closes the descriptor.
		_ = syscall.Shutdown(lc.fd, syscall.SHUT_RDWR)
		return
	}
	if lc.ent != nil {
		if l := c.s.loopsPtr.Load(); l != nil {
			l.forget(lc.ent)
		}
	}
	// Closing the descriptor also takes it out of the epoll set.
	_ = syscall.Close(lc.fd)
	lc.ent, lc.fd = nil, -1
}

// disconnect closes the client from outside (Server.Close): a loop-owned
// idle client is finished at once; otherwise its owner notices the closed
// socket.
func (c *client) disconnect() {
	lc := &c.lc
	lc.mu.Lock()
	defer lc.mu.Unlock()
	switch lc.state {
	case lsIdle:
		c.loopClose()
	case lsUpstream, lsWaiting:
		// The reply's write fails once the descriptor is shut down.
		_ = syscall.Shutdown(lc.fd, syscall.SHUT_RDWR)
	case lsGoroutine:
		if c.nc != nil {
			_ = c.nc.Close()
		}
	}
}
