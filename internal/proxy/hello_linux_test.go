package proxy

// The awaitable hello on every I/O model (hello.go): a wait for a
// change, the exhaust stream, the drain that ends every wait at once with
// the quiesce reply, Close, and a streaming monitor under
// client_login_timeout.

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.uber.org/goleak"

	"github.com/mongobouncer/mongobouncer/internal/auth"
	"github.com/mongobouncer/mongobouncer/internal/hello"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/wait"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// helloMsg is one message read back by recvMsg.
type helloMsg struct {
	h     wire.Header
	flags wire.MsgFlags
	body  bson.Raw
}

func (a *affConn) sendFlags(flags wire.MsgFlags, body bson.D) int32 {
	a.t.Helper()
	a.id++
	_ = a.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := a.c.Write(wire.AppendMsg(nil, a.id, 0, flags, mustDoc(a.t, body))); err != nil {
		a.t.Fatalf("write: %v", err)
	}
	return a.id
}

func (a *affConn) recvMsg(d time.Duration) (helloMsg, error) {
	_ = a.c.SetReadDeadline(time.Now().Add(d))
	rep, err := wire.ReadMessage(a.c, nil, wire.DefaultMaxMessageSize)
	if err != nil {
		return helloMsg{}, err
	}
	h, _ := wire.ParseHeader(rep)
	m, err := wire.ParseMsg(rep)
	if err != nil {
		return helloMsg{}, err
	}
	return helloMsg{h: h, flags: m.Flags, body: bson.Raw(append([]byte(nil), m.Body...))}, nil
}

// topologyVersionOf returns a reply's topologyVersion.
func topologyVersionOf(t testing.TB, r bson.Raw) bson.D {
	t.Helper()
	v, err := r.LookupErr("topologyVersion")
	if err != nil {
		t.Fatalf("no topologyVersion in %v", r)
	}
	var d bson.D
	if err := v.Unmarshal(&d); err != nil {
		t.Fatal(err)
	}
	return d
}

func awaitHello(tv bson.D, ms int64) bson.D {
	return bson.D{{Key: "hello", Value: 1}, {Key: "topologyVersion", Value: tv}, {Key: "maxAwaitTimeMS", Value: ms}, {Key: "$db", Value: "admin"}}
}

// An awaitable hello with our topologyVersion waits maxAwaitTimeMS; with
// another process's or an older counter it is answered at once.
func TestAwaitableHelloWaits(t *testing.T) {
	eachModel(t, func(t *testing.T, o rigOptions) {
		r := newRig(t, o, func(*fakemongo.Request) fakemongo.Reply { return fakemongo.OK() })
		cl := r.client(0)
		tv := topologyVersionOf(t, cl.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}}))
		began := time.Now()
		rep := cl.cmd(awaitHello(tv, 400))
		if d := time.Since(began); d < 380*time.Millisecond || d > 3*time.Second {
			t.Errorf("awaitable hello with our topologyVersion answered after %v, want 400ms", d)
		}
		affOK(t, rep)
		other := bson.D{{Key: "processId", Value: bson.NewObjectID()}, {Key: "counter", Value: int64(0)}}
		began = time.Now()
		affOK(t, cl.cmd(awaitHello(other, 5000)))
		if d := time.Since(began); d > time.Second {
			t.Errorf("awaitable hello with another processId answered after %v, want at once", d)
		}
		// Served by its goroutine, a waiting hello leaves the client usable.
		affOK(t, cl.cmd(ping()))
	})
}

// A hello refused for its apiVersion is refused at once, as a mongos
// checks a command before running it, not after an awaitable wait.
func TestAwaitableHelloRefusedAtOnce(t *testing.T) {
	r := newRig(t, rigOptions{}, func(*fakemongo.Request) fakemongo.Reply { return fakemongo.OK() })
	cl := r.client(0)
	tv := topologyVersionOf(t, cl.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}}))
	began := time.Now()
	rep := cl.cmd(append(awaitHello(tv, 2000), bson.E{Key: "apiVersion", Value: "2"}))
	if d := time.Since(began); d > time.Second {
		t.Errorf("refused hello answered after %v, want at once", d)
	}
	if code, _ := rep.Lookup("code").AsInt64OK(); code != 322 {
		t.Errorf("reply %v, want APIVersionError (322)", rep)
	}
}

