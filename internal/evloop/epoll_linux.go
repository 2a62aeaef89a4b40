package evloop

// The epoll driver of the event loop: threads, each with an edge-triggered
// epoll set of its own, and non-blocking read and write calls.
//
// One set per thread rather than one shared set: a descriptor's events go
// to its own thread, which takes them at its next epoll_wait while it is
// busy, instead of waking another thread (a context switch, and the
// socket's cache lines moved to another core) for each of them. Any thread
// may still act on any endpoint: everything is under the endpoint's Mu.
//
// Edge-triggered readiness says when bytes arrived, not that they are
// still there, so each socket keeps a ready flag: set by an event, cleared
// when a read finds the socket empty (EAGAIN, or a read shorter than its
// buffer). A receive on a socket that is not ready waits for the next
// event instead of making a read call that would find nothing.

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
)

// epollET is EPOLLET as the uint32 that EpollEvent.Events holds.
const epollET = 1 << 31

// epollDriver is the loop on epoll.
type epollDriver struct {
	l       *Loop
	threads []*epollThread // one epoll set each
	// lazy is set on a loop of both drivers (adapt_linux.go): upstream
	// connections join the epoll set only while epoll serves their
	// request (join, leave).
	lazy bool

	// setsMu and setsShut keep epoll_ctl off the sets' numbers once stop
	// has closed them (ctl): calls off the loop threads, which stop does
	// not wait for (a goroutine failing a request when the pool closed its
	// connection, which then serves the client's next one), may name a set
	// after that, when its number may be another loop's set, or a socket.
	setsMu   sync.RWMutex
	setsShut bool

	tabMu sync.Mutex // guards growth of tab; entries are stored and read atomically
	// tab maps a descriptor to its registration.
	tab atomic.Pointer[[]atomic.Pointer[epollEntry]]
}

// epollThread is one epoll loop thread: its epoll set.
type epollThread struct{ ep int }

func (*epollThread) loopThread() {}

// epollEntry is what an epoll event names: an endpoint or an upstream.
type epollEntry struct {
	fd int
	ep *Endpoint
	u  *epollUp
}

// epollClient is an endpoint socket's registration. ready and hup are
// guarded by the endpoint's Mu. hup is set once an event said the peer
// has shut its end down: from then on a short read does not mean the
// socket is drained, since the end of the stream is still to be read and
// no new edge will say so.
type epollClient struct {
	fdn   int
	set   int // the epoll set it is in
	ent   *epollEntry
	ready bool
	hup   bool
}

func (e *epollClient) fd() int  { return e.fdn }
func (e *epollClient) entered() { e.ready = true }

// epollUp is an upstream socket's registration. ready is set by events
// whoever owns the connection, and cleared by its owner; hup as for
// epollClient. fdn, ent, set and inSet are the owner's (the endpoint whose
// request is out on it, or the one that checked it out): whether the
// socket is in an epoll set now, and which (join, leave).
type epollUp struct {
	u     *Upstream
	ready atomic.Bool
	hup   atomic.Bool
	fdn   int
	ent   *epollEntry
	set   int
	inSet bool
}

// epollHangUp is the events that say the peer has shut its end down, or
// that the socket failed.
const epollHangUp = syscall.EPOLLRDHUP | syscall.EPOLLHUP | syscall.EPOLLERR

// startEpoll starts n loop threads on epoll.
func startEpoll(n int, log *slog.Logger) (_ *Loop, err error) {
	l, err := newLoop(IOEpoll, log)
	if err != nil {
		return nil, err
	}
	d, err := newEpollDriver(l, n, true)
	if err != nil {
		closeFds(l.stopR, l.stopW, l.wakeR, l.wakeW)
		return nil, err
	}
	l.drv, l.threads = d, len(d.threads)
	d.start()
	return l, nil
}

