package proxy

// Panic isolation (recover.go): a panic while serving one client ends that
// client only, on every I/O model and on both paths (the client's
// goroutine, the loop thread).

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
	"go.uber.org/goleak"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/wait"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// panicCommand is the command the tests' hook panics on.
const panicCommand = "mongobouncerTestPanic"

// panicObserver counts ClientPanicked by path.
type panicObserver struct {
	nopObserver
	mu    sync.Mutex
	paths map[string]int
}

func (o *panicObserver) ClientPanicked(path string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.paths == nil {
		o.paths = map[string]int{}
	}
	o.paths[path]++
}

func (o *panicObserver) count(path string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.paths[path]
}

// syncBuffer is a log sink for several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// setPanicHook makes the request path panic at point at on panicCommand,
// recording the panicking stack, until the test ends; before, it calls
// before, if set, with the client's lock held (on the loop). A non-nil
// func before returns is deferred by the panicking frame: it runs as the
// panic unwinds it, as a deferred unlock does.
func setPanicHook(t *testing.T, at string, before func() (deferred func())) *atomic.Pointer[string] {
	var stack atomic.Pointer[string]
	hook := func(point, cmd string) {
		if point == at && cmd == panicCommand {
			s := string(debug.Stack())
			stack.Store(&s)
			if before != nil {
				if d := before(); d != nil {
					defer d()
				}
			}
			panic("test panic at " + at)
		}
	}
	testPanicHook.Store(&hook)
	t.Cleanup(func() { testPanicHook.Store(nil) })
	return &stack
}

// roundTrip sends one command on nc and reads its reply, without failing
// the test: for a goroutine of the test.
func roundTrip(nc net.Conn, id int32, body bson.D) error {
	doc, err := bson.Marshal(body)
	if err != nil {
		return err
	}
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := nc.Write(wire.AppendMsg(nil, id, 0, 0, doc)); err != nil {
		return err
	}
	rep, err := wire.ReadMessage(nc, nil, wire.DefaultMaxMessageSize)
	if err != nil {
		return err
	}
	if got := int32(binary.LittleEndian.Uint32(rep[8:])); got != id {
		return fmt.Errorf("reply to %d, want %d", got, id)
	}
	_, b := wire.ReplyView(rep)
	if ok, _ := bson.Raw(b).Lookup("ok").AsFloat64OK(); ok != 1 {
		return fmt.Errorf("error reply %s", bson.Raw(b))
	}
	return nil
}

// A panic while serving one client, on its goroutine (holding the
// request's upstream connection) or on the loop thread (before the
// checkout, and holding the connection with the reply in hand), ends that
// client only: it is logged at error level with its stack and counted,
// the client's connection is closed and the upstream connection it held
// is closed rather than pooled, while a concurrent client keeps being
// served on the same loop thread, new clients are accepted, no goroutine
// is left behind and Close completes.
func TestPanicEndsOnlyItsClient(t *testing.T) {
	eachModel(t, func(t *testing.T, o rigOptions) {
		points := []string{"relay"}
		if o.loop {
			// relay: a request the loop hands to the client's goroutine.
			points = []string{"relay", "loop-request", "loop-sent", "loop-reply"}
		}
		for _, at := range points {
			t.Run(at, func(t *testing.T) { testPanicAt(t, o, at, "") })
		}
	})
}

// A panic inside a critical section of the client's sessMu (or, on its
// goroutine, ownMu), which unlocks by a defer as every one of them does
// (lockrule_test.go), leaves the lock unlocked as it unwinds: the
// recovery takes it as usual, and the rest is as above; the loop thread
// goes on.
func TestPanicInsideACriticalSection(t *testing.T) {
	eachModel(t, func(t *testing.T, o rigOptions) {
		cases := [][2]string{{"relay", "sessMu"}, {"relay", "ownMu"}}
		if o.loop {
			cases = append(cases, [2]string{"loop-reply", "sessMu"})
		}
		for _, tc := range cases {
			t.Run(tc[0]+"/"+tc[1], func(t *testing.T) { testPanicAt(t, o, tc[0], tc[1]) })
		}
	})
}

