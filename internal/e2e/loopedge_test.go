package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/app"
	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// sizedPing builds an OP_MSG ping on db "test" of exactly size bytes.
func sizedPing(t *testing.T, id int32, size int) []byte {
	t.Helper()
	for pad := 0; pad < size; pad++ {
		body := bson.D{{Key: "ping", Value: 1}, {Key: "p", Value: strings.Repeat("x", pad)}, {Key: "$db", Value: "test"}}
		m := wire.AppendMsg(nil, id, 0, 0, docOf(t, body))
		if len(m) == size {
			return m
		}
		if len(m) > size {
			break
		}
	}
	t.Fatalf("cannot build a %d-byte message", size)
	return nil
}

// A client that pipelines requests whose bytes fill the client's 512-byte
// inline buffer exactly, on a message boundary, with more still in the
// socket: every request must be answered.
func TestLoopPipelineThatFillsTheInlineBuffer(t *testing.T) {
	loopIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		_, addr := bouncer(t, up.URI(), withLoop("statement", 2))
		cl := dialRaw(t, addr)
		cl.hello()
		// The hand-over to the loop after the hello serves whatever came
		// meanwhile, so the loop serves this ping and the client stays
		// idle in the loop after it.
		if r := cl.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "test"}}); okOf(r) != 1 {
			t.Fatal(r)
		}
		const n = 12
		var all []byte
		for i := range n {
			all = append(all, sizedPing(t, int32(100+i), 128)...)
		}
		cl.sendRaw(all)
		for i := range n {
			rep, err := cl.tryRecv(3 * time.Second)
			if err != nil {
				t.Fatalf("reply %d of %d never came: %v", i+1, n, err)
			}
			if rep.header.ResponseTo != int32(100+i) || okOf(rep.body) != 1 {
				t.Fatalf("reply %d: %v to %d", i, rep.body, rep.header.ResponseTo)
			}
		}
	})
}

// Stress: clients pipeline requests of mixed sizes (some larger than the
// inline buffer, so they go through the goroutine), the upstream answers
// after random small delays, the pool (size 2) is cleared with
// interruptInUse now and then. Every request gets exactly one reply, in
// order, within the deadline.
func TestLoopPipelineStress(t *testing.T) {
	loopIO(t, func(t *testing.T) {
		t.Run("steady", func(t *testing.T) { loopPipelineStress(t, false) })
		t.Run("clearing", func(t *testing.T) { loopPipelineStress(t, true) })
	})
}

// loopPipelineStress is TestLoopPipelineStress, with the pool cleared with
// interruptInUse every 15ms when clearing.
func loopPipelineStress(t *testing.T, clearing bool) {
	up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
	var cnt atomic.Int64
	up.Handle("ping", func(req *fakemongo.Request) fakemongo.Reply {
		if cnt.Add(1)%3 == 0 {
			time.Sleep(time.Duration(cnt.Load()%4) * time.Millisecond)
		}
		return up.Builtin(req)
	})
	a, addr := bouncer(t, up.URI(), withLoop("statement", 2))
	pl := a.Topologies()[0].Servers()[0].Pool()
	stop := make(chan struct{})
	var clr sync.WaitGroup
	if clearing {
		clr.Add(1)
		go func() {
			defer clr.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(15 * time.Millisecond):
					pl.Clear(true)
				}
			}
		}()
	}
	const clients, rounds, per = 8, 15, 6
	var wg sync.WaitGroup
	errs := make(chan string, clients)
	for ci := range clients {
		cl := dialRaw(t, addr)
		cl.hello()
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(ci), 7))
			id := int32(1000)
			for r := range rounds {
				var all []byte
				var ids []int32
				for range 1 + rnd.IntN(per) {
					id++
					size := 40 + rnd.IntN(700)
					if size < 60 {
						size = 60
					}
					all = append(all, sizedPing(t, id, size)...)
					ids = append(ids, id)
				}
				cl.sendRaw(all)
				for k, want := range ids {
					rep, err := cl.tryRecv(3 * time.Second)
					if err != nil {
						errs <- fmt.Sprintf("client %d round %d: reply %d/%d: %v", ci, r, k+1, len(ids), err)
						return
					}
					if rep.header.ResponseTo != want {
						errs <- fmt.Sprintf("client %d round %d: reply to %d, want %d (%v)", ci, r, rep.header.ResponseTo, want, rep.body)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	clr.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if st := pl.Stats(); st.Total > 2 {
		t.Errorf("pool total %d", st.Total)
	}
}

// lenientBouncer is bouncer() whose clean-up Close is bounded by 1s and
// may fail, for tests that leave clients behind on purpose.
func lenientBouncer(t *testing.T, upstreamURI string, tweak func(*config.Config)) (*app.App, string) {
	t.Helper()
	a := newBouncer(t, upstreamURI, tweak, slog.LevelError)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = a.Close(ctx)
	})
	return a, a.Addrs()[0].String()
}