// newEpollDriver makes n epoll sets for loop l; wake says the first takes
// the ready list's wake-ups (on a loop of both drivers, io_uring's first
// thread takes them).
func newEpollDriver(l *Loop, n int, wake bool) (_ *epollDriver, err error) {
	d := &epollDriver{l: l}
	var fds []int
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
		if i == 0 && wake {
			// One thread is enough to take a wake-up: it runs the whole
			// ready list.
			ev = syscall.EpollEvent{Events: syscall.EPOLLIN | epollET, Fd: int32(l.wakeR)}
			if err := syscall.EpollCtl(ep, syscall.EPOLL_CTL_ADD, l.wakeR, &ev); err != nil {
				return nil, fmt.Errorf("epoll_ctl: %w", err)
			}
		}
		d.threads = append(d.threads, &epollThread{ep: ep})
	}
	tab := make([]atomic.Pointer[epollEntry], 1024)
	d.tab.Store(&tab)
	return d, nil
}

// start starts the driver's threads.
func (d *epollDriver) start() {
	for _, th := range d.threads {
		d.l.wg.Add(1)
		go d.run(th)
	}
}

// run is one loop thread.
func (d *epollDriver) run(th *epollThread) {
	l := d.l
	defer l.wg.Done()
	evs := make([]syscall.EpollEvent, 64)
	for {
		n, err := syscall.EpollWait(th.ep, evs, -1)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			l.log.Error("event loop thread stopped: its endpoints are no longer served", "io", "epoll", "error", err)
			return
		}
		l.running.Add(1)
		tab := *d.tab.Load()
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
				case e.ep != nil:
					d.clientReady(th, e.ep, evs[i].Events&epollHangUp != 0)
				default:
					d.upstreamReady(th, e.u, evs[i].Events&epollHangUp != 0)
				}
			}
			l.runReady(th)
		}
		l.settle(th)
	}
}

// clientReady runs when the endpoint's socket may be readable: it is
// marked ready whatever its state, and served when still wanted (a busy
// endpoint is read once its reply is written).
func (d *epollDriver) clientReady(th *epollThread, ep *Endpoint, hup bool) {
	ep.Mu.Lock()
	defer ep.Mu.Unlock()
	defer ep.h.Recover()
	if ec, ok := ep.reg.(*epollClient); ok {
		ec.ready, ec.hup = true, ec.hup || hup
		ep.ready(d, th)
	}
}

// upstreamReady runs when an upstream socket may be readable (th nil when
// the upstream's Close says so, off the loop threads).
func (d *epollDriver) upstreamReady(th Thread, eu *epollUp, hup bool) {
	if hup {
		eu.hup.Store(true)
	}
	u := eu.u
	ep := u.owner.Load()
	if ep == nil {
		eu.ready.Store(true)
		return
	}
	ep.Mu.Lock()
	defer ep.Mu.Unlock()
	defer ep.h.Recover()
	eu.ready.Store(true)
	if ep.wanted(d, u) {
		d.recvReply(th, ep)
	}
}

func (d *epollDriver) attachClient(ep *Endpoint, fd int) (registration, error) {
	ec := &epollClient{fdn: fd, ent: &epollEntry{fd: fd, ep: ep}}
	set, err := d.add(fd, ec.ent, -1)
	if err != nil {
		return nil, err
	}
	ec.set = set
	return ec, nil
}

// detachClient takes the endpoint's socket out of its epoll set and hands
// its descriptor over (adapt_linux.go). An event already taken for it finds
// the endpoint served by another driver, and is dropped (Endpoint.wanted).
func (d *epollDriver) detachClient(ep *Endpoint) (int, bool) {
	ec := ep.reg.(*epollClient)
	if ec.fdn < 0 {
		return -1, false
	}
	d.forget(ec.ent)
	_ = d.ctl(ec.set, syscall.EPOLL_CTL_DEL, ec.fdn, nil)
	fd := ec.fdn
	ec.fdn = -1
	return fd, true
}