// testPanicAt panics at point at, inside a critical section of the
// victim's lock leave ("sessMu", "ownMu") when set: the panicking frame
// holds it, and unlocks it by a defer.
func testPanicAt(t *testing.T, o rigOptions, at, leave string) {
	ignore := goleak.IgnoreCurrent()
	// Registered first, so it runs last: after the rig's Close.
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })

	var errClosed atomic.Int32
	o.monitor = pool.MonitorFunc(func(e pool.Event) {
		if e.Type == pool.ConnectionClosed && e.Reason == pool.ReasonError && errors.Is(e.Err, errPanicked) {
			errClosed.Add(1)
		}
	})
	obs := &panicObserver{}
	o.observer = obs
	var logs syncBuffer
	o.log = slog.New(slog.NewTextHandler(&logs, nil))
	o.maxPool = 2
	o.threads = 1 // every client on the one loop thread
	r := newRig(t, o, func(*fakemongo.Request) fakemongo.Reply { return fakemongo.OK() })
	r.up.Handle(panicCommand, func(*fakemongo.Request) fakemongo.Reply {
		// Late enough that the loop's send cannot meet the reply in the
		// same turn (epoll reads it at once when it is there): at
		// loop-sent the request must still be out.
		time.Sleep(50 * time.Millisecond)
		return fakemongo.OK()
	})
	var victimC atomic.Pointer[client]
	var state atomic.Int32 // the victim's loop state at the panic
	stack := setPanicHook(t, at, func() func() {
		vc := victimC.Load()
		// The panicking loop code holds the client's ownMu.
		state.Store(int32(vc.lc.State))
		switch leave {
		case "sessMu":
			vc.sess.Mu.Lock()
			return vc.sess.Mu.Unlock
		case "ownMu":
			vc.lc.Mu.Lock()
			return vc.lc.Mu.Unlock
		}
		return nil
	})

	// Two idle connections: the victim's checkout is served at once while
	// the other client holds one (loop-sent finds the request out).
	p := r.route.Topology.Servers()[0].Pool()
	var pcs []*pool.Conn
	for range 2 {
		pc, err := p.CheckOut(ctxFor(t, 10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		pcs = append(pcs, pc)
	}
	for _, pc := range pcs {
		_ = p.CheckIn(pc)
	}

	victim := r.client(0)
	vc := r.only()
	victimC.Store(vc)
	other := r.client(0)
	if o.loop {
		// The victim's request arrives on the loop, not on the hand-over.
		r.waitState(vc, lsIdle)
	}

	// The other client runs commands throughout.
	var served atomic.Int64
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		for id := int32(100); ; id++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			if err := roundTrip(other.c, id, ping()); err != nil {
				done <- err
				return
			}
			served.Add(1)
		}
	}()
	wait.Until(t, "the other client served", 10*time.Second, time.Millisecond, func() bool { return served.Load() > 10 })

	// The victim's command panics: its connection is closed, no reply.
	victim.id++
	_ = victim.c.SetDeadline(time.Now().Add(10 * time.Second))
	onLoop := o.loop && at != "relay"
	var flags wire.MsgFlags
	if !onLoop {
		// exhaustAllowed: a request the loop leaves to the goroutine.
		flags = wire.FlagExhaustAllowed
	}
	if _, err := victim.c.Write(wire.AppendMsg(nil, victim.id, 0, flags, mustDoc(t, bson.D{{Key: panicCommand, Value: 1}, {Key: "$db", Value: "test"}}))); err != nil {
		t.Fatal(err)
	}
	if rep, err := wire.ReadMessage(victim.c, nil, wire.DefaultMaxMessageSize); err == nil {
		t.Fatalf("the panicking client got a reply %x, want its connection closed", rep)
	} else if isTimeout(err) {
		t.Fatal("the panicking client's connection is still open")
	}

	s := stack.Load()
	if s == nil {
		t.Fatalf("the hook did not run at %s", at)
	}
	onLoopThread := strings.Contains(*s, "(*epollDriver).run") || strings.Contains(*s, "(*ringDriver).run")
	if onLoopThread != onLoop {
		t.Fatalf("panic at %s on a loop thread: %v, want %v; stack:\n%s", at, onLoopThread, onLoop, *s)
	}
	path := "goroutine"
	if onLoop {
		path = "loop"
		want := map[string]loopState{"loop-request": lsIdle, "loop-sent": lsUpstream, "loop-reply": lsUpstream}[at]
		if got := loopState(state.Load()); got != want {
			t.Fatalf("the client was in loop state %d at the panic, want %d", got, want)
		}
	}
	if r.s.Panics() != 1 || obs.count(path) != 1 {
		t.Fatalf("Panics() = %d, observer's %q = %d; want 1 and 1", r.s.Panics(), path, obs.count(path))
	}
	if l := logs.String(); !strings.Contains(l, "level=ERROR") || !strings.Contains(l, "test panic at "+at) || !strings.Contains(l, "proxy.panicPoint") {
		t.Fatalf("the panic is not logged at error level with its stack:\n%s", l)
	}

	// The other client goes on, on the same loop thread.
	after := served.Load()
	wait.Until(t, "the other client served after the panic", 10*time.Second, time.Millisecond, func() bool { return served.Load() > after+10 })
	close(stop)
	if err := <-done; err != nil {
		t.Fatalf("the other client: %v", err)
	}
	// A new client is served.
	late := r.client(0)
	affOK(t, late.cmd(ping()))
	affOK(t, other.cmd(ping()))

	// The victim is gone from the server, and what it held with it: the
	// connection its request held is closed, not pooled.
	wait.Until(t, "the victim gone", 10*time.Second, time.Millisecond, func() bool { return r.s.ClientCount() == 2 })
	for _, c := range r.s.snapshot() {
		if c == vc {
			t.Fatal("the panicking client is still in the server's set")
		}
	}
	wait.Until(t, "no connection in use", 10*time.Second, time.Millisecond, func() bool { return r.inUse() == 0 })
	if held := r.route.Held(); held != 0 {
		t.Fatalf("route holds %d connections, want 0", held)
	}
	wantClosed := int32(1)
	if at == "loop-request" {
		wantClosed = 0 // the panic came before the checkout
	}
	if got := errClosed.Load(); got != wantClosed {
		t.Fatalf("%d upstream connections closed for the panic, want %d", got, wantClosed)
	}
	r.waitState(vc, lsClosed)
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// A panic on the loop while the client's request waits in the pool's queue
// (lsWaiting) ends the client; the connection its queued checkout is
// later handed goes back to the pool unused, and serves the next request.
func TestPanicWhileWaitingForAConnection(t *testing.T) {
	eachDriver(t, func(t *testing.T, io config.EventLoopIO) {
		ignore := goleak.IgnoreCurrent()
		t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
		var errClosed atomic.Int32
		release := make(chan struct{})
		var once sync.Once
		unblock := func() { once.Do(func() { close(release) }) }
		t.Cleanup(unblock)
		r := newRig(t, rigOptions{loop: true, io: io, maxPool: 1, threads: 1,
			monitor: pool.MonitorFunc(func(e pool.Event) {
				if e.Type == pool.ConnectionClosed && e.Reason == pool.ReasonError {
					errClosed.Add(1)
				}
			})}, func(*fakemongo.Request) fakemongo.Reply { return fakemongo.OK() })
		r.up.Handle("hold", func(*fakemongo.Request) fakemongo.Reply {
			<-release
			return fakemongo.OK()
		})
		var victimC atomic.Pointer[client]
		var state atomic.Int32
		setPanicHook(t, "loop-sent", func() func() { state.Store(int32(victimC.Load().lc.State)); return nil })

		victim := r.client(0)
		vc := r.only()
		victimC.Store(vc)
		holder := r.client(0)
		r.waitState(vc, lsIdle)

		// The holder's request takes the pool's only connection.
		holder.id++
		if _, err := holder.c.Write(wire.AppendMsg(nil, holder.id, 0, 0, mustDoc(t, bson.D{{Key: "hold", Value: 1}, {Key: "$db", Value: "test"}}))); err != nil {
			t.Fatal(err)
		}
		wait.Until(t, "the connection held", 10*time.Second, time.Millisecond, func() bool { return r.inUse() == 1 })

		victim.id++
		_ = victim.c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := victim.c.Write(wire.AppendMsg(nil, victim.id, 0, 0, mustDoc(t, bson.D{{Key: panicCommand, Value: 1}, {Key: "$db", Value: "test"}}))); err != nil {
			t.Fatal(err)
		}
		if _, err := wire.ReadMessage(victim.c, nil, wire.DefaultMaxMessageSize); err == nil || isTimeout(err) {
			t.Fatalf("the panicking client: %v, want its connection closed", err)
		}
		if got := loopState(state.Load()); got != lsWaiting {
			t.Fatalf("the client was in loop state %d at the panic, want lsWaiting (%d)", got, lsWaiting)
		}
		r.waitState(vc, lsClosed)

		// The held connection goes to the closed client's queued checkout,
		// which gives it back: the holder, and a new client, are served.
		unblock()
		_ = holder.c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := wire.ReadMessage(holder.c, nil, wire.DefaultMaxMessageSize); err != nil {
			t.Fatalf("the holder's reply: %v", err)
		}
		affOK(t, holder.cmd(ping()))
		late := r.client(0)
		affOK(t, late.cmd(ping()))
		wait.Until(t, "no connection in use", 10*time.Second, time.Millisecond, func() bool { return r.inUse() == 0 })
		if r.s.Panics() != 1 {
			t.Fatalf("Panics() = %d, want 1", r.s.Panics())
		}
		if n := errClosed.Load(); n != 0 {
			t.Fatalf("%d connections closed; the queued checkout's, never used, should have gone back", n)
		}
		if st := r.route.Topology.Servers()[0].Pool().Stats(); st.Total != 1 {
			t.Fatalf("pool has %d connections, want the one", st.Total)
		}
	})
}