// With exhaustAllowed the replies stream: moreToCome on each, each
// answering the previous reply, one per maxAwaitTimeMS, no request between.
func TestStreamingHello(t *testing.T) {
	eachModel(t, func(t *testing.T, o rigOptions) {
		r := newRig(t, o, func(*fakemongo.Request) fakemongo.Reply { return fakemongo.OK() })
		cl := r.client(0)
		tv := topologyVersionOf(t, cl.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}}))
		prev := cl.sendFlags(wire.FlagExhaustAllowed, awaitHello(tv, 600))
		began := time.Now()
		for i := range 3 {
			m, err := cl.recvMsg(5 * time.Second)
			if err != nil {
				t.Fatalf("streamed reply %d: %v", i, err)
			}
			if m.flags&wire.FlagMoreToCome == 0 || m.h.ResponseTo != prev {
				t.Fatalf("streamed reply %d: flags %v responseTo %d, want moreToCome answering %d", i, m.flags, m.h.ResponseTo, prev)
			}
			affOK(t, m.body)
			prev = m.h.RequestID
		}
		if d := time.Since(began); d < 1700*time.Millisecond || d > 5*time.Second {
			t.Errorf("3 streamed replies in %v, want one per 600ms", d)
		}
		// The stream holds its client's goroutine only: another client is
		// served meanwhile, by the loop where there is one.
		other := r.client(0)
		for range 3 {
			affOK(t, other.cmd(ping()))
		}
		if n := r.s.HellosWaiting(); n != 1 {
			t.Errorf("%d hellos waiting, want the stream's", n)
		}
	})
}

// maxAwaitTimeMS: 0 with exhaust streams no faster than hello.MinStreamInterval.
func TestStreamingHelloFloor(t *testing.T) {
	r := newRig(t, rigOptions{}, func(*fakemongo.Request) fakemongo.Reply { return fakemongo.OK() })
	cl := r.client(0)
	tv := topologyVersionOf(t, cl.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}}))
	cl.sendFlags(wire.FlagExhaustAllowed, awaitHello(tv, 0))
	n := 0
	deadline := time.Now().Add(1200 * time.Millisecond)
	for {
		if _, err := cl.recvMsg(time.Until(deadline)); err != nil {
			break
		}
		n++
	}
	if n < 2 || n > 4 {
		t.Errorf("%d streamed replies in 1.2s with maxAwaitTimeMS 0, want 3 (one at once, then one per %v)", n, hello.MinStreamInterval)
	}
}