func (d *epollDriver) attachUpstream(u *Upstream, fd int) error {
	eu := &epollUp{u: u, fdn: fd}
	eu.ent = &epollEntry{fd: fd, u: eu}
	eu.ready.Store(true)
	if !d.lazy {
		if err := d.join1(eu, -1); err != nil {
			return err
		}
	}
	u.epoll = eu
	return nil
}

// join puts u's socket in the epoll set of ep, the endpoint epoll serves
// whose request u carries; the owner's (u is checked out to ep).
//
// ep's set, not any: the reply then wakes the thread that took the
// request, and one thread serves the whole exchange. On another thread's
// set (where round-robin put it, or the last endpoint that used it left
// it), every reply woke a second thread: at one client both loop threads
// blocked in epoll_wait holding the runtime's Ps, so sysmon retook them
// and the scheduler parked and woke threads (futexes), and the two threads
// handed the endpoint's lock to each other; 1.5 context switches more per
// operation than HAProxy, whose backend connection lives on its
// frontend's thread (docs/performance.md, session 14). The move costs two
// epoll_ctl calls when the last user was on another thread; it happens
// only at the light loads epoll serves on a loop of both drivers (under
// load io_uring serves, and its placement packs clients instead).
//
// The epoll_ctl calls name the socket by its number, so they run inside
// the connection's Control, where it cannot be closed: the pool closes a
// connection in use when it is interrupted (CMAP), and by then the number
// may be a new client's socket, which a stale EPOLL_CTL_DEL would take out
// of its set and a stale EPOLL_CTL_ADD would hand to this entry (that
// client would wait for ever). A closed connection fails the request.
func (d *epollDriver) join(u *Upstream, ep *Endpoint) error {
	eu := u.epoll
	set := -1 // no socket of epoll's (a failed move left none): any set
	if ec, ok := ep.reg.(*epollClient); ok {
		set = ec.set
	}
	if eu.inSet && (set < 0 || eu.set == set) {
		return nil
	}
	var err error
	if cerr := u.rc.Control(func(uintptr) {
		d.leaveLocked(eu)
		err = d.join1(eu, set)
	}); cerr != nil {
		d.dropStale(eu)
		return cerr
	}
	return err
}

// join1 puts eu's socket in epoll set set (-1: the next thread's, round
// robin).
func (d *epollDriver) join1(eu *epollUp, set int) error {
	set, err := d.add(eu.fdn, eu.ent, set)
	if err != nil {
		return err
	}
	// Events that came while it was out of the set are lost: a read
	// finds out.
	eu.ready.Store(true)
	eu.set, eu.inSet = set, true
	return nil
}

// leave takes u's socket out of its epoll set, for a request of an
// endpoint io_uring serves: its reply must not wake an epoll thread. The
// owner's. As join, it names the socket only while the connection is open.
func (d *epollDriver) leave(u *Upstream) {
	eu := u.epoll
	if !eu.inSet {
		return
	}
	if cerr := u.rc.Control(func(uintptr) { d.leaveLocked(eu) }); cerr != nil {
		d.dropStale(eu)
	}
}

// leaveLocked is leave inside the connection's Control.
func (d *epollDriver) leaveLocked(eu *epollUp) {
	if eu.inSet {
		d.forget(eu.ent)
		_ = d.ctl(eu.set, syscall.EPOLL_CTL_DEL, eu.fdn, nil)
		eu.inSet = false
	}
}

// dropStale forgets a closed connection's registration without naming its
// number: the kernel drops the socket from the set once the last
// descriptor of it (io_uring's duplicate) is closed.
func (d *epollDriver) dropStale(eu *epollUp) {
	d.forget(eu.ent)
	eu.inSet = false
}

func (d *epollDriver) recvRequest(th Thread, ep *Endpoint) {
	ec := ep.reg.(*epollClient)
	if !ec.ready {
		return // the next event says when more has come
	}
	free := ep.Win.Free()
	room := len(free)
	n, err := readFd(ec.fdn, free)
	if err == syscall.EAGAIN {
		ec.ready = false
		return
	}
	// A read that filled the buffer may have left more in the socket, and
	// no new event would say so; nor would one for the end of a stream
	// already announced.
	ec.ready = err == nil && (n == room || ec.hup)
	ep.received(d, th, n, err)
}