// A panic in the middle of a transaction, on the connection pinned to it,
// closes that connection (never pooled, never kept pinned: a request may
// be half sent on it), aborts the transaction upstream on another one,
// and leaves nothing held, on every I/O model.
func TestPanicInATransactionClosesItsPin(t *testing.T) {
	eachModel(t, func(t *testing.T, o rigOptions) {
		ignore := goleak.IgnoreCurrent()
		t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
		var errClosed atomic.Int32
		o.monitor = pool.MonitorFunc(func(e pool.Event) {
			if e.Type == pool.ConnectionClosed && e.Reason == pool.ReasonError && errors.Is(e.Err, errPanicked) {
				errClosed.Add(1)
			}
		})
		o.maxPool = 2
		r := newRig(t, o, func(*fakemongo.Request) fakemongo.Reply { return fakemongo.OK() })
		r.up.Handle("find", func(*fakemongo.Request) fakemongo.Reply { return fakemongo.OK() })
		r.up.Handle(panicCommand, func(*fakemongo.Request) fakemongo.Reply {
			// Late enough that the loop's send cannot meet the reply in the
			// same turn (epoll reads it at once when it is there): at
			// loop-sent the request must still be out.
			time.Sleep(50 * time.Millisecond)
			return fakemongo.OK()
		})
		var aborts atomic.Int32
		r.up.Handle("abortTransaction", func(*fakemongo.Request) fakemongo.Reply {
			aborts.Add(1)
			return fakemongo.OK()
		})
		setPanicHook(t, "relay", nil)
		victim := r.client(0)
		vc := r.only()
		lsid := bson.Binary{Subtype: 4, Data: bytes.Repeat([]byte{7}, 16)}
		txn := func(cmd string, first bool) bson.D {
			d := bson.D{{Key: cmd, Value: "c"}, {Key: "lsid", Value: bson.D{{Key: "id", Value: lsid}}},
				{Key: "txnNumber", Value: int64(1)}, {Key: "autocommit", Value: false}, {Key: "$db", Value: "test"}}
			if first {
				d = append(d, bson.E{Key: "startTransaction", Value: true})
			}
			return d
		}
		affOK(t, victim.cmd(txn("find", true)))
		if !vc.sess.HasPin() {
			t.Fatal("no pin after a transaction's first command")
		}
		victim.id++
		_ = victim.c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := victim.c.Write(wire.AppendMsg(nil, victim.id, 0, 0, mustDoc(t, txn(panicCommand, false)))); err != nil {
			t.Fatal(err)
		}
		if _, err := wire.ReadMessage(victim.c, nil, wire.DefaultMaxMessageSize); err == nil || isTimeout(err) {
			t.Fatalf("the panicking client: %v, want its connection closed", err)
		}
		r.waitState(vc, lsClosed)
		wait.Until(t, "the transaction aborted", 10*time.Second, time.Millisecond, func() bool { return aborts.Load() == 1 })
		wait.Until(t, "no connection in use", 10*time.Second, time.Millisecond, func() bool { return r.inUse() == 0 })
		if held := r.route.Held(); held != 0 {
			t.Fatalf("route holds %d connections, want 0", held)
		}
		if n := errClosed.Load(); n != 1 {
			t.Fatalf("%d connections closed for the panic, want the pinned one", n)
		}
		if r.s.Panics() != 1 {
			t.Fatalf("Panics() = %d, want 1", r.s.Panics())
		}
		other := r.client(0)
		affOK(t, other.cmd(ping()))
	})
}

