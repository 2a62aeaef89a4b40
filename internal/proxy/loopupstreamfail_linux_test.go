package proxy

// An upstream that breaks in the middle of a reply: the client gets an
// answer (the reply, or an error) and stays usable, on both drivers.

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/wait"
	"github.com/mongobouncer/mongobouncer/internal/uring"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// mangler is a relay in front of fakemongo that spoils the reply to a ping
// the way mode says, while mode is set.
type mangler struct {
	ln   net.Listener
	to   string
	mode atomic.Value // string
	wg   sync.WaitGroup
}

func startMangler(t testing.TB, to string) *mangler {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m := &mangler{ln: ln, to: to}
	m.mode.Store("")
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go m.serve(c)
		}
	}()
	return m
}

func (m *mangler) serve(c net.Conn) {
	s, err := net.Dial("tcp", m.to)
	if err != nil {
		c.Close()
		return
	}
	var mu sync.Mutex
	pending := map[int32]string{}
	go func() {
		defer s.Close()
		for {
			msg, err := wire.ReadMessage(c, nil, wire.DefaultMaxMessageSize)
			if err != nil {
				return
			}
			if bytes.Contains(msg, []byte("\x10ping\x00")) {
				if mode := m.mode.Load().(string); mode != "" {
					mu.Lock()
					pending[int32(binary.LittleEndian.Uint32(msg[4:]))] = mode
					mu.Unlock()
				}
			}
			if _, err := s.Write(msg); err != nil {
				return
			}
		}
	}()
	defer c.Close()
	for {
		rep, err := wire.ReadMessage(s, nil, wire.DefaultMaxMessageSize)
		if err != nil {
			return
		}
		to := int32(binary.LittleEndian.Uint32(rep[8:]))
		mu.Lock()
		mode, ok := pending[to]
		delete(pending, to)
		mu.Unlock()
		if !ok {
			if _, err := c.Write(rep); err != nil {
				return
			}
			continue
		}
		switch mode {
		case "half":
			c.Write(rep[:len(rep)/2])
			return
		case "halfrst":
			c.Write(rep[:len(rep)/2])
			time.Sleep(10 * time.Millisecond)
			c.(*net.TCPConn).SetLinger(0)
			return
		case "badlen":
			b := append([]byte(nil), rep[:16]...)
			binary.LittleEndian.PutUint32(b, 3)
			c.Write(b)
		case "huge":
			b := append([]byte(nil), rep[:16]...)
			binary.LittleEndian.PutUint32(b, 1<<30)
			c.Write(b)
		case "twice":
			c.Write(append(append([]byte(nil), rep...), rep...))
		case "trickle":
			for i := 0; i < len(rep); i += 1000 {
				c.Write(rep[i:min(i+1000, len(rep))])
				time.Sleep(200 * time.Microsecond)
			}
		case "hdr2":
			c.Write(rep[:2])
			time.Sleep(20 * time.Millisecond)
			c.Write(rep[2:])
		case "wrongto":
			b := append([]byte(nil), rep...)
			binary.LittleEndian.PutUint32(b[8:], 77777)
			c.Write(b)
		case "eof0":
			return
		}
	}
}

// newManglerRig is newLoopRig with a mangler between the pool and the fake
// upstream.
func newManglerRig(t *testing.T, io config.EventLoopIO, maxPool int, h fakemongo.Handler) (*loopRig, *mangler) {
	t.Helper()
	var m *mangler
	r := newRig(t, rigOptions{loop: true, io: io, maxPool: maxPool, via: func(t testing.TB, to string) string {
		m = startMangler(t, to)
		return m.ln.Addr().String()
	}}, h)
	return r, m
}

// bigReplyRig is a mangler rig whose upstream answers pings with a 100 KiB
// reply, and a client that has had one.
func bigReplyRig(t *testing.T, model config.EventLoopIO) (*loopRig, *mangler, *affConn, *client) {
	t.Helper()
	big := strings.Repeat("x", 100<<10)
	r, m := newManglerRig(t, model, 2, func(*fakemongo.Request) fakemongo.Reply {
		return fakemongo.OK(bson.E{Key: "big", Value: big})
	})
	cl := r.client(0)
	c := r.only()
	affOK(t, cl.cmd(ping()))
	return r, m, cl, c
}

// waitPoolReady waits until the pool, cleared by a broken connection, is
// ready again.
func (r *loopRig) waitPoolReady() {
	r.t.Helper()
	wait.Until(r.t, "pool ready again", 10*time.Second, 5*time.Millisecond, func() bool {
		return r.route.Topology.Servers()[0].Pool().Stats().State == pool.StateReady
	})
}

