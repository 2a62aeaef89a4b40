package proxy

// The loop path's states from request to reply, its failure exits, and
// BenchmarkLoopRequest.

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/routing"
	"github.com/mongobouncer/mongobouncer/internal/session"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/wait"
	"github.com/mongobouncer/mongobouncer/internal/topology"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
	"github.com/mongobouncer/mongobouncer/internal/uring"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// The event loop's states, driven through each driver: clients are one
// end of a socketpair handed to the Server, upstreams a scripted fake.

// loopRig is a Server with the event loop on one driver, in front of a
// fake upstream whose handler the test scripts.
type loopRig struct {
	t     testing.TB
	s     *Server
	route *routing.Route
	up    *fakemongo.Server
}

func newLoopRig(t testing.TB, io config.EventLoopIO, maxPool int, h fakemongo.Handler) *loopRig {
	t.Helper()
	return newRig(t, rigOptions{loop: true, io: io, maxPool: maxPool}, h)
}

// rigOptions are a rig's I/O model (loop false: a goroutine per client),
// pool size and pool monitor.
type rigOptions struct {
	loop    bool
	io      config.EventLoopIO
	maxPool int
	monitor pool.Monitor
	// answerMoreToCome makes the fake upstream answer moreToCome
	// requests, as FerretDB does.
	answerMoreToCome bool
	// spin is Options.LoopSpin.
	spin time.Duration
	// via, when set, gives the address the pool and the monitor dial in
	// place of the fake upstream's (a relay in front of it).
	via func(t testing.TB, upstream string) string
	// dialer, when set, wraps the pool's dialer.
	dialer func(pool.Connector) pool.Connector
	// threads is Options.LoopThreads, 2 when 0; observer is Options.Observer.
	threads  int
	observer Observer
	// log, when set, is the server's logger (discarded otherwise); admin
	// is Options.Admin.
	log   *slog.Logger
	admin AdminHandler
}

func newRig(t testing.TB, o rigOptions, h fakemongo.Handler) *loopRig {
	t.Helper()
	io, maxPool := o.io, o.maxPool
	up := fakemongo.Start(t, fakemongo.Options{AnswerMoreToCome: o.answerMoreToCome})
	up.Handle("ping", h)
	log := slog.New(slog.DiscardHandler)
	po := pool.DefaultOptions()
	po.MaxPoolSize = maxPool
	po.Monitor = o.monitor
	addr := up.Addr()
	if o.via != nil {
		addr = o.via(t, addr)
	}
	var dialer pool.Connector = upstream.NewDialer(upstream.Options{ConnectTimeout: 2 * time.Second, Detach: true, Logger: log})
	if o.dialer != nil {
		dialer = o.dialer(dialer)
	}
	topo, err := topology.New("loop-test", topology.Options{
		Hosts:                  []string{addr},
		Pool:                   po,
		Dialer:                 dialer,
		MonitorDialer:          upstream.NewDialer(upstream.Options{ConnectTimeout: 2 * time.Second, Logger: log}),
		HeartbeatInterval:      500 * time.Millisecond,
		ServerSelectionTimeout: 5 * time.Second,
		Logger:                 log,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(topo.Close)
	route := &routing.Route{Name: "*", Mode: ModeTransaction, Topology: topo}
	threads := 2
	if o.threads > 0 {
		threads = o.threads
	}
	srvLog := log
	if o.log != nil {
		srvLog = o.log
	}
	s, err := New(Options{Routes: []*routing.Route{route}, EventLoop: o.loop, LoopThreads: threads, LoopIO: io, LoopSpin: o.spin, Logger: srvLog, Observer: o.observer, Admin: o.admin})
	if err != nil {
		t.Fatal(err)
	}
	if io == LoopIOUring {
		// New started the loop, and on io_uring: an io_uring subtest never
		// runs on epoll.
		if l := s.loopsPtr.Load(); l == nil || loopDriverName(l) != string(LoopIOUring) {
			t.Fatal("LoopIOUring, and the loop is not on io_uring")
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	wait.Until(t, "upstream usable", 10*time.Second, 5*time.Millisecond, func() bool {
		return topo.Servers()[0].State() == topology.Usable
	})
	return &loopRig{t: t, s: s, route: route, up: up}
}

// client connects a socketpair client; sndbuf, when positive, shrinks the
// proxy side's send buffer. It returns the test's end, after the hello.
func (r *loopRig) client(sndbuf int) *affConn {
	r.t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		r.t.Fatal(err)
	}
	if sndbuf > 0 {
		_ = syscall.SetsockoptInt(fds[1], syscall.SOL_SOCKET, syscall.SO_SNDBUF, sndbuf)
	}
	return r.serve(fileNetConn(r.t, fds[0]), fileNetConn(r.t, fds[1]), "socketpair")
}

// tcpClient is client over loopback TCP, the proxy side's send buffer and
// the test side's receive buffer shrunk to buf (tcpClientBufs).
func (r *loopRig) tcpClient(buf int) *affConn { return r.tcpClientBufs(buf, buf) }

// serve hands theirs to the proxy and returns ours, after the hello.
func (r *loopRig) serve(ours, theirs net.Conn, listener string) *affConn {
	r.t.Helper()
	r.s.accept(theirs, "", listener)
	r.t.Cleanup(func() { ours.Close() })
	cl := &affConn{t: r.t, c: ours}
	affOK(r.t, cl.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}}))
	return cl
}

