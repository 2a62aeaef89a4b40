package proxy

// Shutdown's drain and a client that has just connected: its first
// message answered, a silent one waited for within bounds.

import (
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// A client accepted just before a graceful shutdown, whose first message
// arrives after the drain began, is answered rather than disconnected with
// its request unread (a reset: with so_reuseport, an upgrade's last
// connections to the old process); the drain then ends at once, and a
// client that stays silent holds it freshClientGrace at most. On every I/O
// model.
func TestShutdownAnswersAFreshClientsFirstMessage(t *testing.T) {
	eachModel(t, func(t *testing.T, o rigOptions) {
		r := newRig(t, o, func(*fakemongo.Request) fakemongo.Reply { return fakemongo.OK() })
		pair := func() *affConn {
			fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			ours, theirs := fileNetConn(t, fds[0]), fileNetConn(t, fds[1])
			t.Cleanup(func() { ours.Close() })
			r.s.accept(theirs, "", "socketpair")
			return &affConn{t: t, c: ours}
		}
		cl := pair()
		began := time.Now()
		done := startShutdown(t, r)
		time.Sleep(100 * time.Millisecond) // the first message comes late
		quiesced(t, cl.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}}))
		answered := time.Now()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("shutdown: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("shutdown still running 5s after the only client was answered")
		}
		if d := time.Since(answered); d > freshClientGrace/2 {
			t.Errorf("shutdown ended %v after the client had spoken, want well under freshClientGrace (%v) since %v", d, freshClientGrace, answered.Sub(began))
		}
	})
}

// A client that never speaks holds the drain for freshClientGrace at most.
func TestShutdownWaitsForASilentClientBounded(t *testing.T) {
	r := newRig(t, rigOptions{}, func(*fakemongo.Request) fakemongo.Reply { return fakemongo.OK() })
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	ours, theirs := fileNetConn(t, fds[0]), fileNetConn(t, fds[1])
	defer ours.Close()
	r.s.accept(theirs, "", "socketpair")
	began := time.Now()
	done := startShutdown(t, r)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("shutdown: %v", err)
		}
	case <-time.After(freshClientGrace + 5*time.Second):
		t.Fatal("a silent client held the drain past freshClientGrace")
	}
	if d := time.Since(began); d > freshClientGrace+2*time.Second {
		t.Fatalf("shutdown took %v with a silent client, want about freshClientGrace (%v)", d, freshClientGrace)
	}
}

// heldListener hands out the conns sent on conns, each held after it is
// taken until release is closed: a client the kernel gave an accept loop
// just before Shutdown closed the listener.
type heldListener struct {
	conns   chan net.Conn
	taken   chan struct{}
	release chan struct{}
	done    chan struct{}
	once    sync.Once
}

func (l *heldListener) Accept() (net.Conn, error) {
	select {
	case nc := <-l.conns:
		l.taken <- struct{}{}
		<-l.release
		return nc, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *heldListener) Close() error   { l.once.Do(func() { close(l.done) }); return nil }
func (l *heldListener) Addr() net.Addr { return &net.UnixAddr{Name: "held", Net: "unix"} }

// A client accepted just as Shutdown closes the listener, not yet handed
// to the server, is served once it is: Shutdown waits for the accept loop
// rather than draining without it and refusing it at Close with its first
// request unread (a reset). On every I/O model.
func TestShutdownWaitsForTheAcceptLoop(t *testing.T) {
	eachModel(t, func(t *testing.T, o rigOptions) {
		r := newRig(t, o, func(*fakemongo.Request) fakemongo.Reply { return fakemongo.OK() })
		l := &heldListener{conns: make(chan net.Conn, 1), taken: make(chan struct{}, 1), release: make(chan struct{}), done: make(chan struct{})}
		served := make(chan error, 1)
		go func() { served <- r.s.Serve(l, "") }()
		fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		ours, theirs := fileNetConn(t, fds[0]), fileNetConn(t, fds[1])
		defer ours.Close()
		l.conns <- theirs
		<-l.taken
		cl := &affConn{t: t, c: ours}
		done := startShutdown(t, r)
		time.Sleep(50 * time.Millisecond)
		close(l.release)
		quiesced(t, cl.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}}))
		if err := <-done; err != nil {
			t.Fatalf("shutdown: %v", err)
		}
		select {
		case <-served:
		case <-time.After(5 * time.Second):
			t.Fatal("Serve still running after Shutdown")
		}
	})
}

// quiesced fails t unless r is a hello's reply during a drain: answered
// (not reset), with the quiesce state, ShutdownInProgress (hello.go).
func quiesced(t testing.TB, r bson.Raw) {
	t.Helper()
	if code, _ := r.Lookup("code").AsInt64OK(); code != 91 {
		t.Fatalf("hello during the drain: %v, want 91 (quiesce)", r)
	}
}
