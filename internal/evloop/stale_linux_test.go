package evloop

// Descriptor numbers outlive what they named: once a socket is closed its
// number goes to the next socket opened, often at once (the lowest free
// number). The loop must never act on a number whose socket may be closed:
// the wake-up pipe while Stop races a Post, an upstream's socket after the
// pool closed the connection under its user (an interrupted checkout).

import (
	"errors"
	"log/slog"
	"net"
	"slices"
	"syscall"
	"testing"
	"time"
)

// reuseNumber calls open, which opens descriptors, until one of them has
// number n, and returns what that call opened; it closes the rest.
func reuseNumber(t *testing.T, n int, open func() ([]int, error)) []int {
	t.Helper()
	var spare []int
	defer func() { closeFds(spare...) }()
	for range 64 {
		fds, err := open()
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(fds, n) {
			return fds
		}
		spare = append(spare, fds...)
	}
	t.Fatalf("descriptor %d was not reused", n)
	return nil
}

// takeNumber opens socket pairs until one end has descriptor number n, and
// returns that end and its peer.
func takeNumber(t *testing.T, n int) (int, int) {
	t.Helper()
	fds := reuseNumber(t, n, func() ([]int, error) {
		p, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC|syscall.SOCK_NONBLOCK, 0)
		return p[:], err
	})
	if fds[0] == n {
		return fds[0], fds[1]
	}
	return fds[1], fds[0]
}

