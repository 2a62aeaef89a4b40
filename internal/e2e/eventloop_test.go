package e2e

import (
	"reflect"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/wait"
)

// These tests cover what only the event loop does: they run on its two
// I/O models (loopIO) and turn the loop on themselves (withLoop).

func withLoop(mode string, size int) func(*config.Config) {
	return func(c *config.Config) {
		c.Global.EventLoop = true
		c.Global.PoolMode = config.PoolMode(mode)
		c.Global.MaxPoolSize = size
	}
}

// waitFor polls cond for up to 10s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	wait.Until(t, what, 10*time.Second, 5*time.Millisecond, cond)
}

// Idle clients cost no goroutine, and every one is still served, through a
// pool smaller than the number of clients (requests that must wait for a
// connection wait in the pool's queue while the client stays in the loop).
func TestEventLoopServesClientsWithoutGoroutines(t *testing.T) {
	loopIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		a, addr := bouncer(t, up.URI(), withLoop("statement", 2))
		base := runtime.NumGoroutine()
		const n = 60
		cls := make([]*rawClient, n)
		for i := range cls {
			cls[i] = dialRaw(t, addr)
			cls[i].hello()
			if r := cls[i].cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "test"}}); okOf(r) != 1 {
				t.Fatalf("ping %d: %v", i, r)
			}
		}
		// The loop's threads and sweeper are a handful; a goroutine per client
		// would be n more.
		waitFor(t, "clients handed to the loop", func() bool { return runtime.NumGoroutine() < base+n/4 })
		if got := a.Server().ClientCount(); got != n {
			t.Fatalf("%d clients, want %d", got, n)
		}
		var wg sync.WaitGroup
		errs := make(chan string, n)
		for i, cl := range cls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range 20 {
					r := cl.cmd(bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{bson.D{{Key: "i", Value: i*100 + j}}}}, {Key: "$db", Value: "test"}})
					if okOf(r) != 1 {
						errs <- r.String()
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Fatalf("insert failed: %s", e)
		}
		if got := len(up.Collection("test", "c")); got != n*20 {
			t.Fatalf("%d documents, want %d", got, n*20)
		}
		if st := a.Topologies()[0].Servers()[0].Pool().Stats(); st.Total > 2 {
			t.Fatalf("pool grew to %d connections, max 2", st.Total)
		}
	})
}

// A request in flight on the loop ends with a retryable error when the pool
// interrupts its connection: closing the socket alone would leave the loop
// waiting for a reply that never comes.
func TestEventLoopRequestInterruptedByPoolClear(t *testing.T) {
	loopIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		release := make(chan struct{})
		defer close(release)
		up.Handle("find", func(req *fakemongo.Request) fakemongo.Reply {
			select {
			case <-release:
			case <-time.After(20 * time.Second):
			}
			return up.Builtin(req)
		})
		a, addr := bouncer(t, up.URI(), withLoop("statement", 1))
		pl := a.Topologies()[0].Servers()[0].Pool()
		cl := dialRaw(t, addr)
		cl.hello()
		if r := cl.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "test"}}); okOf(r) != 1 {
			t.Fatal(r)
		}
		id := cl.send(0, bson.D{{Key: "find", Value: "c"}, {Key: "$db", Value: "test"}})
		waitFor(t, "the find to reach the upstream", func() bool { return up.Requests("find") == 1 })
		pl.Clear(true)
		rep, err := cl.tryRecv(5 * time.Second)
		if err != nil {
			t.Fatalf("no reply after the pool interrupted the request's connection: %v", err)
		}
		if rep.header.ResponseTo != id || okOf(rep.body) != 0 {
			t.Fatalf("reply %v to %d, want an error to %d", rep.body, rep.header.ResponseTo, id)
		}
		switch code := codeOf(rep.body); code {
		case 6, 89, 9001:
		default:
			t.Fatalf("code %d (%v), want a retryable network code", code, rep.body)
		}
		// The client stays connected and is served once the pool is ready again.
		waitFor(t, "the pool to be ready again", func() bool { return pl.Stats().State == pool.StateReady })
		if r := cl.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "test"}}); okOf(r) != 1 {
			t.Fatal(r)
		}
	})
}

