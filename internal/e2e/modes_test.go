package e2e

import (
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/app"
	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/topology"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// connRecorder makes a fake answer "whoami" with the upstream connection
// that carried it, so tests see which pooled connection served a client.
func connRecorder(up *fakemongo.Server) {
	up.Handle("whoami", func(r *fakemongo.Request) fakemongo.Reply {
		return fakemongo.OK(bson.E{Key: "conn", Value: r.ConnID})
	})
}

func whoami(t testing.TB, c *rawClient) int64 {
	t.Helper()
	b := c.cmd(bson.D{{Key: "whoami", Value: 1}, {Key: "$db", Value: "test"}})
	v, err := b.LookupErr("conn")
	if err != nil {
		t.Fatalf("whoami: %v", b)
	}
	id, _ := v.AsInt64OK()
	return id
}

func mode(m string, maxPool int) func(*config.Config) {
	return func(c *config.Config) {
		c.Global.PoolMode = config.PoolMode(m)
		c.Global.MaxPoolSize = maxPool
	}
}

func TestStatementModeSharesOneConnection(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{})
		connRecorder(up)
		_, addr := bouncer(t, up.URI(), mode("statement", 1))
		a, b := dialRaw(t, addr), dialRaw(t, addr)
		a.hello()
		b.hello()
		first := whoami(t, a)
		for range 5 {
			if id := whoami(t, b); id != first {
				t.Fatalf("client b used upstream conn %d, want the only one %d", id, first)
			}
			if id := whoami(t, a); id != first {
				t.Fatalf("client a used upstream conn %d, want %d", id, first)
			}
		}
	})
}

func TestSessionModePinsUntilDisconnect(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{})
		connRecorder(up)
		_, addr := bouncer(t, up.URI(), mode("session", 2))
		a, b := dialRaw(t, addr), dialRaw(t, addr)
		a.hello()
		b.hello()
		ida, idb := whoami(t, a), whoami(t, b)
		if ida == idb {
			t.Fatalf("two session-mode clients share upstream conn %d", ida)
		}
		for range 3 {
			if whoami(t, a) != ida || whoami(t, b) != idb {
				t.Fatal("a session-mode client changed upstream connection")
			}
		}
		// A third client waits in the CMAP queue until a pinned client leaves.
		c := dialRaw(t, addr)
		c.hello()
		id := c.send(0, bson.D{{Key: "whoami", Value: 1}, {Key: "$db", Value: "test"}})
		if _, err := c.tryRecv(300 * time.Millisecond); err == nil {
			t.Fatal("third client got a connection while both were pinned")
		}
		a.c.Close()
		rep := c.recv()
		if rep.header.ResponseTo != id {
			t.Fatalf("responseTo %d want %d", rep.header.ResponseTo, id)
		}
		got, _ := rep.body.Lookup("conn").AsInt64OK()
		if got != ida {
			t.Fatalf("third client got conn %d, want the released %d", got, ida)
		}
	})
}

// txnCmd builds one command of a transaction.
func txnCmd(name string, lsid bson.Binary, txn int64, start bool, extra ...bson.E) bson.D {
	d := bson.D{{Key: name, Value: 1}}
	if name == "insert" {
		d = bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{bson.D{{Key: "x", Value: txn}}}}}
	}
	d = append(d, extra...)
	d = append(d, bson.E{Key: "lsid", Value: bson.D{{Key: "id", Value: lsid}}},
		bson.E{Key: "txnNumber", Value: txn})
	if start {
		d = append(d, bson.E{Key: "startTransaction", Value: true})
	}
	d = append(d, bson.E{Key: "autocommit", Value: false})
	db := "test"
	if name == "commitTransaction" || name == "abortTransaction" {
		db = "admin"
	}
	return append(d, bson.E{Key: "$db", Value: db})
}

func newLSID(b byte) bson.Binary {
	id := make([]byte, 16)
	for i := range id {
		id[i] = b
	}
	return bson.Binary{Subtype: 4, Data: id}
}

