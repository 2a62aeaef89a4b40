package proxy

// The loop path's depth: pipelined requests served by iteration, and a
// drain that waits for the rest of a reply.

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// depthObserver records the deepest call stack a Request report was made
// from: the loop reports a request from inside its handling of it.
type depthObserver struct {
	nopObserver
	mu       sync.Mutex
	pcs      []uintptr
	max      int
	requests atomic.Int64
}

func (o *depthObserver) Request(string, string, int, int, time.Duration, bool) {
	o.mu.Lock()
	if o.pcs == nil {
		o.pcs = make([]uintptr, 1<<16)
	}
	if n := runtime.Callers(0, o.pcs); n > o.max {
		o.max = n
	}
	o.mu.Unlock()
	o.requests.Add(1)
}

// A client that pipelines many requests, each failed at once (the pool is
// paused while the server is still selectable), is served by iteration:
// the loop's stack does not grow with the number of requests it has
// received, which with enough of them would overflow the loop thread's
// stack and end the process.
func TestLoopPipelinedRequestsDoNotRecurse(t *testing.T) {
	eachDriver(t, func(t *testing.T, io config.EventLoopIO) {
		r := newLoopRig(t, io, 1, func(req *fakemongo.Request) fakemongo.Reply { return fakemongo.OK() })
		obs := &depthObserver{}
		r.s.opts.Observer = obs
		cl := r.client(0)
		c := r.only()
		r.waitState(c, lsIdle)
		affOK(t, cl.cmd(ping()))
		r.waitState(c, lsIdle)
		// Paused, the pool fails every checkout at once; the server stays
		// selectable until the next heartbeat, so the loop keeps the
		// requests.
		r.route.Topology.Servers()[0].Pool().Clear(false)
		const n = 1000
		body := mustDoc(t, ping())
		var msgs []byte
		for i := range n {
			msgs = wire.AppendMsg(msgs, int32(100+i), 0, 0, body)
		}
		_ = cl.c.SetDeadline(time.Now().Add(20 * time.Second))
		werr := make(chan error, 1)
		go func() {
			_, err := cl.c.Write(msgs)
			werr <- err
		}()
		for i := range n {
			rep, err := wire.ReadMessage(cl.c, nil, wire.DefaultMaxMessageSize)
			if err != nil {
				t.Fatalf("reply %d: %v", i, err)
			}
			if h, _ := wire.ParseHeader(rep); h.ResponseTo != int32(100+i) {
				t.Fatalf("reply %d answers %d", i, h.ResponseTo)
			}
		}
		if err := <-werr; err != nil {
			t.Fatal(err)
		}
		obs.mu.Lock()
		depth := obs.max
		obs.mu.Unlock()
		t.Logf("%d requests reported, deepest report %d frames", obs.requests.Load(), depth)
		if depth > 200 {
			t.Fatalf("a request was reported %d frames deep: the loop recursed over pipelined requests", depth)
		}
	})
}

// A reply the loop could not write whole is finished by a goroutine; until
// it is, the request is not over, and Shutdown's drain waits for it rather
// than cutting the reply short.
func TestLoopDrainWaitsForTheRestOfAReply(t *testing.T) {
	eachDriver(t, func(t *testing.T, io config.EventLoopIO) {
		r, cl, _, big := stalledBigReply(t, io)
		if r.s.drained() {
			t.Fatal("drained while the rest of a reply is still to be written")
		}
		shut := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			shut <- r.s.Shutdown(ctx)
		}()
		_ = cl.c.SetDeadline(time.Now().Add(10 * time.Second))
		rep, err := wire.ReadMessage(cl.c, nil, wire.DefaultMaxMessageSize)
		if err != nil {
			t.Fatalf("the reply was cut short: %v", err)
		}
		m, err := wire.ParseMsg(rep)
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := bson.Raw(m.Body).Lookup("big").StringValueOK(); got != big {
			t.Fatalf("%d bytes of big, want %d", len(got), len(big))
		}
		if err := <-shut; err != nil {
			t.Fatalf("shutdown: %v", err)
		}
	})
}
