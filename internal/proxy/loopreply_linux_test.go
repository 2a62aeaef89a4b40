package proxy

// Replies on the loop path to clients that read slowly or not at all,
// leave, or are closed with replies still queued.

import (
	"context"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/wait"
	"github.com/mongobouncer/mongobouncer/internal/uring"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// Small replies to a client that has nothing else to serve: on io_uring
// they go out on the ring, linked to the receive of the client's next
// request (ringDriver.sendReply); on epoll they are written at once.

// paddedReply is a ping reply that fits a client's rbuf, with its request's ID
// in it so that order can be checked.
func paddedReply(req *fakemongo.Request) fakemongo.Reply {
	n, _ := req.Body.Lookup("n").AsInt64OK()
	return fakemongo.OK(bson.E{Key: "n", Value: n}, bson.E{Key: "pad", Value: strings.Repeat("p", 300)})
}

// fillNonReader sends requests from a client that reads no reply, one at a
// time, each once the upstream has seen the one before, until the proxy
// stops taking them: their replies fill the client's socket, and the
// proxy's last send waits for room. It returns how many were sent.
func fillNonReader(t *testing.T, cl *affConn, seen *atomic.Int64) int {
	t.Helper()
	for i := 1; i <= 5000; i++ {
		msg := wire.AppendMsg(nil, int32(i), 0, 0, mustDoc(t, bson.D{{Key: "ping", Value: 1}, {Key: "n", Value: int64(i)}, {Key: "$db", Value: "test"}}))
		if _, err := cl.c.Write(msg); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(300 * time.Millisecond)
		for seen.Load() < int64(i) && time.Now().Before(deadline) {
			time.Sleep(100 * time.Microsecond)
		}
		if seen.Load() < int64(i) {
			return i
		}
	}
	t.Fatal("5,000 replies never filled the client's socket")
	return 0
}

// nonReader starts a loop rig whose upstream answers padded replies, and a
// client (over a socketpair, or loopback TCP) with small socket buffers
// that has sent requests without reading until the proxy stopped taking
// them (fillNonReader).
func nonReader(t *testing.T, io config.EventLoopIO, tcp bool) (r *loopRig, cl *affConn, c *client, sent int) {
	t.Helper()
	var seen atomic.Int64
	r = newLoopRig(t, io, 2, func(req *fakemongo.Request) fakemongo.Reply {
		if n, ok := req.Body.Lookup("n").AsInt64OK(); ok {
			seen.Store(n)
		}
		return paddedReply(req)
	})
	if tcp {
		cl = r.tcpClient(4096)
	} else {
		cl = r.client(4096)
	}
	c = r.only()
	r.waitState(c, lsIdle)
	return r, cl, c, fillNonReader(t, cl, &seen)
}

// A client that sends requests and reads no reply: the replies wait (in
// the kernel on io_uring, the client still the loop's; on a goroutine on
// epoll), the loop serves other clients meanwhile, and once the client
// reads it gets every reply, whole and in order, and is served on.
func TestLoopSmallRepliesToANonReader(t *testing.T) {
	eachDriver(t, func(t *testing.T, io config.EventLoopIO) {
		r, cl, c, sent := nonReader(t, io, false)
		want := lsIdle
		if io == LoopIOEpoll || io == LoopIOAuto {
			// auto: one client, one request out at a time, is epoll's.
			want = lsGoroutine
		}
		c.lc.Mu.Lock()
		st := c.lc.State
		c.lc.Mu.Unlock()
		if st != want {
			t.Fatalf("client state %v with its replies waiting, want %v", st, want)
		}

		other := r.client(0)
		affOK(t, other.cmd(ping()))

		_ = cl.c.SetDeadline(time.Now().Add(10 * time.Second))
		for i := 1; i <= sent; i++ {
			rep, err := wire.ReadMessage(cl.c, nil, wire.DefaultMaxMessageSize)
			if err != nil {
				t.Fatalf("reply %d of %d: %v", i, sent, err)
			}
			m, err := wire.ParseMsg(rep)
			if err != nil {
				t.Fatalf("reply %d: %v", i, err)
			}
			n, _ := bson.Raw(m.Body).Lookup("n").AsInt64OK()
			if m.Header.ResponseTo != int32(i) || n != int64(i) {
				t.Fatalf("reply %d is to request %d (n %d)", i, m.Header.ResponseTo, n)
			}
		}
		cl.id = int32(sent)
		affOK(t, cl.cmd(ping()))
		r.waitState(c, lsIdle)
	})
}

// A client is disconnected (by Close, or the idle sweeper) while a reply
// waits for room in its socket: its connection is closed at once, with the
// loop still running, and the loop serves others.
func TestLoopDisconnectWithAReplyWaiting(t *testing.T) {
	eachDriver(t, func(t *testing.T, io config.EventLoopIO) {
		r, cl, c, _ := nonReader(t, io, false)
		c.disconnect()
		wait.Until(t, "client gone", 10*time.Second, time.Millisecond, func() bool { return r.s.ClientCount() == 0 })
		// Closed without the client reading: its end hears the hang-up
		// with the replies still unread.
		wait.Until(t, "the client's connection closed", 10*time.Second, time.Millisecond, func() bool { return hungUp(t, cl.c) })
		affOK(t, r.client(0).cmd(ping()))
	})
}

// The server shuts down while replies wait for room in a client's socket
// (on io_uring the last one sent on the ring, waiting in the kernel; on
// epoll on a goroutine), over loopback TCP: the shutdown waits for them,
// and once the client reads it gets every reply, whole and in order, then
// the hang-up, not a reset (before it, on epoll, ShutdownInProgress for
// the requests the proxy reads after the replies). The client may also
// have sent more requests than rbuf holds, which the proxy never reads
// (io_uring), and read slowly.
func TestLoopShutdownSendsTheRepliesWaiting(t *testing.T) {
	for _, tc := range []struct {
		name  string
		extra int           // requests sent after the ones the proxy took
		pause time.Duration // between the client's reads
	}{
		{"reader", 0, 0},
		{"pipelined slow reader", 12, 5 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachDriver(t, func(t *testing.T, model config.EventLoopIO) {
				r, cl, _, sent := nonReader(t, model, true)
				for k := range tc.extra {
					msg := wire.AppendMsg(nil, int32(sent+1+k), 0, 0, mustDoc(t, ping()))
					if _, err := cl.c.Write(msg); err != nil {
						t.Fatal(err)
					}
				}
				done := startShutdown(t, r)
				select {
				case err := <-done:
					t.Fatalf("the shutdown ended (%v) with replies unsent", err)
				case <-time.After(200 * time.Millisecond):
				}
				_ = cl.c.SetDeadline(time.Now().Add(10 * time.Second))
				for i := 1; ; i++ {
					rep, err := wire.ReadMessage(cl.c, nil, wire.DefaultMaxMessageSize)
					if err == io.EOF && i >= sent {
						break
					}
					if err != nil {
						t.Fatalf("message %d (%d replies): %v", i, sent-1, err)
					}
					m, err := wire.ParseMsg(rep)
					if err != nil {
						t.Fatalf("message %d: %v", i, err)
					}
					if i >= sent {
						// A request after the replies, read during the drain.
						if code, _ := bson.Raw(m.Body).Lookup("code").AsInt64OK(); m.Header.ResponseTo != int32(i) || code != command.CodeShutdownInProgress || i > sent+tc.extra {
							t.Fatalf("message %d after the replies: %v", i, bson.Raw(m.Body))
						}
						continue
					}
					n, _ := bson.Raw(m.Body).Lookup("n").AsInt64OK()
					if m.Header.ResponseTo != int32(i) || n != int64(i) {
						t.Fatalf("reply %d is to request %d (n %d)", i, m.Header.ResponseTo, n)
					}
					time.Sleep(tc.pause)
				}
				if err := <-done; err != nil {
					t.Fatalf("shutdown: %v", err)
				}
			})
		})
	}
}