// A client that does not read its reply never blocks the loop: what the
// socket does not take is written by a goroutine, and other clients are
// served meanwhile.
func TestEventLoopClientThatDoesNotReadBlocksNobody(t *testing.T) {
	loopIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		big := strings.Repeat("x", 15<<20)
		up.Handle("big", func(*fakemongo.Request) fakemongo.Reply {
			d := bsoncore.NewDocumentBuilder().AppendString("data", big).AppendDouble("ok", 1).Build()
			return fakemongo.Reply{Docs: []bsoncore.Document{d}}
		})
		_, addr := bouncer(t, up.URI(), withLoop("statement", 2))
		slow := dialRaw(t, addr)
		slow.hello()
		fast := dialRaw(t, addr)
		fast.hello()
		id := slow.send(0, bson.D{{Key: "big", Value: 1}, {Key: "$db", Value: "test"}})
		waitFor(t, "the big request to reach the upstream", func() bool { return up.Requests("big") == 1 })
		for range 50 {
			if r := fast.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "test"}}); okOf(r) != 1 {
				t.Fatal(r)
			}
		}
		rep := slow.recv()
		if rep.header.ResponseTo != id || okOf(rep.body) != 1 || len(rep.body.Lookup("data").StringValue()) != len(big) {
			t.Fatalf("big reply: responseTo %d (want %d), ok %v", rep.header.ResponseTo, id, okOf(rep.body))
		}
		if r := slow.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "test"}}); okOf(r) != 1 {
			t.Fatal(r)
		}
	})
}

// client_idle_timeout closes clients the loop holds, as the read deadline
// does for goroutine-served ones.
func TestEventLoopIdleTimeout(t *testing.T) {
	loopIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{})
		a, addr := bouncer(t, up.URI(), func(c *config.Config) {
			withLoop("transaction", 4)(c)
			c.Global.ClientIdleTimeout = 300 * time.Millisecond
		})
		cl := dialRaw(t, addr)
		cl.hello()
		if r := cl.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "test"}}); okOf(r) != 1 {
			t.Fatal(r)
		}
		busy := dialRaw(t, addr)
		busy.hello()
		start := time.Now()
		// A client that keeps sending is not idle: the pauses between its
		// requests, well under the timeout, are what is tested.
		for time.Since(start) < 700*time.Millisecond {
			if r := busy.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "test"}}); okOf(r) != 1 {
				t.Fatal(r)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if !cl.closed(3 * time.Second) {
			t.Fatal("idle client not closed")
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("idle client closed after %v, timeout 300ms", d)
		}
		if r := busy.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "test"}}); okOf(r) != 1 {
			t.Fatal(r)
		}
		waitFor(t, "the closed client to leave the count", func() bool { return a.Server().ClientCount() == 1 })
	})
}

