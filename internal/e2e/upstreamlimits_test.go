package e2e

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/hello"
	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// bgPinger is a client pinging on its own connection in the background.
type bgPinger struct {
	n    atomic.Int64 // pings answered ok
	stop chan struct{}
	done chan struct{}
	err  error // set before done is closed
}

func startBgPinger(t *testing.T, addr string) *bgPinger {
	p := &bgPinger{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.err = bgPingerer(addr, p.stop, &p.n)
	}()
	t.Cleanup(func() { p.end() })
	return p
}

func (p *bgPinger) end() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
}

// await waits until n pings have been answered; the pinger failing ends
// the wait and the test.
func (p *bgPinger) await(t *testing.T, n int64) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d pings of the concurrent client", n), func() bool {
		select {
		case <-p.done:
			return true
		default:
			return p.n.Load() >= n
		}
	})
	select {
	case <-p.done:
		t.Fatalf("concurrent client failed after %d pings: %v", p.n.Load(), p.err)
	default:
	}
}

// finish stops the pinger and fails the test if it had failed.
func (p *bgPinger) finish(t *testing.T) {
	t.Helper()
	p.end()
	if p.err != nil {
		t.Fatalf("concurrent client failed after %d pings: %v", p.n.Load(), p.err)
	}
}

// bgPingerer sends pings on its own connection until stop is closed and
// returns the first failure: it runs off the test goroutine, so it reports
// errors instead of failing the test.
func bgPingerer(addr string, stop <-chan struct{}, n *atomic.Int64) error {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	var buf []byte
	roundTrip := func(id int32, body bson.D) (bson.Raw, error) {
		doc, err := bson.Marshal(body)
		if err != nil {
			return nil, err
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write(wire.AppendMsg(nil, id, 0, 0, doc)); err != nil {
			return nil, err
		}
		msg, err := wire.ReadMessage(c, buf[:0], wire.DefaultMaxMessageSize)
		if err != nil {
			return nil, err
		}
		buf = msg[:0]
		m, err := wire.ParseMsg(msg)
		if err != nil {
			return nil, err
		}
		if h, _ := wire.ParseHeader(msg); h.ResponseTo != id {
			return nil, fmt.Errorf("responseTo %d, want %d", h.ResponseTo, id)
		}
		return bson.Raw(m.Body), nil
	}
	if _, err := roundTrip(1, bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}}); err != nil {
		return err
	}
	for id := int32(2); ; id++ {
		select {
		case <-stop:
			return nil
		default:
		}
		r, err := roundTrip(id, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "test"}})
		if err != nil {
			return err
		}
		if okOf(r) != 1 {
			return errors.New(r.String())
		}
		n.Add(1)
	}
}