func fileNetConn(t testing.TB, fd int) net.Conn {
	t.Helper()
	f := os.NewFile(uintptr(fd), "socketpair")
	defer f.Close()
	nc, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	return nc
}

// only returns the one connected client.
func (r *loopRig) only() *client {
	cs := r.s.snapshot()
	if len(cs) != 1 {
		r.t.Fatalf("%d clients, want 1", len(cs))
	}
	return cs[0]
}

// waitState waits until client c is in loop state want.
func (r *loopRig) waitState(c *client, want loopState) {
	r.t.Helper()
	wait.Until(r.t, "loop state", 10*time.Second, time.Millisecond, func() bool {
		c.lc.Mu.Lock()
		defer c.lc.Mu.Unlock()
		return c.lc.State == want
	})
}

// inUse is the pool's checked-out connection count.
func (r *loopRig) inUse() int {
	return int(r.route.Topology.Servers()[0].Pool().Stats().InUse)
}

func ping() bson.D { return bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "test"}} }

// eachDriver runs f on epoll and, where the kernel allows it, io_uring
// (LoopIOUring, which fails rather than fall back to epoll).
func eachDriver(t *testing.T, f func(t *testing.T, io config.EventLoopIO)) {
	t.Run("epoll", func(t *testing.T) { f(t, LoopIOEpoll) })
	t.Run("io_uring", func(t *testing.T) {
		if !uring.Supported() {
			t.Skip("the kernel refuses io_uring here")
		}
		f(t, LoopIOUring)
	})
	// auto: both drivers, the clients moving between them with the load
	// (evloop/adapt_linux.go).
	t.Run("adaptive", func(t *testing.T) {
		if !uring.Supported() {
			t.Skip("the kernel refuses io_uring here: auto would be epoll alone")
		}
		f(t, LoopIOAuto)
	})
}

// eachModel runs f on each I/O model: a goroutine per client, then the
// event loop on each driver (eachDriver).
func eachModel(t *testing.T, f func(t *testing.T, o rigOptions)) {
	t.Run("goroutine", func(t *testing.T) { f(t, rigOptions{}) })
	eachDriver(t, func(t *testing.T, io config.EventLoopIO) { f(t, rigOptions{loop: true, io: io}) })
}