// The drain's start moves the topologyVersion, and every waiting hello,
// streamed or not, is answered at once with the quiesce reply; the stream
// ends there (no moreToCome).
func TestDrainAnswersWaitingHellos(t *testing.T) {
	eachModel(t, func(t *testing.T, o rigOptions) {
		r := newRig(t, o, func(*fakemongo.Request) fakemongo.Reply { return fakemongo.OK() })
		plain, stream := r.client(0), r.client(0)
		tv := topologyVersionOf(t, plain.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}}))
		plain.sendFlags(0, awaitHello(tv, 30_000))
		// Another process's topologyVersion: the first reply comes at once,
		// and the stream waits between replies.
		other := bson.D{{Key: "processId", Value: bson.NewObjectID()}, {Key: "counter", Value: int64(0)}}
		stream.sendFlags(wire.FlagExhaustAllowed, awaitHello(other, 30_000))
		if m, err := stream.recvMsg(5 * time.Second); err != nil || m.flags&wire.FlagMoreToCome == 0 {
			t.Fatalf("first streamed reply: %v %v", m.flags, err)
		}
		wait.Until(t, "two hellos waiting", 5*time.Second, time.Millisecond, func() bool { return r.s.HellosWaiting() == 2 })
		began := time.Now()
		done := startShutdown(t, r)
		for name, cl := range map[string]*affConn{"awaitable": plain, "streaming": stream} {
			m, err := cl.recvMsg(5 * time.Second)
			if err != nil {
				t.Fatalf("%s hello at drain start: %v", name, err)
			}
			if d := time.Since(began); d > 500*time.Millisecond {
				t.Errorf("%s hello answered %v after the drain began, want at once", name, d)
			}
			if code, _ := m.body.Lookup("code").AsInt64OK(); code != 91 || m.flags&wire.FlagMoreToCome != 0 {
				t.Errorf("%s hello at drain start: flags %v %v, want 91 without moreToCome", name, m.flags, m.body)
			}
			if got := topologyVersionOf(t, m.body); got[1].Value.(int64) != tv[1].Value.(int64)+1 {
				t.Errorf("%s: topologyVersion %v after %v, want the counter moved", name, got, tv)
			}
		}
		if err := <-done; err != nil {
			t.Fatalf("shutdown: %v", err)
		}
	})
}

// Close ends every wait at once, and leaves no goroutine behind.
func TestCloseEndsWaitingHellos(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	eachModel(t, func(t *testing.T, o rigOptions) {
		r := newRig(t, o, func(*fakemongo.Request) fakemongo.Reply { return fakemongo.OK() })
		cl, st := r.client(0), r.client(0)
		tv := topologyVersionOf(t, cl.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}}))
		cl.sendFlags(0, awaitHello(tv, 50_000))
		st.sendFlags(wire.FlagExhaustAllowed, awaitHello(tv, 50_000))
		wait.Until(t, "two hellos waiting", 5*time.Second, time.Millisecond, func() bool { return r.s.HellosWaiting() == 2 })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		began := time.Now()
		if err := r.s.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(began); d > 2*time.Second {
			t.Errorf("Close took %v with hellos waiting, want at once", d)
		}
		if n := r.s.HellosWaiting(); n != 0 {
			t.Errorf("%d hellos waiting after Close", n)
		}
	})
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
}

// A streaming monitor never logs in and, after its one request, sends
// nothing: with client authentication on, client_login_timeout (1s here)
// must not close it, while a silent client is closed as before.
func TestStreamingHelloOutlivesLoginTimeout(t *testing.T) {
	eachModel(t, func(t *testing.T, o rigOptions) {
		r := newRig(t, o, func(*fakemongo.Request) fakemongo.Reply { return fakemongo.OK() })
		users, err := auth.ParseFile([]byte(`"app@admin" "pw"`+"\n"), "t")
		if err != nil {
			t.Fatal(err)
		}
		r.s.opts.Auth = &ClientAuth{Users: auth.New(users, nil, nil)}
		r.s.SetLoginTimeout(time.Second)
		monitor, silent := r.client(0), r.client(0)
		tv := topologyVersionOf(t, monitor.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}}))
		monitor.sendFlags(wire.FlagExhaustAllowed, awaitHello(tv, 1500))
		began := time.Now()
		for i := range 3 {
			m, err := monitor.recvMsg(5 * time.Second)
			if err != nil {
				t.Fatalf("streamed reply %d after %v: %v", i, time.Since(began), err)
			}
			affOK(t, m.body)
		}
		if d := time.Since(began); d < 3*time.Second {
			t.Fatalf("3 replies in %v, want the stream to outlive client_login_timeout", d)
		}
		if _, err := silent.recvMsg(100 * time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) && err == nil {
			t.Fatal("the silent client got a message")
		}
		_ = silent.c.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := silent.c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("a silent client that has not logged in is still connected after 4s (client_login_timeout 1s): %v", err)
		}
		if r.s.LoginTimeouts() == 0 {
			t.Error("no client closed by client_login_timeout")
		}
	})
}