func TestTransactionModePinsForTheTransaction(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		connRecorder(up)
		_, addr := bouncer(t, up.URI(), mode("transaction", 1))
		a, b := dialRaw(t, addr), dialRaw(t, addr)
		a.hello()
		b.hello()
		lsid := newLSID(1)
		if r := a.cmd(txnCmd("insert", lsid, 1, true)); okOf(r) != 1 {
			t.Fatalf("start: %v", r)
		}
		// b's command must wait: a holds the only connection until commit.
		id := b.send(0, bson.D{{Key: "whoami", Value: 1}, {Key: "$db", Value: "test"}})
		if _, err := b.tryRecv(300 * time.Millisecond); err == nil {
			t.Fatal("another client got the connection in the middle of a transaction")
		}
		if r := a.cmd(txnCmd("insert", lsid, 1, false)); okOf(r) != 1 {
			t.Fatalf("second insert: %v", r)
		}
		if r := a.cmd(txnCmd("commitTransaction", lsid, 1, false)); okOf(r) != 1 {
			t.Fatalf("commit: %v", r)
		}
		if rep := b.recv(); rep.header.ResponseTo != id || okOf(rep.body) != 1 {
			t.Fatalf("b after commit: %v", rep.body)
		}
		txns := up.Transactions()
		if len(txns) != 1 || txns[0].State != fakemongo.TxnCommitted {
			t.Fatalf("transactions: %+v", txns)
		}
		for _, c := range txns[0].ConnIDs {
			if c != txns[0].ConnIDs[0] {
				t.Fatalf("transaction commands used several connections: %v", txns[0].ConnIDs)
			}
		}
	})
}

func TestTransactionModeReleasesAfterError(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		up.Handle("boom", func(*fakemongo.Request) fakemongo.Reply {
			return fakemongo.Error(112, "WriteConflict", "conflict", "TransientTransactionError")
		})
		_, addr := bouncer(t, up.URI(), mode("transaction", 1))
		a, b := dialRaw(t, addr), dialRaw(t, addr)
		a.hello()
		b.hello()
		lsid := newLSID(2)
		a.cmd(txnCmd("insert", lsid, 1, true))
		if r := a.cmd(txnCmd("boom", lsid, 1, false)); okOf(r) != 0 {
			t.Fatalf("boom: %v", r)
		}
		// The server aborted the transaction on the error: the connection is
		// free for others at once.
		if r := b.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}}); okOf(r) != 1 {
			t.Fatalf("b: %v", r)
		}
	})
}

func TestAbortOnDisconnectInEveryMode(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		for _, m := range []string{"session", "transaction", "statement"} {
			t.Run(m, func(t *testing.T) {
				up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
				_, addr := bouncer(t, up.URI(), mode(m, 2))
				a := dialRaw(t, addr)
				a.hello()
				lsid := newLSID(3)
				if r := a.cmd(txnCmd("insert", lsid, 5, true)); okOf(r) != 1 {
					t.Fatalf("start: %v", r)
				}
				a.c.Close()
				deadline := time.Now().Add(5 * time.Second)
				for {
					txns := up.Transactions()
					if len(txns) == 1 && txns[0].State == fakemongo.TxnAborted && txns[0].AbortedBy == "abortTransaction" {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("transaction not aborted after client disconnect: %+v", txns)
					}
					time.Sleep(20 * time.Millisecond)
				}
			})
		}
	})
}

func TestCommitOnAnotherClientReleasesThePin(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		// Drivers pin the server of a transaction, not the connection: the
		// commit may arrive on another client connection.
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		app, addr := bouncer(t, up.URI(), mode("transaction", 2))
		a, b, c := dialRaw(t, addr), dialRaw(t, addr), dialRaw(t, addr)
		a.hello()
		b.hello()
		c.hello()
		lsid := newLSID(4)
		a.cmd(txnCmd("insert", lsid, 1, true))
		if r := b.cmd(txnCmd("commitTransaction", lsid, 1, false)); okOf(r) != 1 {
			t.Fatalf("commit on b: %v", r)
		}
		// a is idle: its pinned connection must be back in the pool, so two
		// other clients can each hold one at once (pool of 2).
		lsid2, lsid3 := newLSID(5), newLSID(6)
		if r := b.cmd(txnCmd("insert", lsid2, 1, true)); okOf(r) != 1 {
			t.Fatal(r)
		}
		if r := c.cmd(txnCmd("insert", lsid3, 1, true)); okOf(r) != 1 {
			t.Fatal(r)
		}
		b.cmd(txnCmd("commitTransaction", lsid2, 1, false))
		c.cmd(txnCmd("commitTransaction", lsid3, 1, false))
		// a's transaction was not aborted when a disconnects: it committed.
		a.c.Close()
		// A client leaves the count after its disconnect's aborts are done.
		waitFor(t, "a to be gone", func() bool { return app.Server().ClientCount() == 2 })
		for _, tx := range up.Transactions() {
			if tx.State != fakemongo.TxnCommitted {
				t.Fatalf("transaction %+v not committed", tx)
			}
		}
	})
}