// SHOW CLIENTS says "waiting" while a request waits for a connection, and
// only then, on every I/O model: not while a free connection is being
// checked out, and not for the client that holds the connection.
func TestWaitingMeansWaitingForAConnection(t *testing.T) {
	eachModel(t, func(t *testing.T, o rigOptions) {
		// gate, when set, holds the next checkout at its start (under the
		// pool's lock, before it finds a free connection) until closed.
		var gate atomic.Pointer[chan struct{}]
		held := make(chan struct{}, 1)
		o.monitor = pool.MonitorFunc(func(e pool.Event) {
			if e.Type != pool.ConnectionCheckOutStarted {
				return
			}
			if g := gate.Swap(nil); g != nil {
				held <- struct{}{}
				<-*g
			}
		})
		o.maxPool = 1
		release := make(chan struct{})
		var hold atomic.Bool
		r := newRig(t, o, func(*fakemongo.Request) fakemongo.Reply {
			if hold.Load() {
				<-release
			}
			return fakemongo.OK()
		})
		a := r.client(0)
		ca := r.only()
		affOK(t, a.cmd(ping())) // a pooled connection, free
		if o.loop {
			r.waitState(ca, lsIdle)
		}
		state := func(c *client) session.State { return c.sess.State() }

		g := make(chan struct{})
		gate.Store(&g)
		done := make(chan bson.Raw, 2)
		go func() { done <- a.cmd(ping()) }()
		select {
		case <-held:
		case <-time.After(10 * time.Second):
			t.Fatal("the checkout never started")
		}
		st := state(ca)
		close(g)
		affOK(t, <-done)
		if st != session.StateActive {
			t.Fatalf("state %v during a checkout a free connection serves, want %v", st, session.StateActive)
		}

		b := r.client(0)
		var cb *client
		for _, c := range r.s.snapshot() {
			if c != ca {
				cb = c
			}
		}
		if o.loop {
			r.waitState(cb, lsIdle)
		}
		hold.Store(true)
		go func() { done <- a.cmd(ping()) }()
		wait.Until(t, "a's request out", 5*time.Second, time.Millisecond, func() bool { return r.inUse() == 1 })
		go func() { done <- b.cmd(ping()) }()
		wait.Until(t, "b waiting for the connection", 5*time.Second, time.Millisecond, func() bool {
			return state(cb) == session.StateWaiting
		})
		if st := state(ca); st != session.StateActive {
			t.Fatalf("a, holding the connection, is %v, want %v", st, session.StateActive)
		}
		hold.Store(false)
		close(release)
		affOK(t, <-done)
		affOK(t, <-done)
		wait.Until(t, "both idle", 5*time.Second, time.Millisecond, func() bool {
			return state(ca) == session.StateIdle && state(cb) == session.StateIdle
		})
	})
}

