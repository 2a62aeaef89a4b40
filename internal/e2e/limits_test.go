package e2e

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.uber.org/goleak"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// This file checks the client-facing limits end to end: max_client_conn,
// client_idle_timeout, max_message_size and wait_queue_timeout. Helpers
// come from malformed_test.go (mal*).

func limHello() bson.D {
	return bson.D{{Key: "hello", Value: 1}, {Key: "helloOk", Value: true}, {Key: "$db", Value: "admin"}}
}

func limInsert(coll string, docs ...bson.D) bson.D {
	arr := bson.A{}
	for _, d := range docs {
		arr = append(arr, d)
	}
	return bson.D{{Key: "insert", Value: coll}, {Key: "documents", Value: arr}, {Key: "$db", Value: "test"}}
}

func limLabels(body bson.Raw) []string {
	arr, ok := body.Lookup("errorLabels").ArrayOK()
	if !ok {
		return nil
	}
	vals, _ := arr.Values()
	var out []string
	for _, v := range vals {
		out = append(out, v.StringValue())
	}
	return out
}

func TestLimitMaxClientConn(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		ignore := goleak.IgnoreCurrent()
		t.Cleanup(func() { goleak.VerifyNone(t, ignore) })

		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		a, addr := bouncer(t, up.URI(), func(c *config.Config) { c.Global.MaxClientConn = 5 })
		var in []*rawClient
		for range 5 {
			r := dialRaw(t, addr)
			if okOf(r.hello()) != 1 {
				t.Fatal("hello refused below max_client_conn")
			}
			in = append(in, r)
		}
		malWaitClients(t, a, 5, 5*time.Second)

		// The sixth gets a clear error in answer to its hello, then is closed.
		extra := dialRaw(t, addr)
		id := extra.send(0, limHello())
		rep, err := malRecv(extra.c, 10*time.Second)
		if err != nil {
			t.Fatalf("sixth client: want an error reply, got %v", err)
		}
		if rep.op != wire.OpMsg || rep.responseTo != id {
			t.Fatalf("sixth client: reply %v to %d, want OP_MSG to %d", rep.op, rep.responseTo, id)
		}
		malCheckError(t, rep.body, 0, "too many client connections (max_client_conn = 5)")
		if !extra.closed(5 * time.Second) {
			t.Fatal("refused client still connected")
		}

		// A legacy handshake is refused in its own dialect.
		legacy := dialRaw(t, addr)
		isMaster := docOf(t, bson.D{{Key: "isMaster", Value: 1}})
		legacy.sendRaw(wire.AppendQuery(nil, 77, 0, "admin.$cmd", 0, -1, isMaster))
		rep, err = malRecv(legacy.c, 10*time.Second)
		if err != nil {
			t.Fatalf("legacy client: want an error reply, got %v", err)
		}
		if rep.op != wire.OpReply || rep.responseTo != 77 || rep.replyFlags&wire.ReplyQueryFailure == 0 {
			t.Fatalf("legacy client: reply %v to %d flags %#x, want a failed OP_REPLY to 77", rep.op, rep.responseTo, rep.replyFlags)
		}
		malCheckError(t, rep.body, 0, "max_client_conn = 5")
		if !legacy.closed(5 * time.Second) {
			t.Fatal("refused legacy client still connected")
		}

		// The admitted clients did not notice.
		for i, r := range in {
			if body := r.cmd(malPingCmd()); okOf(body) != 1 {
				t.Fatalf("admitted client %d: %v", i, body)
			}
		}

		// Once one leaves, a new client is accepted.
		in[0].c.Close()
		malWaitClients(t, a, 4, 10*time.Second)
		next := dialRaw(t, addr)
		if okOf(next.hello()) != 1 || okOf(next.cmd(malPingCmd())) != 1 {
			t.Fatal("a client was refused after another left")
		}
		if n := a.Server().ClientCount(); n != 5 {
			t.Fatalf("%d clients, want 5", n)
		}
	})
}