// The upstream's maxMessageSizeBytes, smaller than max_message_size, is
// what hello advertises and what the proxy enforces on clients that have
// done their hello: a larger message gets a ProtocolError naming the limit
// and the client is closed, before anything reaches the upstream, while
// another client carries on.
func TestUpstreamMaxMessageSizeEnforcedOnClients(t *testing.T) {
	const upLimit = 64 << 10
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true, MaxMessageSizeBytes: upLimit})
		a, addr := bouncer(t, up.URI(), func(c *config.Config) {
			c.Global.PoolMode = "statement"
			c.Global.MaxPoolSize = 2
			// Far above the upstream's: only the upstream's limit can
			// refuse the test's message.
			c.Global.MaxMessageSize = config.MaxMaxMessageSize
		})
		waitUsable(t, a, 1)

		bad := dialRaw(t, addr)
		if v, _ := bad.hello().Lookup("maxMessageSizeBytes").AsInt64OK(); v != upLimit {
			t.Fatalf("hello advertises maxMessageSizeBytes %d, want the upstream's %d", v, upLimit)
		}
		good := dialRaw(t, addr)
		good.hello()
		// A message just under the upstream's limit goes through.
		under := limInsert("big", bson.D{{Key: "_id", Value: 1}, {Key: "s", Value: strings.Repeat("u", upLimit-1024)}})
		if n := len(wire.AppendMsg(nil, 1, 0, 0, docOf(t, under))); n > upLimit {
			t.Fatalf("test message is %d bytes, want under %d", n, upLimit)
		}
		if r := good.cmd(under); okOf(r) != 1 {
			t.Fatalf("message under the upstream's limit: %v", r)
		}

		// Another client pings all along.
		pinger := startBgPinger(t, addr)
		pinger.await(t, 5)

		over := wire.AppendMsg(nil, 77, 0, 0, docOf(t,
			limInsert("big", bson.D{{Key: "_id", Value: 2}, {Key: "s", Value: strings.Repeat("o", 2*upLimit)}})))
		if len(over) <= upLimit || len(over) >= 4*upLimit {
			t.Fatalf("test message is %d bytes", len(over))
		}
		wrote := make(chan struct{})
		go func() {
			defer close(wrote)
			_ = bad.c.SetWriteDeadline(time.Now().Add(10 * time.Second))
			_, _ = bad.c.Write(over) // may fail once the proxy closes: expected
		}()
		rep, err := malRecv(bad.c, 10*time.Second)
		<-wrote
		if err != nil {
			t.Fatalf("message over the upstream's limit: want an error reply, got %v", err)
		}
		if rep.op != wire.OpMsg || rep.responseTo != 77 {
			t.Fatalf("reply %v to %d, want OP_MSG to 77", rep.op, rep.responseTo)
		}
		malCheckError(t, rep.body, 17, fmt.Sprint(upLimit))
		if !bad.closed(5 * time.Second) {
			t.Fatal("client still connected after a message over the upstream's limit")
		}

		pinger.await(t, pinger.n.Load()+5)
		pinger.finish(t)
		if r := good.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "test"}}); okOf(r) != 1 {
			t.Fatalf("well-behaved client after the oversized message: %v", r)
		}
		if n := len(up.Collection("test", "big")); n != 1 {
			t.Fatalf("upstream holds %d documents, want only the one under the limit", n)
		}
		if n := up.Requests("insert"); n != 1 {
			t.Fatalf("upstream saw %d inserts, want 1: the oversized one must not be forwarded", n)
		}
	})
}

// maxWireVersion is min(ours, the upstream's): an upstream newer than
// mongobouncer is advertised as what mongobouncer understands.
func TestMaxWireVersionCappedForNewerUpstream(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{MaxWireVersion: hello.MaxWireVersion + 5})
		a, addr := bouncer(t, up.URI(), nil)
		waitUsable(t, a, 1)
		if h := a.Topologies()[0].Servers()[0].Hello(); h == nil || h.MaxWireVersion != hello.MaxWireVersion+5 {
			t.Fatalf("upstream hello %+v, want maxWireVersion %d", h, hello.MaxWireVersion+5)
		}
		for _, name := range []string{"hello", "isMaster"} {
			c := dialRaw(t, addr)
			r := c.cmd(bson.D{{Key: name, Value: 1}, {Key: "$db", Value: "admin"}})
			if v, ok := r.Lookup("maxWireVersion").AsInt64OK(); !ok || v != hello.MaxWireVersion {
				t.Fatalf("%s advertises maxWireVersion %v, want ours %d (the upstream's is %d)",
					name, r.Lookup("maxWireVersion"), hello.MaxWireVersion, hello.MaxWireVersion+5)
			}
		}
	})
}