// A request whose ID a late reply to an earlier moreToCome request could
// answer is not sent on that connection: once the upstream was seen
// answering such requests (FerretDB), an unanswered one's ID is awaited,
// and a request reusing it takes another connection. An upstream that
// never answers them (MongoDB) costs nothing: clients number requests
// from 1, so IDs come back often, and the connection serves them.
func TestRequestReusingAStrayIDTakesAnotherConnection(t *testing.T) {
	for _, answers := range []bool{true, false} {
		t.Run(map[bool]string{true: "upstream answers moreToCome", false: "upstream never answers"}[answers], func(t *testing.T) {
			eachModel(t, func(t *testing.T, o rigOptions) {
				var created atomic.Int64
				o.monitor = pool.MonitorFunc(func(e pool.Event) {
					if e.Type == pool.ConnectionCreated {
						created.Add(1)
					}
				})
				o.maxPool = 1
				o.answerMoreToCome = answers
				r := newRig(t, o, func(req *fakemongo.Request) fakemongo.Reply {
					if req.Body.Lookup("quiet").Type != 0 {
						return fakemongo.Reply{NoReply: true}
					}
					return fakemongo.OK()
				})
				a, b := r.client(0), r.client(0)
				affOK(t, a.cmd(ping()))
				if answers {
					// Answered, and dropped by the fence: the connection has
					// shown that its server answers moreToCome requests.
					if _, err := a.c.Write(wire.AppendMsg(nil, 3, 0, wire.FlagMoreToCome, mustDoc(t, ping()))); err != nil {
						t.Fatal(err)
					}
				}
				// Not answered before the fence: ID 7 is remembered.
				quiet := append(ping(), bson.E{Key: "quiet", Value: true})
				if _, err := a.c.Write(wire.AppendMsg(nil, 7, 0, wire.FlagMoreToCome, mustDoc(t, quiet))); err != nil {
					t.Fatal(err)
				}
				a.id = 7
				affOK(t, a.cmd(ping())) // served after the moreToCome requests
				before := created.Load()
				b.id = 6
				affOK(t, b.cmd(ping())) // ID 7
				want := int64(0)
				if answers {
					want = 1
				}
				if got := created.Load() - before; got != want {
					t.Fatalf("%d connections created for the request with the remembered ID, want %d", got, want)
				}
				affOK(t, b.cmd(ping())) // ID 8: no new connection
				if got := created.Load() - before; got != want {
					t.Fatalf("%d connections created after it, want none", got-want)
				}
			})
		})
	}
}

func TestLoopStates(t *testing.T) {
	eachDriver(t, func(t *testing.T, io config.EventLoopIO) {
		release := make(chan struct{})
		var hold atomic.Bool
		r := newLoopRig(t, io, 1, func(req *fakemongo.Request) fakemongo.Reply {
			if hold.Load() {
				<-release
			}
			return fakemongo.OK()
		})

		t.Run("idle", func(t *testing.T) {
			cl := r.client(0)
			c := r.only()
			r.waitState(c, lsIdle)
			for range 3 {
				affOK(t, cl.cmd(ping()))
			}
			r.waitState(c, lsIdle)
			if c.sess.Requests() != 3 || c.nc != nil {
				t.Fatalf("%d requests, goroutine conn %v: want 3 served on the loop", c.sess.Requests(), c.nc)
			}
			cl.c.Close()
			wait.Until(t, "client gone", 5*time.Second, time.Millisecond, func() bool { return r.s.ClientCount() == 0 })
		})

		t.Run("waiting for a reply, then for a connection", func(t *testing.T) {
			hold.Store(true)
			a, b := r.client(0), r.client(0)
			cs := r.s.snapshot()
			done := make(chan bson.Raw, 2)
			go func() { done <- a.cmd(ping()) }()
			wait.Until(t, "a request out", 5*time.Second, time.Millisecond, func() bool { return r.inUse() == 1 })
			go func() { done <- b.cmd(ping()) }()
			states := func() (up, waiting int) {
				for _, c := range cs {
					c.lc.Mu.Lock()
					switch c.lc.State {
					case lsUpstream:
						up++
					case lsWaiting:
						waiting++
					}
					c.lc.Mu.Unlock()
				}
				return up, waiting
			}
			wait.Until(t, "one waits for its reply, one for a connection", 5*time.Second, time.Millisecond, func() bool {
				up, w := states()
				return up == 1 && w == 1
			})
			hold.Store(false)
			close(release)
			affOK(t, <-done)
			affOK(t, <-done)
			if up, w := states(); up != 0 || w != 0 || r.inUse() != 0 {
				t.Fatalf("%d upstream, %d waiting, %d in use after both replies", up, w, r.inUse())
			}
			a.c.Close()
			b.c.Close()
			wait.Until(t, "clients gone", 5*time.Second, time.Millisecond, func() bool { return r.s.ClientCount() == 0 })
		})
	})
}

