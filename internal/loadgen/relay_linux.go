package loadgen

import (
	"encoding/binary"
	"errors"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/mongobouncer/mongobouncer/internal/sysconn"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// epollLoops are the event loops of a RelayEpoll, one per P: each owns an
// epoll instance and the connection pairs given to it, and relays whole
// messages with raw read and write system calls, so that no goroutine is
// parked or woken per message.
type epollLoops struct {
	loops []*epollLoop
	next  atomic.Uint32
	wg    sync.WaitGroup
}

// epollLoop is one event loop.
type epollLoop struct {
	ep        int
	wakeRead  int // read end of a pipe in the epoll set; stop closes the write end
	wakeWrite int

	// mu guards ends and stopped. The loop holds it while it handles a
	// batch of events; add takes it to register a pair.
	mu      sync.Mutex
	ends    map[int32]*relayEnd
	stopped bool
}

// relayEnd is one side of a relayed pair: what arrived on fd and has not
// yet been passed to peer.
type relayEnd struct {
	fd   int
	peer *relayEnd
	buf  []byte
	n    int
}

func startEpollLoops() (*epollLoops, error) {
	ls := &epollLoops{}
	for range runtime.GOMAXPROCS(0) {
		l, err := newEpollLoop()
		if err != nil {
			ls.stop()
			return nil, err
		}
		ls.loops = append(ls.loops, l)
		ls.wg.Add(1)
		go func() {
			defer ls.wg.Done()
			l.run()
		}()
	}
	return ls, nil
}

func newEpollLoop() (*epollLoop, error) {
	ep, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC|syscall.O_NONBLOCK); err != nil {
		_ = syscall.Close(ep)
		return nil, err
	}
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(p[0])}
	if err := syscall.EpollCtl(ep, syscall.EPOLL_CTL_ADD, p[0], &ev); err != nil {
		_ = syscall.Close(ep)
		_ = syscall.Close(p[0])
		_ = syscall.Close(p[1])
		return nil, err
	}
	return &epollLoop{ep: ep, wakeRead: p[0], wakeWrite: p[1], ends: make(map[int32]*relayEnd)}, nil
}

// add takes the client connection c and its upstream u away from Go's
// netpoller (their descriptors are duplicated and the net.Conns closed)
// and gives the pair to the next loop.
func (ls *epollLoops) add(c, u net.Conn) error {
	cfd, ufd, err := detachPair(c, u)
	if err != nil {
		return err
	}
	a := &relayEnd{fd: cfd, buf: make([]byte, MaxRelayMessage)}
	b := &relayEnd{fd: ufd, buf: make([]byte, MaxRelayMessage)}
	a.peer, b.peer = b, a
	l := ls.loops[int(ls.next.Add(1))%len(ls.loops)]
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		_ = syscall.Close(cfd)
		_ = syscall.Close(ufd)
		return errors.New("loadgen: relay closed")
	}
	for _, e := range []*relayEnd{a, b} {
		l.ends[int32(e.fd)] = e
		ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP, Fd: int32(e.fd)}
		if err := syscall.EpollCtl(l.ep, syscall.EPOLL_CTL_ADD, e.fd, &ev); err != nil {
			l.closePairLocked(a)
			return err
		}
	}
	return nil
}

// detachPair detaches a client connection and its upstream; on failure
// both are closed.
func detachPair(c, u net.Conn) (cfd, ufd int, err error) {
	cfd, err = detach(c)
	if err != nil {
		_ = u.Close()
		return -1, -1, err
	}
	ufd, err = detach(u)
	if err != nil {
		_ = syscall.Close(cfd)
		return -1, -1, err
	}
	return cfd, ufd, nil
}

// detach returns a duplicate of conn's descriptor (non-blocking, as Go
// made it) and closes conn, which removes it from Go's netpoller.
func detach(conn net.Conn) (int, error) {
	fd, err := sysconn.Dup(conn)
	_ = conn.Close()
	return fd, err
}

// stop ends every loop, closing its connections, and waits for them.
func (ls *epollLoops) stop() {
	for _, l := range ls.loops {
		l.mu.Lock()
		l.stopped = true
		l.mu.Unlock()
		_ = syscall.Close(l.wakeWrite) // wakes the loop: its read end hangs up
	}
	ls.wg.Wait()
}

func (l *epollLoop) run() {
	evs := make([]syscall.EpollEvent, 128)
	for {
		n, err := syscall.EpollWait(l.ep, evs, -1)
		if err == syscall.EINTR {
			continue
		}
		l.mu.Lock()
		if err != nil || l.stopped {
			for _, e := range l.ends {
				_ = syscall.Close(e.fd)
			}
			clear(l.ends)
			l.mu.Unlock()
			_ = syscall.Close(l.ep)
			_ = syscall.Close(l.wakeRead)
			return
		}
		for i := range evs[:n] {
			if e := l.ends[evs[i].Fd]; e != nil {
				l.readableLocked(e)
			}
		}
		l.mu.Unlock()
	}
}

// readableLocked reads what e's descriptor has and passes every whole
// message to the peer. The epoll set is level-triggered, so a read that
// leaves bytes in the socket is simply called again.
func (l *epollLoop) readableLocked(e *relayEnd) {
	m, err := syscall.Read(e.fd, e.buf[e.n:])
	switch {
	case err == syscall.EAGAIN || err == syscall.EINTR:
		return
	case err != nil || m <= 0: // error or end of stream
		l.closePairLocked(e)
		return
	}
	e.n += m
	for e.n >= 4 {
		size := int(int32(binary.LittleEndian.Uint32(e.buf)))
		if size < wire.HeaderLen || size > MaxRelayMessage {
			l.closePairLocked(e)
			return
		}
		if e.n < size {
			return
		}
		if err := writeAll(e.peer.fd, e.buf[:size]); err != nil {
			// Including EAGAIN: a reference relay for small messages does
			// not queue output; that client is closed.
			l.closePairLocked(e)
			return
		}
		e.n = copy(e.buf, e.buf[size:e.n])
	}
}

func writeAll(fd int, b []byte) error {
	for len(b) > 0 {
		m, err := syscall.Write(fd, b)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		b = b[m:]
	}
	return nil
}

func (l *epollLoop) closePairLocked(e *relayEnd) {
	for _, x := range []*relayEnd{e, e.peer} {
		if l.ends[int32(x.fd)] != x {
			continue
		}
		_ = syscall.EpollCtl(l.ep, syscall.EPOLL_CTL_DEL, x.fd, nil)
		_ = syscall.Close(x.fd)
		delete(l.ends, int32(x.fd))
	}
}