// A request waiting for an upstream connection on a client goroutine gets a
// retryable HostUnreachable (code 6) saying the pool was cleared when the
// pool is cleared under it; the client stays connected and is served once
// the pool is ready again. Both ways a request reaches a goroutine are
// covered: the event loop off, and session mode (which the loop never
// serves).
func TestPoolClearedWhileWaitingOnGoroutine(t *testing.T) {
	oneIO(t) // each case sets event_loop itself
	for _, tc := range []struct {
		name string
		loop bool
		mode string
	}{
		{"goroutines-statement", false, "statement"},
		{"eventloop-session", true, "session"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
			release := make(chan struct{})
			var once sync.Once
			unblock := func() { once.Do(func() { close(release) }) }
			up.Handle("find", func(req *fakemongo.Request) fakemongo.Reply {
				select {
				case <-release:
				case <-time.After(20 * time.Second):
				}
				return up.Builtin(req)
			})
			a, addr := bouncer(t, up.URI(), func(c *config.Config) {
				c.Global.EventLoop = tc.loop
				c.Global.PoolMode = config.PoolMode(tc.mode)
				c.Global.MaxPoolSize = 1
				// No heartbeat during the test: nothing but the test makes
				// the pool ready again, so the proxy's one retry on a pool
				// that is ready again already cannot hide the error.
				c.Global.HeartbeatInterval = time.Minute
			})
			t.Cleanup(unblock) // before the bouncer closes: it waits for the find
			waitUsable(t, a, 1)
			pl := a.Topologies()[0].Servers()[0].Pool()

			holder := dialRaw(t, addr)
			holder.hello()
			hid := holder.send(0, bson.D{{Key: "find", Value: "c"}, {Key: "$db", Value: "test"}})
			waitFor(t, "the find to hold the only connection", func() bool { return up.Requests("find") == 1 })

			waiter := dialRaw(t, addr)
			waiter.hello()
			wid := waiter.send(0, bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{bson.D{{Key: "x", Value: 1}}}}, {Key: "$db", Value: "test"}})
			waitFor(t, "the insert to wait in the pool's queue", func() bool { return pl.Stats().Waiters == 1 })
			pl.Clear(false)

			rep, err := waiter.tryRecv(5 * time.Second)
			if err != nil {
				t.Fatalf("no reply to the waiting request after the pool was cleared: %v", err)
			}
			if rep.header.ResponseTo != wid {
				t.Fatalf("reply to %d, want %d", rep.header.ResponseTo, wid)
			}
			malCheckError(t, rep.body, 6, "upstream pool was cleared")
			if name, _ := rep.body.Lookup("codeName").StringValueOK(); name != "HostUnreachable" {
				t.Fatalf("codeName %q, want HostUnreachable: %v", name, rep.body)
			}
			if labels := limLabels(rep.body); len(labels) != 1 || labels[0] != "RetryableWriteError" {
				t.Fatalf("labels %v, want [RetryableWriteError]: %v", labels, rep.body)
			}
			if n := up.Requests("insert"); n != 0 {
				t.Fatalf("the failed insert reached the upstream %d times", n)
			}

			// The request in flight was not interrupted (Clear(false)).
			unblock()
			if r := holder.recv(); r.header.ResponseTo != hid || okOf(r.body) != 1 {
				t.Fatalf("find: %v to %d, want ok to %d", r.body, r.header.ResponseTo, hid)
			}
			// Both clients are still connected and served once the pool is
			// ready again, as the next heartbeat would make it. The holder
			// goes first and then leaves: in session mode it keeps the only
			// connection while connected.
			if err := pl.Ready(); err != nil {
				t.Fatal(err)
			}
			if state := pl.Stats().State; state != pool.StateReady {
				t.Fatalf("pool %v after Ready", state)
			}
			if r := holder.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "test"}}); okOf(r) != 1 {
				t.Fatalf("holder after the clear: %v", r)
			}
			holder.c.Close()
			if r := waiter.cmd(bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{bson.D{{Key: "x", Value: 2}}}}, {Key: "$db", Value: "test"}}); okOf(r) != 1 {
				t.Fatalf("retry after the pool is ready: %v", r)
			}
		})
	}
}