// heldFinds starts a fake upstream whose finds are answered only once
// release is called (or after 5s).
func heldFinds(t *testing.T) (up *fakemongo.Server, release func()) {
	up = fakemongo.Start(t, fakemongo.Options{InMemory: true})
	held := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(held) }) }
	t.Cleanup(release)
	up.Handle("find", func(req *fakemongo.Request) fakemongo.Reply {
		select {
		case <-held:
		case <-time.After(5 * time.Second):
		}
		return up.Builtin(req)
	})
	return up, release
}

// Server.Close bounded by a context that ends while a loop request is out
// on an upstream connection: the loops stop at the end of Close, with no
// thread left to receive the reply, so the request is abandoned: its
// connection closed (not left checked out) and its client finalized.
func TestLoopStoppedWithRequestInFlight(t *testing.T) {
	loopIO(t, func(t *testing.T) {
		up, rel := heldFinds(t)
		a, addr := lenientBouncer(t, up.URI(), withLoop("statement", 1))
		pl := a.Topologies()[0].Servers()[0].Pool()
		cl := dialRaw(t, addr)
		cl.hello()
		if r := cl.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "test"}}); okOf(r) != 1 {
			t.Fatal(r)
		}
		cl.send(0, bson.D{{Key: "find", Value: "c"}, {Key: "$db", Value: "test"}})
		waitFor(t, "the find to reach the upstream", func() bool { return up.Requests("find") == 1 })
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := a.Server().Close(ctx)
		cancel()
		if err == nil {
			t.Fatal("Close returned before the request in flight ended")
		}
		rel()
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) {
			if pl.Stats().InUse == 0 && a.Server().ClientCount() == 0 {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("3s after the upstream answered: pool InUse %d, clients %d; want 0 and 0 (connection leaked, client never finalized)",
			pl.Stats().InUse, a.Server().ClientCount())
	})
}

// Server.Close while a client's goroutine waits for a pool connection to
// forward a fire-and-forget (moreToCome) request: Close closes the
// goroutine's net.Conn; the goroutine, having nothing to write back, must
// not then hand the client to the loop (through the descriptor the loop
// kept from an earlier stay), where nobody would disconnect it.
func TestCloseWhileGoroutineWaitsToForward(t *testing.T) {
	loopIO(t, func(t *testing.T) {
		up, rel := heldFinds(t)
		a, addr := lenientBouncer(t, up.URI(), withLoop("statement", 1))
		ping := bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "test"}}
		holder := dialRaw(t, addr)
		holder.hello()
		x := dialRaw(t, addr)
		x.hello()
		if r := x.cmd(ping); okOf(r) != 1 { // x has been in the loop once
			t.Fatal(r)
		}
		holder.send(0, bson.D{{Key: "find", Value: "c"}, {Key: "$db", Value: "test"}})
		waitFor(t, "the find to reach the upstream", func() bool { return up.Requests("find") == 1 })
		x.send(wire.FlagMoreToCome, bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{bson.D{{Key: "a", Value: 1}}}}, {Key: "$db", Value: "test"}})
		pl := a.Topologies()[0].Servers()[0].Pool()
		waitFor(t, "x's goroutine to wait in the pool's queue", func() bool { return pl.Stats().Waiters == 1 })
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			done <- a.Server().Close(ctx)
		}()
		// Close disconnects every client in one pass: the holder, whose
		// request is out upstream, sees its socket shut down. x's socket
		// says nothing (the loop keeps a descriptor of it), but its
		// disconnect comes in the same pass, microseconds apart, while
		// what rel sets off (a reply, a check-in, a wake-up) takes far
		// longer.
		if !holder.closed(5 * time.Second) {
			t.Fatal("Close did not disconnect the holder")
		}
		rel()
		if err := <-done; err != nil {
			t.Fatalf("Close: %v; %d client(s) still connected (want every client disconnected); holder closed %v, x closed %v",
				err, a.Server().ClientCount(), holder.closed(200*time.Millisecond), x.closed(200*time.Millisecond))
		}
		if !x.closed(time.Second) {
			t.Fatal("client x still connected after Close")
		}
	})
}