// A client closed by Server.Close whose socket lingers until its replies
// have left (linger_linux.go) goes away with replies unread, which resets
// the connection: nothing is left to send, and Close does not wait for it
// until its context ends (a reset TCP socket still counts the bytes it
// dropped as unsent).
func TestLoopCloseForgetsAFlushingClientThatResets(t *testing.T) {
	if !uring.Supported() {
		t.Skip("the kernel refuses io_uring here")
	}
	r, cl, _, _ := nonReader(t, LoopIOUring, true)
	d := r.s.loopsPtr.Load()
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		done <- r.s.Close(ctx)
	}()
	// Read a little at a time, until the ring's send is whole and the
	// socket lingers with what is left.
	flushing := func() bool {
		return r.s.flush.Lingering() > 0 && d.Lingering() == 0
	}
	// 64 bytes a read: the socket must not drain before the test sees it
	// lingering (with 512 it did, about 1 run in 35).
	buf := make([]byte, 64)
	_ = cl.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for !flushing() {
		if _, err := cl.c.Read(buf); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Millisecond)
	}
	start := time.Now()
	cl.c.Close()
	err := <-done
	if took := time.Since(start); took > time.Second {
		t.Fatalf("Close took %v after the client reset (%v)", took, err)
	}
	if err != nil {
		t.Fatalf("Close: %v", err)
	}
	if n := d.Lingering(); n != 0 {
		t.Fatalf("%d clients still lingering", n)
	}
}

// Close waits for a reply in flight to a client that never reads only as
// long as its context allows: then it says so, and the client is hung up.
func TestLoopCloseGivesUpOnANonReader(t *testing.T) {
	eachDriver(t, func(t *testing.T, model config.EventLoopIO) {
		r, cl, _, _ := nonReader(t, model, true)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := r.s.Close(ctx)
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("Close took %v", took)
		}
		if model == LoopIOUring && (err == nil || !strings.Contains(err.Error(), "unsent")) {
			t.Fatalf("Close: %v, want the unsent replies named", err)
		}
		wait.Until(t, "the client's connection closed", 10*time.Second, time.Millisecond, func() bool { return hungUp(t, cl.c) })
	})
}