// The upstream fails while a receive of its reply is armed: the server
// closes the connection, or the pool interrupts it. The client gets a
// retryable error and stays connected.
func TestLoopUpstreamClosedWhileArmed(t *testing.T) {
	eachDriver(t, func(t *testing.T, io config.EventLoopIO) {
		for _, how := range []string{"server closes", "pool interrupts"} {
			t.Run(how, func(t *testing.T) {
				arrived := make(chan struct{}, 1)
				var fail atomic.Bool
				r := newLoopRig(t, io, 2, func(req *fakemongo.Request) fakemongo.Reply {
					if !fail.Load() {
						return fakemongo.OK()
					}
					arrived <- struct{}{}
					if how == "server closes" {
						return fakemongo.Reply{Delay: 100 * time.Millisecond, CloseConn: true}
					}
					return fakemongo.Reply{Delay: time.Minute}
				})
				cl := r.client(0)
				c := r.only()
				affOK(t, cl.cmd(ping()))
				fail.Store(true)
				got := make(chan bson.Raw, 1)
				go func() { got <- cl.cmd(ping()) }()
				<-arrived
				r.waitState(c, lsUpstream)
				if how == "pool interrupts" {
					r.route.Topology.Servers()[0].Pool().Clear(true)
				}
				rep := <-got
				if code, _ := rep.Lookup("code").AsInt64OK(); code != command.CodeSocketException && code != command.CodeHostUnreachable {
					t.Fatalf("reply %v, want a retryable network error", rep)
				}
				fail.Store(false)
				r.waitState(c, lsIdle)
				wait.Until(t, "pool ready again", 10*time.Second, 5*time.Millisecond, func() bool {
					return r.route.Topology.Servers()[0].Pool().Stats().State == pool.StateReady
				})
				affOK(t, cl.cmd(ping()))
			})
		}
	})
}

// A client that closes its connection while its request is out: the reply
// finds it gone, and its connection goes back to the pool.
func TestLoopClientGoneMidReply(t *testing.T) {
	eachDriver(t, func(t *testing.T, io config.EventLoopIO) {
		r, cl, _, release := heldRequest(t, io, 0)
		cl.c.Close()
		close(release)
		wait.Until(t, "client finished, connection back", 10*time.Second, time.Millisecond, func() bool {
			return r.s.ClientCount() == 0 && r.inUse() == 0
		})
		if st := r.route.Topology.Servers()[0].Pool().Stats(); st.Total == 0 {
			t.Fatalf("the connection was closed rather than pooled: %+v", st)
		}
	})
}

// A reply larger than the slow client's socket takes: the rest is written
// by a goroutine, which then serves the client; nothing is lost.
func TestLoopPartialWriteToSlowClient(t *testing.T) {
	eachDriver(t, func(t *testing.T, io config.EventLoopIO) {
		r, cl, c, big := stalledBigReply(t, io)
		_ = cl.c.SetDeadline(time.Now().Add(10 * time.Second))
		rep, err := wire.ReadMessage(cl.c, nil, wire.DefaultMaxMessageSize)
		if err != nil {
			t.Fatal(err)
		}
		m, err := wire.ParseMsg(rep)
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := bson.Raw(m.Body).Lookup("big").StringValueOK(); got != big || m.Header.ResponseTo != 9 {
			t.Fatalf("reply to %d with %d bytes of big, want all %d, to 9", m.Header.ResponseTo, len(got), len(big))
		}
		cl.id = 9
		affOK(t, cl.cmd(ping()))
		// Idle again, the client goes back to the loop.
		r.waitState(c, lsIdle)
	})
}