// Requests that find no free connection wait in the pool's queue as
// callbacks, without a goroutine each: they are served in order when the
// connection comes back, a wait past wait_queue_timeout ends in a
// retryable error reply, and every client stays connected.
func TestEventLoopQueuedRequests(t *testing.T) {
	loopIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		release := make(chan struct{}, 1)
		up.Handle("find", func(req *fakemongo.Request) fakemongo.Reply {
			select {
			case <-release:
			case <-time.After(20 * time.Second):
			}
			return up.Builtin(req)
		})
		const wait = 300 * time.Millisecond
		a, addr := bouncer(t, up.URI(), func(c *config.Config) {
			withLoop("statement", 1)(c)
			c.Global.WaitQueueTimeout = wait
		})
		ping := bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "test"}}
		holder := dialRaw(t, addr)
		holder.hello()
		const n = 30
		cls := make([]*rawClient, n)
		for i := range cls {
			cls[i] = dialRaw(t, addr)
			cls[i].hello()
			if r := cls[i].cmd(ping); okOf(r) != 1 {
				t.Fatalf("ping %d: %v", i, r)
			}
		}

		// The only connection is busy: a lone request times out in the queue.
		holder.send(0, bson.D{{Key: "find", Value: "c"}, {Key: "$db", Value: "test"}})
		waitFor(t, "the find to reach the upstream", func() bool { return up.Requests("find") == 1 })
		start := time.Now()
		r := cls[0].cmd(ping)
		if took := time.Since(start); took < wait*3/4 || took > 10*time.Second {
			t.Fatalf("queued request ended after %v, want about %v", took, wait)
		}
		malCheckError(t, r, 89, "timed out waiting")

		// n requests queue behind it without a goroutine each, and are all
		// served once the connection comes back.
		base := runtime.NumGoroutine()
		ids := make([]int32, n)
		for i, cl := range cls {
			ids[i] = cl.send(0, ping)
		}
		pl := a.Topologies()[0].Servers()[0].Pool()
		waitFor(t, "the requests to queue in the pool", func() bool { return pl.Stats().Waiters == n })
		if g := runtime.NumGoroutine(); g > base+n/4 {
			t.Fatalf("%d goroutines with %d queued requests, %d before: a goroutine per wait", g, n, base)
		}
		release <- struct{}{}
		if rep, err := holder.tryRecv(5 * time.Second); err != nil || okOf(rep.body) != 1 {
			t.Fatalf("the find: %v %v", rep, err)
		}
		for i, cl := range cls {
			rep, err := cl.tryRecv(5 * time.Second)
			if err != nil {
				t.Fatalf("queued client %d: %v", i, err)
			}
			if rep.header.ResponseTo != ids[i] || okOf(rep.body) != 1 {
				t.Fatalf("queued client %d: %v to %d, want ok to %d", i, rep.body, rep.header.ResponseTo, ids[i])
			}
		}
		if got := up.MaxOpen(); got > 2 {
			t.Fatalf("upstream saw %d connections at once, want the pool's 1 and the monitor's", got)
		}
	})
}

// With the event loop on, pooled connections of routes the loop serves
// leave Go's netpoller (their raw socket is no longer the net package's);
// a session-mode route's, which the loop never serves, stay in it.
func TestEventLoopDetachesUpstreamsOfLoopRoutes(t *testing.T) {
	loopIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		for _, tc := range []struct {
			mode   string
			detach bool
		}{{"transaction", true}, {"statement", true}, {"session", false}} {
			t.Run(tc.mode, func(t *testing.T) {
				a, addr := bouncer(t, up.URI(), withLoop(tc.mode, 2))
				cl := dialRaw(t, addr)
				cl.hello()
				if r := cl.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "test"}}); okOf(r) != 1 {
					t.Fatal(r)
				}
				pl := a.Topologies()[0].Servers()[0].Pool()
				pc, err := pl.CheckOut(ctxT(t, 10*time.Second))
				if err != nil {
					t.Fatal(err)
				}
				defer pl.CheckIn(pc)
				rc, ok := pc.Upstream().RawConn()
				if !ok {
					t.Fatalf("%s mode: the pooled connection offers no raw socket", tc.mode)
				}
				if inNetpoller(rc) == tc.detach {
					t.Fatalf("%s mode: upstream raw socket is %T, want detached %v", tc.mode, rc, tc.detach)
				}
			})
		}
	})
}

// inNetpoller reports whether rc is the net package's own: a socket whose
// waits Go's netpoller does. A detached socket's is mongobouncer's.
func inNetpoller(rc syscall.RawConn) bool {
	t := reflect.TypeOf(rc)
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.PkgPath() == "net"
}