func TestMoreToComeIsForwardedWithoutReply(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		_, addr := bouncer(t, up.URI(), mode("statement", 1))
		a := dialRaw(t, addr)
		a.hello()
		a.send(wire.FlagMoreToCome, bson.D{{Key: "insert", Value: "c"},
			{Key: "documents", Value: bson.A{bson.D{{Key: "w0", Value: true}}}},
			{Key: "writeConcern", Value: bson.D{{Key: "w", Value: 0}}}, {Key: "$db", Value: "test"}})
		if _, err := a.tryRecv(200 * time.Millisecond); err == nil {
			t.Fatal("got a reply to a moreToCome request")
		}
		r := a.cmd(bson.D{{Key: "find", Value: "c"}, {Key: "$db", Value: "test"}})
		batch, _ := r.Lookup("cursor", "firstBatch").ArrayOK()
		vals, _ := batch.Values()
		if len(vals) != 1 {
			t.Fatalf("w:0 insert not applied: %v", r)
		}
	})
}

func TestExhaustStreamIsRelayedAndHoldsTheConnection(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		_, addr := bouncer(t, up.URI(), mode("statement", 1))
		a, b := dialRaw(t, addr), dialRaw(t, addr)
		a.hello()
		b.hello()
		docs := bson.A{}
		for i := range 10 {
			docs = append(docs, bson.D{{Key: "i", Value: i}})
		}
		a.cmd(bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: docs}, {Key: "$db", Value: "test"}})
		r := a.cmd(bson.D{{Key: "find", Value: "c"}, {Key: "batchSize", Value: 2}, {Key: "$db", Value: "test"}})
		cursor, _ := r.Lookup("cursor", "id").AsInt64OK()
		if cursor == 0 {
			t.Fatalf("no cursor: %v", r)
		}
		// Slow the stream down so b's request lands in the middle of it.
		id := a.send(wire.FlagExhaustAllowed, bson.D{{Key: "getMore", Value: cursor}, {Key: "collection", Value: "c"},
			{Key: "batchSize", Value: 2}, {Key: "$db", Value: "test"}})
		first := a.recv()
		if first.header.ResponseTo != id || first.flags&wire.FlagMoreToCome == 0 {
			t.Fatalf("first reply: responseTo=%d flags=%v", first.header.ResponseTo, first.flags)
		}
		bid := b.send(0, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}})
		batchLen := func(r reply) int {
			arr, _ := r.body.Lookup("cursor", "nextBatch").ArrayOK()
			vals, _ := arr.Values()
			return len(vals)
		}
		prev, n, replies := first, batchLen(first), 1
		for prev.flags&wire.FlagMoreToCome != 0 {
			next := a.recv()
			if next.header.ResponseTo != prev.header.RequestID {
				t.Fatalf("stream reply answers %d, want previous requestID %d", next.header.ResponseTo, prev.header.RequestID)
			}
			prev = next
			n += batchLen(next)
			replies++
		}
		if id, _ := prev.body.Lookup("cursor", "id").AsInt64OK(); id != 0 {
			t.Fatalf("stream ended with cursor %d", id)
		}
		if n != 8 || replies < 4 {
			t.Fatalf("stream carried %d docs in %d replies, want the 8 remaining in >= 4", n, replies)
		}
		if rep := b.recv(); rep.header.ResponseTo != bid || okOf(rep.body) != 1 {
			t.Fatalf("b: %v", rep.body)
		}
		if up.Accepted() > 2 { // the monitor's connection and the pool's one
			t.Fatalf("upstream accepted %d connections with a pool of 1", up.Accepted())
		}
	})
}