// The upstream sends part of a large reply and closes (FIN and data often
// in one epoll edge: the case that hung on epoll), resets, sends a bad or
// huge length, a reply to another request, or closes at once, or sends a
// reply in pieces: each request gets an answer within the
// deadline, and the client is served afterwards.
func TestLoopUpstreamBreaksMidReply(t *testing.T) {
	eachDriver(t, func(t *testing.T, model config.EventLoopIO) {
		r, m, cl, c := bigReplyRig(t, model)
		for _, mode := range []string{"half", "half", "half", "half", "half", "half", "halfrst", "badlen", "huge", "eof0", "trickle", "hdr2", "wrongto"} {
			r.waitState(c, lsIdle)
			m.mode.Store(mode)
			cl.id++
			if _, err := cl.c.Write(wire.AppendMsg(nil, cl.id, 0, 0, mustDoc(t, ping()))); err != nil {
				t.Fatal(err)
			}
			_ = cl.c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := wire.ReadMessage(cl.c, nil, wire.DefaultMaxMessageSize); err != nil {
				t.Fatalf("%s: no answer: %v", mode, err)
			}
			m.mode.Store("")
			r.waitPoolReady()
		}
		affOK(t, cl.cmd(ping()))
	})
}

// An upstream that sends a large reply twice: the request gets an answer,
// and the second copy reaches no later request (the connection is not
// reused with it unread).
func TestLoopUpstreamRepliesTwice(t *testing.T) {
	eachDriver(t, func(t *testing.T, model config.EventLoopIO) {
		r, m, cl, c := bigReplyRig(t, model)
		for range 3 {
			r.waitState(c, lsIdle)
			m.mode.Store("twice")
			cl.cmd(ping()) // the reply, or an error
			m.mode.Store("")
			r.waitPoolReady()
			for range 3 {
				affOK(t, cl.cmd(ping()))
			}
		}
	})
}

// closingDialer remembers each pool connection by ID.
type closingDialer struct {
	d     pool.Connector
	mu    sync.Mutex
	conns map[int64]pool.Upstream
}

func (c *closingDialer) Connect(ctx context.Context, addr string, id int64) (pool.Upstream, error) {
	u, err := c.d.Connect(ctx, addr, id)
	if err == nil {
		c.mu.Lock()
		c.conns[id] = u
		c.mu.Unlock()
	}
	return u, err
}

// A pool interrupt (Clear(true): its Close of an in-use connection runs on a
// goroutine of its own) that lands between the loop's checkout of a fresh
// connection and loopUpFor's Control: that request goes to a goroutine,
// and the route stays on the event loop.
func TestLoopConnectionClosedAtCheckoutKeepsTheRouteOnTheLoop(t *testing.T) {
	eachDriver(t, func(t *testing.T, io config.EventLoopIO) {
		cd := &closingDialer{conns: map[int64]pool.Upstream{}}
		var closeNext atomic.Bool
		r := newRig(t, rigOptions{loop: true, io: io, maxPool: 2,
			dialer: func(d pool.Connector) pool.Connector { cd.d = d; return cd },
			monitor: pool.MonitorFunc(func(e pool.Event) {
				if e.Type == pool.ConnectionCheckedOut && closeNext.CompareAndSwap(true, false) {
					cd.mu.Lock()
					u := cd.conns[e.ConnectionID]
					cd.mu.Unlock()
					_ = u.Close() // what the interrupt's goroutine does, at this instant
				}
			}),
		}, func(*fakemongo.Request) fakemongo.Reply { return fakemongo.OK() })
		route := r.route
		cl := r.client(0)
		c := r.only()
		r.waitState(c, lsIdle)
		closeNext.Store(true)
		cl.cmd(ping()) // an error, or the reply from a new connection
		r.waitPoolReady()
		for range 5 {
			cl.cmd(ping())
		}
		if route.NoLoop() {
			t.Fatalf("one connection closed by the pool at checkout took route %q off the event loop for good", route.Name)
		}
	})
}

// closeBeforeAttach is a connection whose Close runs (as the pool's
// interrupt goroutine may) after loopUpFor's Control dup'd its socket and
// before SetAttachment: Close finds no attachment to tell.
type closeBeforeAttach struct {
	pool.Upstream
}

func (u closeBeforeAttach) SetAttachment(v any) {
	_ = u.Upstream.Close()
	u.Upstream.SetAttachment(v)
}

// The same interrupt landing between loopUpFor's Control and its
// SetAttachment: Close finds no attachment to tell, yet the io_uring
// driver's duplicate descriptor is closed with the connection.
func TestLoopConnectionClosedWhileRegistering(t *testing.T) {
	if !uring.Supported() {
		t.Skip("the kernel refuses io_uring here")
	}
	r := newLoopRig(t, LoopIOUring, 2, func(*fakemongo.Request) fakemongo.Reply { return fakemongo.OK() })
	p := r.route.Topology.Servers()[0].Pool()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pc, err := p.CheckOut(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lu, _ := r.s.loopUpFor(closeBeforeAttach{pc.Upstream()})
	if lu == nil {
		t.Fatal("no registration")
	}
	pc.MarkErrored(net.ErrClosed)
	_ = p.CheckIn(pc)
	fd, closed := lu.OwnFd()
	if fd >= 0 {
		_, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_GETFD, 0)
		t.Fatalf("connection closed, its loop descriptor %d still open (fcntl errno %v), ringUp.closed=%v: leaked", fd, errno, closed)
	}
}