// hungUp reports whether nc's peer has closed or shut down its end
// (POLLRDHUP), whatever nc has left to read.
func hungUp(t *testing.T, nc net.Conn) bool {
	t.Helper()
	rc, err := nc.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	const pollHUP, pollRDHUP = 0x10, 0x2000
	var pfd struct {
		fd              int32
		events, revents int16
	}
	if err := rc.Control(func(fd uintptr) {
		pfd.fd, pfd.events = int32(fd), pollRDHUP
		_, _, _ = syscall.Syscall(syscall.SYS_POLL, uintptr(unsafe.Pointer(&pfd)), 1, 0)
	}); err != nil {
		t.Fatal(err)
	}
	return pfd.revents&(pollRDHUP|pollHUP) != 0
}

// A reply's send fails (the proxy's side of the client socket shut down
// for writing): the client is closed, and the loop serves others.
func TestLoopReplySendFails(t *testing.T) {
	eachDriver(t, func(t *testing.T, io config.EventLoopIO) {
		r := newLoopRig(t, io, 2, func(*fakemongo.Request) fakemongo.Reply { return fakemongo.OK() })
		cl := r.client(0)
		c := r.only()
		affOK(t, cl.cmd(ping()))
		r.waitState(c, lsIdle)
		c.lc.Mu.Lock()
		err := syscall.Shutdown(c.lc.Fd(), syscall.SHUT_WR)
		c.lc.Mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		msg := wire.AppendMsg(nil, 7, 0, 0, mustDoc(t, ping()))
		if _, err := cl.c.Write(msg); err != nil {
			t.Fatal(err)
		}
		wait.Until(t, "client closed", 10*time.Second, time.Millisecond, func() bool { return r.s.ClientCount() == 0 })
		affOK(t, r.client(0).cmd(ping()))
	})
}

// A drain waits for a small reply that the client's socket cannot take,
// as for a large one: from the start of a drain, replies take the write
// path, whose request ends only once the reply is written. The request is
// in flight as the drain begins, and the socket is filled meanwhile.
func TestLoopDrainWaitsForASmallReply(t *testing.T) {
	eachDriver(t, func(t *testing.T, model config.EventLoopIO) {
		r, cl, c, release := heldRequest(t, model, 4096)
		drained := startShutdown(t, r)
		// Fill the client's socket from the proxy's side.
		junk := make([]byte, 1024)
		filled := 0
		c.lc.Mu.Lock()
		fd := c.lc.Fd()
		for {
			n, err := syscall.Write(fd, junk)
			if err != nil {
				break
			}
			filled += n
		}
		c.lc.Mu.Unlock()
		close(release)
		r.waitState(c, lsGoroutine)
		select {
		case err := <-drained:
			t.Fatalf("the drain ended (%v) with a reply unwritten", err)
		case <-time.After(100 * time.Millisecond):
		}
		_ = cl.c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.ReadFull(cl.c, make([]byte, filled)); err != nil {
			t.Fatal(err)
		}
		rep, err := wire.ReadMessage(cl.c, nil, wire.DefaultMaxMessageSize)
		if err != nil {
			t.Fatal(err)
		}
		if m, err := wire.ParseMsg(rep); err != nil || m.Header.ResponseTo != 9 {
			t.Fatalf("reply %v (%v), want the reply to 9", rep, err)
		}
		if err := <-drained; err != nil {
			t.Fatalf("drain: %v", err)
		}
	})
}

// startShutdown starts r's Shutdown (bounded at 20 s) and returns once the
// drain has begun; the channel gets Shutdown's result.
func startShutdown(t *testing.T, r *loopRig) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		done <- r.s.Shutdown(ctx)
	}()
	wait.Until(t, "draining", 5*time.Second, time.Millisecond, r.s.Draining)
	return done
}

// heldRequest starts a loop rig with a pool of one whose upstream holds
// each ping until release is closed, and a client (sndbuf as in
// loopRig.client) whose request 9 is out on the connection.
func heldRequest(t *testing.T, io config.EventLoopIO, sndbuf int) (r *loopRig, cl *affConn, c *client, release chan struct{}) {
	t.Helper()
	arrived := make(chan struct{}, 1)
	release = make(chan struct{})
	r = newLoopRig(t, io, 1, func(req *fakemongo.Request) fakemongo.Reply {
		arrived <- struct{}{}
		<-release
		return fakemongo.OK()
	})
	cl = r.client(sndbuf)
	c = r.only()
	r.waitState(c, lsIdle)
	msg := wire.AppendMsg(nil, 9, 0, 0, mustDoc(t, ping()))
	if _, err := cl.c.Write(msg); err != nil {
		t.Fatal(err)
	}
	<-arrived
	r.waitState(c, lsUpstream)
	return r, cl, c, release
}