// A client that closes its connection while its hello waits is gone at
// once, not at the next reply's write: its goroutine and its
// max_client_conn slot are free.
func TestClosedWhileWaitingIsGoneAtOnce(t *testing.T) {
	eachModel(t, func(t *testing.T, o rigOptions) {
		r := newRig(t, o, func(*fakemongo.Request) fakemongo.Reply { return fakemongo.OK() })
		plain, stream := r.client(0), r.client(0)
		tv := topologyVersionOf(t, plain.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}}))
		plain.sendFlags(0, awaitHello(tv, 50_000))
		stream.sendFlags(wire.FlagExhaustAllowed, awaitHello(tv, 50_000))
		wait.Until(t, "two hellos waiting", 5*time.Second, time.Millisecond, func() bool { return r.s.HellosWaiting() == 2 })
		plain.c.Close()
		stream.c.Close()
		wait.Until(t, "both clients gone", 2*time.Second, time.Millisecond, func() bool {
			return r.s.HellosWaiting() == 0 && r.s.ClientCount() == 0
		})
	})
}

// A byte that comes while a hello waits is not lost: the wait goes on,
// and the next request (its first byte sent early) is served whole.
func TestByteDuringWaitIsKept(t *testing.T) {
	eachModel(t, func(t *testing.T, o rigOptions) {
		r := newRig(t, o, func(*fakemongo.Request) fakemongo.Reply { return fakemongo.OK() })
		cl := r.client(0)
		tv := topologyVersionOf(t, cl.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}}))
		cl.sendFlags(0, awaitHello(tv, 500))
		wait.Until(t, "a hello waiting", 5*time.Second, time.Millisecond, func() bool { return r.s.HellosWaiting() == 1 })
		cl.id++
		next := wire.AppendMsg(nil, cl.id, 0, 0, mustDoc(t, ping()))
		if _, err := cl.c.Write(next[:1]); err != nil {
			t.Fatal(err)
		}
		m, err := cl.recvMsg(5 * time.Second)
		if err != nil || m.h.ResponseTo != cl.id-1 {
			t.Fatalf("awaitable hello: %+v %v", m.h, err)
		}
		affOK(t, m.body)
		if _, err := cl.c.Write(next[1:]); err != nil {
			t.Fatal(err)
		}
		m, err = cl.recvMsg(5 * time.Second)
		if err != nil || m.h.ResponseTo != cl.id {
			t.Fatalf("ping after the hello: %+v %v", m.h, err)
		}
		affOK(t, m.body)
	})
}

// hello_max_await caps the wait whatever maxAwaitTimeMS asks, for a single
// awaitable hello and between streamed replies.
func TestHelloMaxAwaitCapsTheWait(t *testing.T) {
	r := newRig(t, rigOptions{}, func(*fakemongo.Request) fakemongo.Reply { return fakemongo.OK() })
	r.s.SetHelloMaxAwait(600 * time.Millisecond)
	cl := r.client(0)
	tv := topologyVersionOf(t, cl.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}}))
	began := time.Now()
	affOK(t, cl.cmd(awaitHello(tv, 10000)))
	if d := time.Since(began); d < 550*time.Millisecond || d > 3*time.Second {
		t.Errorf("awaitable hello asking 10 s answered after %v, want hello_max_await (600ms)", d)
	}
	prev := cl.sendFlags(wire.FlagExhaustAllowed, awaitHello(tv, 10000))
	began = time.Now()
	for i := range 3 {
		m, err := cl.recvMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("streamed reply %d: %v", i, err)
		}
		if m.flags&wire.FlagMoreToCome == 0 || m.h.ResponseTo != prev {
			t.Fatalf("streamed reply %d: flags %v responseTo %d, want moreToCome answering %d", i, m.flags, m.h.ResponseTo, prev)
		}
		prev = m.h.RequestID
	}
	if d := time.Since(began); d < 1700*time.Millisecond || d > 5*time.Second {
		t.Errorf("3 streamed replies asking 10 s each in %v, want one per 600ms", d)
	}
}