func TestCursorAndTransactionAffinityAcrossTwoMongos(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		s1 := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos, InMemory: true})
		s2 := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos, InMemory: true})
		uri := "mongodb://" + s1.Addr() + "," + s2.Addr() + "/"
		a, addr := bouncer(t, uri, func(c *config.Config) {
			c.Global.PoolMode = "statement"
			// Both mongos in the latency window however slow the
			// machine makes one monitor's round trips: the test is about
			// affinity, not the window (it saw 0 / 20 under load).
			c.Global.LocalThreshold = time.Minute
		})
		waitUsable(t, a, 2)
		cl := dialRaw(t, addr)
		cl.hello()
		for i := range 20 {
			if r := cl.cmd(bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{bson.D{{Key: "i", Value: i}}}},
				{Key: "$db", Value: "test"}}); okOf(r) != 1 {
				t.Fatal(r)
			}
		}
		if len(s1.Collection("test", "c")) == 0 || len(s2.Collection("test", "c")) == 0 {
			t.Fatalf("load was not spread: %d / %d", len(s1.Collection("test", "c")), len(s2.Collection("test", "c")))
		}
		// Open cursors on both servers, then drain each with getMore: every
		// getMore must reach the server that owns its cursor.
		for range 6 {
			r := cl.cmd(bson.D{{Key: "find", Value: "c"}, {Key: "batchSize", Value: 1}, {Key: "$db", Value: "test"}})
			id, _ := r.Lookup("cursor", "id").AsInt64OK()
			for id != 0 {
				r = cl.cmd(bson.D{{Key: "getMore", Value: id}, {Key: "collection", Value: "c"}, {Key: "batchSize", Value: 1}, {Key: "$db", Value: "test"}})
				if okOf(r) != 1 {
					t.Fatalf("getMore routed to the wrong server: %v", r)
				}
				id, _ = r.Lookup("cursor", "id").AsInt64OK()
			}
		}
		// killCursors also follows the cursor.
		r := cl.cmd(bson.D{{Key: "find", Value: "c"}, {Key: "batchSize", Value: 1}, {Key: "$db", Value: "test"}})
		id, _ := r.Lookup("cursor", "id").AsInt64OK()
		r = cl.cmd(bson.D{{Key: "killCursors", Value: "c"}, {Key: "cursors", Value: bson.A{id}}, {Key: "$db", Value: "test"}})
		if killed, _ := r.Lookup("cursorsKilled").ArrayOK(); len(killed) <= 5 {
			t.Fatalf("killCursors: %v", r)
		}
		if n := len(s1.OpenCursors()) + len(s2.OpenCursors()); n != 0 {
			t.Fatalf("%d cursors left open", n)
		}
		// Every command of a transaction reaches one server.
		for k := range 4 {
			lsid := newLSID(byte(10 + k))
			cl.cmd(txnCmd("insert", lsid, 1, true))
			cl.cmd(txnCmd("insert", lsid, 1, false))
			cl.cmd(txnCmd("insert", lsid, 1, false))
			if r := cl.cmd(txnCmd("commitTransaction", lsid, 1, false)); okOf(r) != 1 {
				t.Fatalf("commit: %v", r)
			}
		}
		for _, s := range []*fakemongo.Server{s1, s2} {
			for _, tx := range s.Transactions() {
				if tx.State != fakemongo.TxnCommitted || len(tx.Commands) != 4 {
					t.Fatalf("transaction split across servers: %+v", tx)
				}
			}
		}
	})
}

// waitUsable waits until n servers of the app's topologies are usable, so
// that selection can spread load over all of them.
func waitUsable(t *testing.T, a *app.App, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		usable := 0
		for _, tp := range a.Topologies() {
			for _, s := range tp.Servers() {
				if s.State() == topology.Usable {
					usable++
				}
			}
		}
		if usable >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d servers usable after 10s", usable, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestUpstreamDeathMidRequestGivesRetryableError(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		var mu sync.Mutex
		closeNext := true
		up.Handle("insert", func(r *fakemongo.Request) fakemongo.Reply {
			mu.Lock()
			defer mu.Unlock()
			if closeNext {
				closeNext = false
				return fakemongo.Reply{CloseConn: true}
			}
			return up.Builtin(r)
		})
		_, addr := bouncer(t, up.URI(), mode("statement", 2))
		a := dialRaw(t, addr)
		a.hello()
		r := a.cmd(bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{bson.D{{Key: "x", Value: 1}}}}, {Key: "$db", Value: "test"}})
		if okOf(r) != 0 || codeOf(r) != 9001 {
			t.Fatalf("want SocketException, got %v", r)
		}
		labels, _ := r.Lookup("errorLabels").ArrayOK()
		if vals, _ := labels.Values(); len(vals) != 1 || vals[0].StringValue() != "RetryableWriteError" {
			t.Fatalf("labels: %v", r)
		}
		// The client is still connected and the retry succeeds.
		if r := a.cmd(bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{bson.D{{Key: "x", Value: 1}}}}, {Key: "$db", Value: "test"}}); okOf(r) != 1 {
			t.Fatalf("retry: %v", r)
		}
	})
}

func TestDriverRetriesThroughUpstreamFailure(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		_, addr := bouncer(t, up.URI(), mode("transaction", 4))
		c := driver(t, addr, "")
		ctx := ctxT(t, 20*time.Second)
		if err := c.Ping(ctx, nil); err != nil {
			t.Fatal(err)
		}
		up.SetFailPoint(fakemongo.FailPoint{Mode: fakemongo.FailTimes, Times: 1, FailCommands: []string{"insert"}, CloseConnection: true})
		if _, err := c.Database("test").Collection("c").InsertOne(ctx, bson.D{{Key: "x", Value: 1}}); err != nil {
			t.Fatalf("retryable write was not retried: %v", err)
		}
		if up.FailPointHits() != 1 {
			t.Fatalf("fail point hit %d times", up.FailPointHits())
		}
		if n := len(up.Collection("test", "c")); n != 1 {
			t.Fatalf("%d docs after a retried write", n)
		}
	})
}