// panickyAdmin is an AdminHandler that panics on one command.
type panickyAdmin struct{}

func (panickyAdmin) HandleAdmin(_ net.Addr, body bsoncore.Document) bsoncore.Document {
	if name, _ := body.Index(0).KeyErr(); name == "boom" {
		panic("test panic in an admin command")
	}
	return mustDocT(bson.D{{Key: "ok", Value: 1}})
}

func mustDocT(v bson.D) bsoncore.Document {
	b, err := bson.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// Admin commands run on the client's goroutine, in every I/O model: a
// panic in one ends that client only.
func TestPanicInAnAdminCommand(t *testing.T) {
	eachModel(t, func(t *testing.T, o rigOptions) {
		ignore := goleak.IgnoreCurrent()
		t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
		obs := &panicObserver{}
		o.observer, o.admin, o.maxPool = obs, panickyAdmin{}, 2
		r := newRig(t, o, func(*fakemongo.Request) fakemongo.Reply { return fakemongo.OK() })
		victim := r.client(0)
		other := r.client(0)
		affOK(t, victim.cmd(bson.D{{Key: "showPools", Value: 1}, {Key: "$db", Value: AdminDatabase}}))
		victim.id++
		_ = victim.c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := victim.c.Write(wire.AppendMsg(nil, victim.id, 0, 0, mustDoc(t, bson.D{{Key: "boom", Value: 1}, {Key: "$db", Value: AdminDatabase}}))); err != nil {
			t.Fatal(err)
		}
		if _, err := wire.ReadMessage(victim.c, nil, wire.DefaultMaxMessageSize); err == nil || isTimeout(err) {
			t.Fatalf("the panicking client: %v, want its connection closed", err)
		}
		if r.s.Panics() != 1 || obs.count("goroutine") != 1 {
			t.Fatalf("Panics() = %d, goroutine path %d; want 1 and 1", r.s.Panics(), obs.count("goroutine"))
		}
		affOK(t, other.cmd(ping()))
		affOK(t, other.cmd(bson.D{{Key: "showPools", Value: 1}, {Key: "$db", Value: AdminDatabase}}))
		wait.Until(t, "the victim gone", 10*time.Second, time.Millisecond, func() bool { return r.s.ClientCount() == 1 })
	})
}
