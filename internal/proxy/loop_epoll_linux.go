package proxy

// The epoll driver of the event loop: threads, each with an edge-triggered
// epoll set of its own, and non-blocking read and write calls.
//
// One set per thread rather than one shared set: a descriptor's events go
// to its own thread, which takes them at its next epoll_wait while it is
// busy, instead of waking another thread (a context switch, and the
// socket's cache lines moved to another core) for each of them. Any thread
// may still act on any client: everything is under the client's ownMu.
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
	l   *loops
	eps []int // one epoll set per thread

	tabMu sync.Mutex // guards growth of tab; entries are stored and read atomically
	// tab maps a descriptor to its registration.
	tab atomic.Pointer[[]atomic.Pointer[epollEntry]]
}

// epollEntry is what an epoll event names: a client or an upstream.
type epollEntry struct {
	fd int
	c  *client
	u  *epollUp
}

// epollClient is a client socket's registration. ready and hup are
// guarded by the client's ownMu. hup is set once an event said the peer
// has shut its end down: from then on a short read does not mean the
// socket is drained, since the end of the stream is still to be read and
// no new edge will say so.
type epollClient struct {
	fdn   int
	ent   *epollEntry
	ready bool
	hup   bool
}

func (e *epollClient) fd() int  { return e.fdn }
func (e *epollClient) entered() { e.ready = true }

// epollUp is an upstream socket's registration. ready is set by events
// whoever owns the connection, and cleared by its owner; hup as for
// epollClient.
type epollUp struct {
	lu    *loopUp
	ready atomic.Bool
	hup   atomic.Bool
}

// epollHangUp is the events that say the peer has shut its end down, or
// that the socket failed.
const epollHangUp = syscall.EPOLLRDHUP | syscall.EPOLLHUP | syscall.EPOLLERR

// startEpoll starts n loop threads on epoll.
func startEpoll(n int, log *slog.Logger) (_ *loops, err error) {
	l, err := newLoops(log)
	if err != nil {
		return nil, err
	}
	d := &epollDriver{l: l}
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
			// One thread is enough to take a wake-up: it runs the whole
			// ready list.
			ev = syscall.EpollEvent{Events: syscall.EPOLLIN | epollET, Fd: int32(l.wakeR)}
			if err := syscall.EpollCtl(ep, syscall.EPOLL_CTL_ADD, l.wakeR, &ev); err != nil {
				return nil, fmt.Errorf("epoll_ctl: %w", err)
			}
		}
		d.eps = append(d.eps, ep)
	}
	l.drv, l.threads = d, len(d.eps)
	tab := make([]atomic.Pointer[epollEntry], 1024)
	d.tab.Store(&tab)
	for _, ep := range d.eps {
		l.wg.Add(1)
		go d.run(ep)
	}
	return l, nil
}

// run is one loop thread.
func (d *epollDriver) run(ep int) {
	l := d.l
	defer l.wg.Done()
	evs := make([]syscall.EpollEvent, 64)
	for {
		n, err := syscall.EpollWait(ep, evs, -1)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			l.log.Error("event loop thread stopped: its clients are no longer served", "io", "epoll", "error", err)
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
				case e.c != nil:
					d.clientReady(e.c, evs[i].Events&epollHangUp != 0)
				default:
					d.upstreamReady(e.u, evs[i].Events&epollHangUp != 0)
				}
			}
			l.runReady(nil)
		}
		l.settle(nil)
	}
}

// clientReady runs when the client's socket may be readable.
func (d *epollDriver) clientReady(c *client, hup bool) {
	lc := &c.lc
	lc.ownMu.Lock()
	defer lc.ownMu.Unlock()
	defer c.recoverOwned()
	switch lc.state {
	case lsClosed, lsGoroutine:
	case lsIdle:
		ec := lc.sock.(*epollClient)
		ec.ready, ec.hup = true, ec.hup || hup
		c.loopServe(nil)
	default:
		// Read once the reply is written (loopAfter).
		ec := lc.sock.(*epollClient)
		ec.ready, ec.hup = true, ec.hup || hup
	}
}