// stalledBigReply starts a loop rig whose upstream answers ping with a
// 4 MB reply, and sends one (request ID 9) from a client with a small
// socket buffer that does not read: the loop cannot write the reply whole,
// and a goroutine takes the client.
func stalledBigReply(t *testing.T, io config.EventLoopIO) (r *loopRig, cl *affConn, c *client, big string) {
	t.Helper()
	big = strings.Repeat("x", 4<<20)
	r = newLoopRig(t, io, 2, func(req *fakemongo.Request) fakemongo.Reply {
		return fakemongo.OK(bson.E{Key: "big", Value: big})
	})
	cl = r.client(16 * 1024)
	c = r.only()
	r.waitState(c, lsIdle)
	msg := wire.AppendMsg(nil, 9, 0, 0, mustDoc(t, ping()))
	if _, err := cl.c.Write(msg); err != nil {
		t.Fatal(err)
	}
	r.waitState(c, lsGoroutine)
	return r, cl, c, big
}

// The request's send fails (on io_uring, a send linked to the receive of
// its reply, whose completion is then the failed send's): the client gets
// a retryable error and stays connected, and the next request goes out on
// a new connection.
func TestLoopRequestSendFails(t *testing.T) {
	eachDriver(t, func(t *testing.T, io config.EventLoopIO) {
		r := newLoopRig(t, io, 1, func(*fakemongo.Request) fakemongo.Reply { return fakemongo.OK() })
		cl := r.client(0)
		c := r.only()
		affOK(t, cl.cmd(ping()))
		r.waitState(c, lsIdle)
		// The pool's one connection, its socket shut down for writing.
		p := r.route.Topology.Servers()[0].Pool()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		pc, err := p.CheckOut(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rc, ok := pc.Upstream().RawConn()
		if !ok {
			t.Fatal("no raw socket")
		}
		if err := rc.Control(func(fd uintptr) { err = syscall.Shutdown(int(fd), syscall.SHUT_WR) }); err != nil {
			t.Fatal(err)
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := p.CheckIn(pc); err != nil {
			t.Fatal(err)
		}
		rep := cl.cmd(ping())
		if code, _ := rep.Lookup("code").AsInt64OK(); code != command.CodeSocketException && code != command.CodeHostUnreachable {
			t.Fatalf("reply %v, want a retryable network error", rep)
		}
		r.waitState(c, lsIdle)
		wait.Until(t, "pool ready again", 10*time.Second, 5*time.Millisecond, func() bool {
			return p.Stats().State == pool.StateReady
		})
		affOK(t, cl.cmd(ping()))
	})
}

// BenchmarkLoopRequest is a ping through the loop, on each driver: from one
// client, and from 8 clients sharing a pool of 2, where most requests wait
// for a connection and are handed one at a check-in. The fake upstream
// and the clients run in this process, so ns/op is the whole round trip;
// allocs/op is the loop's (and the client's and fake's) per request.
func BenchmarkLoopRequest(b *testing.B) {
	drivers := []config.EventLoopIO{LoopIOEpoll}
	if uring.Supported() {
		drivers = append(drivers, LoopIOUring)
	}
	for _, io := range drivers {
		name := map[config.EventLoopIO]string{LoopIOEpoll: "epoll", LoopIOUring: "io_uring"}[io]
		for _, n := range []int{1, 8} {
			b.Run(fmt.Sprintf("%s/clients=%d", name, n), func(b *testing.B) {
				r := newLoopRig(b, io, min(n, 2), func(*fakemongo.Request) fakemongo.Reply { return fakemongo.OK() })
				cls := make([]*affConn, n)
				for i := range cls {
					cls[i] = r.client(0)
				}
				body := ping()
				b.ReportAllocs()
				b.ResetTimer()
				var wg sync.WaitGroup
				for i, cl := range cls {
					wg.Add(1)
					msg := wire.AppendMsg(nil, int32(i+100), 0, 0, mustDoc(b, body))
					buf := make([]byte, 64*1024)
					go func() {
						defer wg.Done()
						for j := i; j < b.N; j += n {
							if _, err := cl.c.Write(msg); err != nil {
								b.Error(err)
								return
							}
							if _, err := wire.ReadMessage(cl.c, buf, 1<<20); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
			})
		}
	}
}