func (d *epollDriver) recvReply(th Thread, ep *Endpoint) {
	u := ep.lp.up
	eu := u.epoll
	if !eu.ready.Load() {
		return
	}
	b := ep.lp.reply
	room := len(b)
	n, err := u.io.readVia(u.rc, b)
	if err == syscall.EAGAIN {
		eu.ready.Store(false)
		return
	}
	if err == nil && n < room && !eu.hup.Load() {
		eu.ready.Store(false)
	}
	ep.replied(d, th, u, n, "read", err)
}

// closeClient closes at once: epoll's receives are read calls, ended when
// they return, and its writes too (flush has nothing to wait for).
func (d *epollDriver) closeClient(ep *Endpoint, _ bool) {
	ec := ep.reg.(*epollClient)
	d.forget(ec.ent)
	// Closing the descriptor also takes it out of the epoll set.
	if ec.fdn >= 0 {
		_ = syscall.Close(ec.fdn)
		ec.fdn = -1
	}
}

// upstreamClosed: the close may have dropped the event that would have
// woken the loop, so a request in flight reads now, finds the socket
// closed and fails, on a goroutine of its own (Close may run under locks).
func (d *epollDriver) upstreamClosed(u *Upstream) {
	if u.owner.Load() != nil {
		go d.upstreamReady(nil, u.epoll, true)
	}
}

// awaitSends has nothing to wait for: epoll's sends are write calls, ended
// when they return (or the user's goroutine's, which the user waits for).
func (d *epollDriver) awaitSends(context.Context) error { return nil }

// stop closes the sets, once no ctl is under way; later ones do nothing.
func (d *epollDriver) stop() {
	d.setsMu.Lock()
	defer d.setsMu.Unlock()
	d.setsShut = true
	for _, th := range d.threads {
		_ = syscall.Close(th.ep)
	}
}

// ctl is epoll_ctl on set, one of the driver's sets, while it is open
// (setsMu); ErrStopped once stop closed it, which took every descriptor
// out of it.
func (d *epollDriver) ctl(set, op, fd int, ev *syscall.EpollEvent) error {
	d.setsMu.RLock()
	defer d.setsMu.RUnlock()
	if d.setsShut {
		return ErrStopped
	}
	return syscall.EpollCtl(set, op, fd, ev)
}

// add registers fd, edge-triggered, for e in epoll set set (-1: the next
// thread's, round robin), and returns the set it is in.
func (d *epollDriver) add(fd int, e *epollEntry, set int) (int, error) {
	d.tabMu.Lock()
	tab := *d.tab.Load()
	if fd >= len(tab) {
		bigger := make([]atomic.Pointer[epollEntry], max(2*len(tab), fd+1))
		for i := range tab {
			bigger[i].Store(tab[i].Load())
		}
		d.tab.Store(&bigger)
		tab = bigger
	}
	tab[fd].Store(e)
	d.tabMu.Unlock()
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP | epollET, Fd: int32(fd)}
	if set < 0 {
		// Round-robin over the threads' sets.
		set = d.threads[int(d.l.next.Add(1)-1)%len(d.threads)].ep
	}
	if err := d.ctl(set, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
		d.forget(e)
		return -1, fmt.Errorf("epoll_ctl: %w", err)
	}
	return set, nil
}

// forget drops e's registration from the table (its descriptor leaves the
// epoll set when it is closed). An event already taken for e's descriptor
// finds nothing, or the next registration of the same number, whose handler
// tolerates spurious readiness.
func (d *epollDriver) forget(e *epollEntry) {
	d.tabMu.Lock()
	tab := *d.tab.Load()
	if e.fd < len(tab) {
		tab[e.fd].CompareAndSwap(e, nil)
	}
	d.tabMu.Unlock()
}