func TestLimitClientIdleTimeout(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		ignore := goleak.IgnoreCurrent()
		t.Cleanup(func() { goleak.VerifyNone(t, ignore) })

		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		a, addr := bouncer(t, up.URI(), func(c *config.Config) { c.Global.ClientIdleTimeout = time.Second })

		start := time.Now()
		idle := dialRaw(t, addr)
		idle.hello()
		silent := dialRaw(t, addr) // never sends anything
		active := dialRaw(t, addr)
		active.hello()

		idleClosed := make(chan time.Duration, 2)
		for _, r := range []*rawClient{idle, silent} {
			go func() {
				if r.closed(10 * time.Second) {
					idleClosed <- time.Since(start)
					return
				}
				idleClosed <- -1
			}()
		}

		// Three timeouts' worth of activity with gaps well under the timeout.
		for time.Since(start) < 3*time.Second {
			if body := active.cmd(malPingCmd()); okOf(body) != 1 {
				t.Fatalf("active client: %v", body)
			}
			time.Sleep(200 * time.Millisecond)
		}
		for range 2 {
			d := <-idleClosed
			if d < 0 {
				t.Fatal("idle client still connected 10s into a 1s client_idle_timeout")
			}
			if d < 900*time.Millisecond {
				t.Fatalf("idle client closed after %v, before client_idle_timeout", d)
			}
		}
		if body := active.cmd(malPingCmd()); okOf(body) != 1 {
			t.Fatalf("active client after the idle ones were closed: %v", body)
		}

		// Idleness is measured from the last request: once it stops, the
		// active client is closed too.
		stopped := time.Now()
		if !active.closed(10 * time.Second) {
			t.Fatal("client that stopped sending still connected after 10s")
		}
		if d := time.Since(stopped); d < 900*time.Millisecond {
			t.Fatalf("client closed %v after its last request, before client_idle_timeout", d)
		}
		malWaitClients(t, a, 0, 10*time.Second)
	})
}

func TestLimitMaxMessageSize(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		ignore := goleak.IgnoreCurrent()
		t.Cleanup(func() { goleak.VerifyNone(t, ignore) })

		const limit = 1 << 20
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		_, addr := bouncer(t, up.URI(), func(c *config.Config) { c.Global.MaxMessageSize = limit })

		r := dialRaw(t, addr)
		h := r.hello()
		if v, _ := h.Lookup("maxMessageSizeBytes").AsInt64OK(); v != limit {
			t.Fatalf("hello advertises maxMessageSizeBytes %d, want the configured %d", v, limit)
		}

		// Just under the limit works.
		under := limInsert("big", bson.D{{Key: "_id", Value: 1}, {Key: "s", Value: strings.Repeat("u", limit-4096)}})
		if n := len(wire.AppendMsg(nil, 1, 0, 0, docOf(t, under))); n > limit || n < limit-8192 {
			t.Fatalf("test message is %d bytes, want just under %d", n, limit)
		}
		if body := r.cmd(under); okOf(body) != 1 {
			t.Fatalf("message under the limit: %v", body)
		}

		// Over the limit: an error reply naming the limit, then the client is
		// closed. The client writes the whole message, as a driver would.
		over := wire.AppendMsg(nil, 42, 0, 0, docOf(t,
			limInsert("big", bson.D{{Key: "_id", Value: 2}, {Key: "s", Value: strings.Repeat("o", 2*limit)}})))
		wrote := make(chan struct{})
		go func() {
			defer close(wrote)
			_ = r.c.SetWriteDeadline(time.Now().Add(10 * time.Second))
			_, _ = r.c.Write(over) // fails once the proxy closes: expected
		}()
		rep, err := malRecv(r.c, 10*time.Second)
		<-wrote
		if err != nil {
			t.Fatalf("message over the limit: want an error reply, got %v", err)
		}
		if rep.op != wire.OpMsg || rep.responseTo != 42 {
			t.Fatalf("reply %v to %d, want OP_MSG to 42", rep.op, rep.responseTo)
		}
		malCheckError(t, rep.body, 17, strconv.Itoa(limit))
		if !r.closed(5 * time.Second) {
			t.Fatal("client still connected after an oversized message")
		}
		if docs := up.Collection("test", "big"); len(docs) != 1 {
			t.Fatalf("upstream holds %d documents, want only the one under the limit", len(docs))
		}

		// Compression does not get around it: the declared uncompressed size
		// is checked before anything is inflated.
		zc := dialRaw(t, addr)
		hz := zc.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "compression", Value: bson.A{"zlib"}}, {Key: "$db", Value: "admin"}})
		if comp, _ := hz.Lookup("compression").ArrayOK(); len(comp) == 0 {
			t.Fatalf("zlib not agreed: %v", hz)
		}
		small := malCompress(t, over, wire.CompressorZlib, nil)
		if len(small) >= limit {
			t.Fatalf("compressed test message is %d bytes, want it under the limit", len(small))
		}
		zc.sendRaw(small)
		rep, err = malRecv(zc.c, 10*time.Second)
		if err != nil {
			t.Fatalf("compressed message over the limit: want an error reply, got %v", err)
		}
		malCheckError(t, rep.body, 17, "exceeds limit "+strconv.Itoa(limit))
		if !zc.closed(5 * time.Second) {
			t.Fatal("client still connected after an oversized compressed message")
		}

		// A driver told the limit splits its batches to fit: a 3 MB
		// insertMany goes through.
		c := driver(t, addr, "")
		var docs []any
		for i := range 30 {
			docs = append(docs, bson.D{{Key: "_id", Value: 100 + i}, {Key: "s", Value: strings.Repeat("d", 100<<10)}})
		}
		if _, err := c.Database("test").Collection("big").InsertMany(ctxT(t, 20*time.Second), docs); err != nil {
			t.Fatalf("driver insertMany under a 1 MB message limit: %v", err)
		}
		if n := len(up.Collection("test", "big")); n != 31 {
			t.Fatalf("upstream holds %d documents, want 31", n)
		}
		if n := up.Requests("insert"); n < 4 {
			t.Fatalf("driver sent %d inserts for 3 MB, want it split into at least 3 batches", n-1)
		}
	})
}