// upstreamReady runs when an upstream socket may be readable.
func (d *epollDriver) upstreamReady(eu *epollUp, hup bool) {
	if hup {
		eu.hup.Store(true)
	}
	lu := eu.lu
	c := lu.owner.Load()
	if c == nil {
		eu.ready.Store(true)
		return
	}
	lc := &c.lc
	lc.ownMu.Lock()
	defer lc.ownMu.Unlock()
	defer c.recoverOwned()
	eu.ready.Store(true)
	if lc.state == lsUpstream && lc.up == lu {
		d.recvReply(nil, c)
	}
}

func (d *epollDriver) attachClient(c *client, fd int) (loopSock, error) {
	ec := &epollClient{fdn: fd, ent: &epollEntry{fd: fd, c: c}}
	if err := d.add(fd, ec.ent); err != nil {
		return nil, err
	}
	return ec, nil
}

func (d *epollDriver) attachUpstream(lu *loopUp, fd int) (any, error) {
	eu := &epollUp{lu: lu}
	eu.ready.Store(true)
	if err := d.add(fd, &epollEntry{fd: fd, u: eu}); err != nil {
		return nil, err
	}
	return eu, nil
}

func (d *epollDriver) recvClient(th loopThread, c *client) {
	ec := c.lc.sock.(*epollClient)
	if !ec.ready {
		return // the next event says when more has come
	}
	room := len(c.rbuf) - c.rhi
	n, err := readFd(ec.fdn, c.rbuf[c.rhi:])
	if err == syscall.EAGAIN {
		ec.ready = false
		return
	}
	// A read that filled the buffer may have left more in the socket, and
	// no new event would say so; nor would one for the end of a stream
	// already announced.
	ec.ready = err == nil && (n == room || ec.hup)
	c.clientReceived(th, n, err)
}

func (d *epollDriver) recvReply(th loopThread, c *client) {
	lu := c.lc.up
	eu := lu.sock.(*epollUp)
	if !eu.ready.Load() {
		return
	}
	b := c.lc.buf.b
	room := cap(b) - len(b)
	n, err := lu.io.read(lu.rc, b[len(b):cap(b)])
	if err == syscall.EAGAIN {
		eu.ready.Store(false)
		return
	}
	if err == nil && n < room && !eu.hup.Load() {
		eu.ready.Store(false)
	}
	c.replyReceived(th, n, err)
}

func (d *epollDriver) sendClient(c *client, b []byte) (int, error) {
	return writeFd(c.lc.sock.fd(), b)
}

// sendReply: epoll has no way to send and wait in one call.
func (d *epollDriver) sendReply(loopThread, *client, []byte) bool { return false }

// sendRequest: epoll has no way to send and wait in one call.
func (d *epollDriver) sendRequest(loopThread, *client, []byte) bool { return false }

func (d *epollDriver) sendUpstream(lu *loopUp, b []byte) (int, error) {
	return lu.io.write(lu.rc, b)
}

func (d *epollDriver) closeClient(c *client) {
	lc := &c.lc
	ec := lc.sock.(*epollClient)
	d.forget(ec.ent)
	// Closing the descriptor also takes it out of the epoll set.
	if ec.fdn >= 0 {
		_ = syscall.Close(ec.fdn)
		ec.fdn = -1
	}
	lc.sock = nil
}

// upstreamClosed: the close may have dropped the event that would have
// woken the loop, so a request in flight reads now, finds the socket
// closed and fails, on a goroutine of its own (Close may run under locks).
func (d *epollDriver) upstreamClosed(lu *loopUp) {
	if lu.owner.Load() != nil {
		go d.upstreamReady(lu.sock.(*epollUp), true)
	}
}

// awaitSends has nothing to wait for: epoll's sends are write calls, ended
// when they return, or a goroutine's, which Server.Close waits for.
func (d *epollDriver) awaitSends(context.Context) error { return nil }

func (d *epollDriver) stop() { closeFds(d.eps...) }

// add registers fd, edge-triggered, for e.
func (d *epollDriver) add(fd int, e *epollEntry) error {
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
	// Round-robin over the threads' sets.
	ep := d.eps[int(d.l.next.Add(1)-1)%len(d.eps)]
	if err := syscall.EpollCtl(ep, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
		d.forget(e)
		return fmt.Errorf("epoll_ctl: %w", err)
	}
	return nil
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