// A Post that races Stop never writes to the wake-up pipe's number after
// Stop closed it: once the pipe is closed, Post reports the loop stopped
// and writes nothing, whatever socket has the number by then.
func TestPostNeverWritesAClosedWakePipe(t *testing.T) {
	for _, model := range []string{IOEpoll, IOUring, IOAdaptive} {
		t.Run(model, func(t *testing.T) {
			if model != IOEpoll && !RingSupported() {
				t.Skip("the kernel refuses io_uring here")
			}
			l, err := Start(Options{IO: model, Threads: 2, Log: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			wakeW := l.wakeW
			ran := false
			testHookPipesClosed = func() {
				ran = true
				fd, peer := takeNumber(t, wakeW)
				defer syscall.Close(fd)
				defer syscall.Close(peer)
				l.wakePending.Store(false) // a Post would wake a thread, if it could
				if l.Post(&Endpoint{}, nil, nil) {
					t.Error("Post after the pipes closed queued a result")
				}
				var b [8]byte
				if n, _ := syscall.Read(peer, b[:]); n > 0 {
					t.Errorf("Post wrote %d bytes to the socket that took the wake-up pipe's number", n)
				}
			}
			defer func() { testHookPipesClosed = nil }()
			l.Stop()
			if !ran {
				t.Fatal("Stop did not close the pipes")
			}
		})
	}
}

// An upstream connection closed while checked out (the pool interrupts
// connections in use): its next request fails, and the epoll driver does
// not touch the number its socket had, now a new client's, which stays in
// its own set with its own registration.
func TestAdaptiveLoopLeavesAClosedUpstreamsNumberAlone(t *testing.T) {
	r := newEngineRig(t, IOAdaptive)
	a := r.l.adapt
	d := a.lite
	if len(d.threads) < 2 {
		t.Fatalf("%d epoll threads, want 2", len(d.threads))
	}
	r.serveUpstream(t, 1)
	_ = r.client.SetDeadline(time.Now().Add(10 * time.Second))
	a.onHeavy.Store(false)
	if _, err := r.client.Write([]byte("abcd")); err != nil {
		t.Fatal(err)
	}
	expectReply(t, r.client, reverse("abcd"))

	r.h.ep.Mu.Lock()
	defer r.h.ep.Mu.Unlock()
	eu := r.h.u.epoll
	if !eu.inSet {
		t.Fatal("the upstream is in no epoll set after a request on epoll")
	}
	n, set := eu.fdn, eu.set
	other := d.threads[0].ep
	if other == set {
		other = d.threads[1].ep
	}
	// The pool closes the connection, as an interrupted checkout's, and
	// a new client's socket takes its number, in the set the upstream
	// was in.
	if err := r.up.Close(); err != nil {
		t.Fatal(err)
	}
	r.h.u.UpstreamClosed()
	fd, peer := takeNumber(t, n)
	defer syscall.Close(peer)
	defer syscall.Close(fd)
	ent := &epollEntry{fd: fd, ep: &Endpoint{}}
	if _, err := d.add(fd, ent, set); err != nil {
		t.Fatal(err)
	}
	defer func() {
		d.forget(ent)
		_ = syscall.EpollCtl(set, syscall.EPOLL_CTL_DEL, fd, nil)
	}()

	// The next request on the closed connection comes from an endpoint
	// on the other thread: the upstream would move to its set.
	user := &Endpoint{reg: &epollClient{fdn: -1, set: other}}
	if err := d.join(r.h.u, user); !errors.Is(err, net.ErrClosed) {
		t.Errorf("join of a closed upstream: %v, want net.ErrClosed", err)
	}
	d.leave(r.h.u)
	if got := (*d.tab.Load())[fd].Load(); got != ent {
		t.Errorf("the new client's number names %+v, want its own registration", got)
	}
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP | epollET, Fd: int32(fd)}
	if err := syscall.EpollCtl(set, syscall.EPOLL_CTL_MOD, fd, &ev); err != nil {
		t.Errorf("the new client's socket left its epoll set: %v", err)
	}
	if err := syscall.EpollCtl(other, syscall.EPOLL_CTL_MOD, fd, &ev); err != syscall.ENOENT {
		t.Errorf("the new client's socket is in the other thread's set too (%v)", err)
	}
}

// The io_uring threads stop one by one: another thread, an epoll thread or
// the sweeper may still post to one that has torn down and closed its
// eventfd (a client whose home it was, closed with its receive armed). The
// post writes nothing to whatever socket took the eventfd's number.
func TestRingPostNeverWritesAClosedEventfd(t *testing.T) {
	if !RingSupported() {
		t.Skip("the kernel refuses io_uring here")
	}
	l, err := Start(Options{IO: IOUring, Threads: 2, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	th := l.ringDrv().threads[1]
	ev := th.ev
	l.Stop()
	fd, peer := takeNumber(t, ev)
	defer syscall.Close(fd)
	defer syscall.Close(peer)
	th.evPending.Store(false) // a post would wake the thread, if it could
	th.post(&ringClient{ep: &Endpoint{}}, armClose)
	var b [16]byte
	if n, _ := syscall.Read(peer, b[:]); n > 0 {
		t.Errorf("a post wrote %d bytes to the socket that took the eventfd's number", n)
	}
}

// takeEpollNumber makes epoll sets until one has descriptor number n, and
// returns it.
func takeEpollNumber(t *testing.T, n int) int {
	t.Helper()
	return reuseNumber(t, n, func() ([]int, error) {
		ep, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
		return []int{ep}, err
	})[0]
}

// Stop does not wait for the goroutines that act on endpoints off the loop
// threads (one failing a request whose connection the pool closed goes on
// to the client's next request, which may move the client to epoll or put
// an upstream in an epoll set): once the sets are closed, the driver names
// none of their numbers, which may be another loop's sets by then.
func TestStoppedEpollDriverLeavesReusedSetNumbersAlone(t *testing.T) {
	for _, model := range []string{IOEpoll, IOAdaptive} {
		t.Run(model, func(t *testing.T) {
			if model != IOEpoll && !RingSupported() {
				t.Skip("the kernel refuses io_uring here")
			}
			l, err := Start(Options{IO: model, Threads: 1, Log: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			d := l.epollDrv()
			set := d.threads[0].ep
			l.Stop()
			other := takeEpollNumber(t, set)
			defer syscall.Close(other)
			fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC|syscall.SOCK_NONBLOCK, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer closeFds(fds[:]...)
			fd := fds[0]
			if _, err := d.attachClient(&Endpoint{}, fd); !errors.Is(err, ErrStopped) {
				t.Errorf("attach on a stopped driver: %v, want ErrStopped", err)
			}
			ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(fd)}
			if err := syscall.EpollCtl(other, syscall.EPOLL_CTL_MOD, fd, &ev); err != syscall.ENOENT {
				t.Errorf("the socket went into the set that took the stopped set's number (%v)", err)
			}
		})
	}
}