func TestLimitWaitQueueTimeout(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		ignore := goleak.IgnoreCurrent()
		t.Cleanup(func() { goleak.VerifyNone(t, ignore) })

		const wait = 300 * time.Millisecond
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		_, addr := bouncer(t, up.URI(), func(c *config.Config) {
			c.Global.PoolMode = config.PoolModeSession
			c.Global.MaxPoolSize = 1
			c.Global.WaitQueueTimeout = wait
		})

		holder := dialRaw(t, addr)
		holder.hello()
		if body := holder.cmd(malPingCmd()); okOf(body) != 1 {
			t.Fatalf("first client: %v", body)
		}
		// holder now owns the only upstream connection for its whole session.

		waiter := dialRaw(t, addr)
		waiter.hello()
		start := time.Now()
		body := waiter.cmd(malPingCmd())
		took := time.Since(start)
		malCheckError(t, body, 89, "timed out waiting for an upstream connection")
		if name, _ := body.Lookup("codeName").StringValueOK(); name != "NetworkTimeout" {
			t.Fatalf("codeName %q, want NetworkTimeout", name)
		}
		if took < wait*3/4 || took > 10*time.Second {
			t.Fatalf("command failed after %v, want about wait_queue_timeout (%v)", took, wait)
		}

		// A write fails the same way, labelled so that drivers retry it.
		body = waiter.cmd(limInsert("c", bson.D{{Key: "x", Value: 1}}))
		malCheckError(t, body, 89, "timed out waiting")
		if l := limLabels(body); len(l) != 1 || l[0] != "RetryableWriteError" {
			t.Fatalf("write error labels %v, want [RetryableWriteError]", l)
		}

		// The holder did not notice.
		for range 3 {
			if body := holder.cmd(malPingCmd()); okOf(body) != 1 {
				t.Fatalf("first client: %v", body)
			}
		}
		if body := holder.cmd(limInsert("c", bson.D{{Key: "x", Value: 2}})); okOf(body) != 1 {
			t.Fatalf("first client insert: %v", body)
		}

		// When the holder leaves, the waiter (still connected) gets the
		// connection.
		holder.c.Close()
		deadline := time.Now().Add(10 * time.Second)
		for {
			body := waiter.cmd(malPingCmd())
			if okOf(body) == 1 {
				break
			}
			if codeOf(body) != 89 || time.Now().After(deadline) {
				t.Fatalf("after the holder left: %v", body)
			}
		}
		if n := len(up.Collection("test", "c")); n != 1 {
			t.Fatalf("upstream holds %d documents, want only the holder's", n)
		}
	})
}
