package e2e

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// Drivers pin the *server* of a transaction, not the connection: the
// commands of one transaction may arrive on several client connections.
// During a graceful shutdown open transactions may finish, whichever
// client connection their commands arrive on; they do not get
// ShutdownInProgress.
func TestDrainLetsATransactionFinishOnAnotherConnection(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		a, addr := bouncer(t, up.URI(), mode("transaction", 2))
		c1, c2 := dialRaw(t, addr), dialRaw(t, addr)
		c1.hello()
		c2.hello()
		lsid := newLSID(0x71)
		if r := c1.cmd(txnCmd("insert", lsid, 1, true)); okOf(r) != 1 {
			t.Fatalf("start: %v", r)
		}
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			done <- a.GracefulClose(ctx)
		}()
		waitDraining(t, a, addr)
		// The same transaction goes on, on the driver's other connection.
		if r := c2.cmd(txnCmd("insert", lsid, 1, false)); okOf(r) != 1 {
			t.Errorf("transaction command on another client connection during shutdown: %v", r)
		}
		if r := c2.cmd(txnCmd("commitTransaction", lsid, 1, false)); okOf(r) != 1 {
			t.Errorf("commit on another client connection during shutdown: %v", r)
		}
		if err := <-done; err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if txs := up.Transactions(); len(txs) != 1 || txs[0].State != fakemongo.TxnCommitted {
			t.Fatalf("transaction: %+v, want it committed", txs)
		}
	})
}

func dialRawNoFail(addr string) net.Conn {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil
	}
	return c
}

// A reply whose write to the client is still in progress is part of an
// in-flight request: Shutdown does not count the client as drained (and
// disconnect it) before the whole reply is written, although the upstream
// connection went back to its pool before the write.
func TestShutdownWaitsForAReplyBeingWritten(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{})
		big := strings.Repeat("x", 15<<20)
		up.Handle("big", func(*fakemongo.Request) fakemongo.Reply {
			return fakemongo.OK(bson.E{Key: "blob", Value: big})
		})
		a, addr := bouncer(t, up.URI(), mode("session", 2))
		c := dialRaw(t, addr)
		_ = c.c.(*net.TCPConn).SetReadBuffer(16 << 10)
		c.hello()
		id := c.send(0, bson.D{{Key: "big", Value: 1}, {Key: "$db", Value: "test"}})
		// The reply's write to us has begun; 15 MB do not fit the socket
		// buffers, so it goes on until we read.
		c.awaitFirstByte()
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			done <- a.GracefulClose(ctx)
		}()
		// Once the listener is closed the shutdown checks whether its
		// clients are drained; counted drained, this one would be cut
		// while we read the rest of the reply.
		waitDraining(t, a, addr)
		rep, err := c.tryRecv(5 * time.Second)
		if err != nil {
			t.Fatalf("in-flight reply cut by shutdown: %v", err)
		}
		if rep.header.ResponseTo != id || okOf(rep.body) != 1 {
			t.Fatalf("reply: responseTo %d (want %d) ok %v", rep.header.ResponseTo, id, okOf(rep.body))
		}
		<-done
	})
}

// A transaction-mode pin belongs to a transaction: when the transaction
// ends (here committed on another client connection), the connection goes
// back to the pool, also when the owning client is busy with a request on
// another route at that moment (then as that request ends).
func TestTxnPinReleasedWhenOwnerWasBusyElsewhere(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		other := fakemongo.Start(t, fakemongo.Options{})
		hold := make(chan struct{})
		release := sync.OnceFunc(func() { close(hold) })
		t.Cleanup(release)
		other.Handle("slow", func(*fakemongo.Request) fakemongo.Reply {
			select {
			case <-hold:
			case <-time.After(10 * time.Second):
			}
			return fakemongo.OK()
		})
		app, addr := bouncer(t, up.URI(), func(c *config.Config) {
			mode("transaction", 2)(c)
			c.Databases["other"] = config.Route{ConnectionString: config.URI(other.URI())}
		})
		a, b := dialRaw(t, addr), dialRaw(t, addr)
		a.hello()
		b.hello()
		lsid := newLSID(0x72)
		if r := a.cmd(txnCmd("insert", lsid, 1, true)); okOf(r) != 1 {
			t.Fatalf("start: %v", r)
		}
		// a is busy on the "other" route while b commits a's transaction.
		slowID := a.send(0, bson.D{{Key: "slow", Value: 1}, {Key: "$db", Value: "other"}})
		waitFor(t, "a's request to reach the other route's upstream", func() bool { return other.Requests("slow") == 1 })
		if r := b.cmd(txnCmd("commitTransaction", lsid, 1, false)); okOf(r) != 1 {
			t.Fatalf("commit: %v", r)
		}
		release()
		if rep := a.recv(); rep.header.ResponseTo != slowID || okOf(rep.body) != 1 {
			t.Fatalf("slow: %v", rep.body)
		}
		// No transaction is open and no request in flight: no connection of
		// route "*" may still be held.
		deadline := time.Now().Add(2 * time.Second)
		for {
			inUse := 0
			for _, p := range app.Pools() {
				if p.Route == "*" {
					inUse += p.InUse
				}
			}
			if inUse == 0 {
				return
			}
			if time.Now().After(deadline) {
				var states []string
				for _, c := range app.Server().Clients() {
					states = append(states, c.State+"@"+c.PinnedServer)
				}
				t.Fatalf("route \"*\" still has %d connection(s) in use after the transaction ended; clients: %v", inUse, states)
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}

// A startTransaction whose upstream connection fails does not leave the
// transaction open in mongobouncer (no reply will end it): the client's
// later transactions give their pinned connections back after commit, as
// usual, and other clients are served.
func TestFailedStartDoesNotLeaveTheTxnOpen(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		_, addr := bouncer(t, up.URI(), func(c *config.Config) {
			mode("transaction", 1)(c)
			c.Global.WaitQueueTimeout = 500 * time.Millisecond
		})
		a, x := dialRaw(t, addr), dialRaw(t, addr)
		a.hello()
		x.hello()
		up.SetFailPoint(fakemongo.FailPoint{Mode: fakemongo.FailTimes, Times: 1,
			FailCommands: []string{"insert"}, CloseConnection: true})
		lsid := newLSID(0x73)
		if r := a.cmd(txnCmd("insert", lsid, 1, true)); okOf(r) != 0 {
			t.Fatalf("start with a failing connection: %v", r)
		}
		// The driver retries the transaction with the next txnNumber.
		if r := a.cmd(txnCmd("insert", lsid, 2, true)); okOf(r) != 1 {
			t.Fatalf("start: %v", r)
		}
		if r := a.cmd(txnCmd("commitTransaction", lsid, 2, false)); okOf(r) != 1 {
			t.Fatalf("commit: %v", r)
		}
		if r := x.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "test"}}); okOf(r) != 1 {
			t.Fatalf("after a's transaction committed, another client cannot get the connection: %v", r)
		}
	})
}

// A client that goes away in the middle of an exhaust stream run on its
// pinned connection (session mode; transaction mode with a transaction
// open) loses that pin: the rest of the stream is unread on it. The
// abortTransaction sent for the client's open transaction at disconnect
// goes on a fresh connection and aborts the transaction upstream.
func TestAbortAfterClientGoneMidStreamUsesAFreshConn(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		for _, m := range []string{"session", "transaction"} {
			t.Run(m, func(t *testing.T) {
				up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
				up.Handle("stream", func(r *fakemongo.Request) fakemongo.Reply {
					docs := make([]any, 30)
					for i := range docs {
						docs[i] = bson.D{{Key: "ok", Value: 1.0}, {Key: "i", Value: i}}
					}
					rep := fakemongo.Docs(docs...)
					rep.Interval = 10 * time.Millisecond
					return rep
				})
				_, addr := bouncer(t, up.URI(), mode(m, 2))
				a := dialRaw(t, addr)
				a.hello()
				lsid := newLSID(0x74)
				if r := a.cmd(txnCmd("insert", lsid, 1, true)); okOf(r) != 1 {
					t.Fatalf("start: %v", r)
				}
				id := a.send(wire.FlagExhaustAllowed, bson.D{{Key: "stream", Value: 1}, {Key: "$db", Value: "test"}})
				if first := a.recv(); first.header.ResponseTo != id || first.flags&wire.FlagMoreToCome == 0 {
					t.Fatalf("first stream reply: responseTo=%d flags=%v", first.header.ResponseTo, first.flags)
				}
				_ = a.c.(*net.TCPConn).SetLinger(0)
				a.c.Close()
				deadline := time.Now().Add(2 * time.Second)
				for {
					txns := up.Transactions()
					if len(txns) == 1 && txns[0].State == fakemongo.TxnAborted {
						return
					}
					if time.Now().After(deadline) {
						t.Fatalf("transaction not aborted after the client left mid-stream: %+v", txns)
					}
					time.Sleep(20 * time.Millisecond)
				}
			})
		}
	})
}

// Server.Close disconnects every client and waits for their goroutines,
// including one whose request waits at a paused route's gate: Close ends
// that wait as Shutdown does.
func TestCloseEndsWaitsAtAPausedRoute(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{})
		app, addr := bouncer(t, up.URI(), mode("transaction", 2))
		c := dialRaw(t, addr)
		c.hello()
		if r := c.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "test"}}); okOf(r) != 1 {
			t.Fatalf("ping: %v", r)
		}
		if err := app.Pause("*"); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = app.Resume("*") }()
		c.send(0, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "test"}})
		// Close must end a wait in progress (a request that came after it
		// would not wait at all).
		waitForGoroutineIn(t, "routing.(*Route).WaitGate")
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := app.Server().Close(ctx); err != nil {
			t.Fatalf("Close with a client waiting at a paused route: %v", err)
		}
	})
}

// commitTransaction and abortTransaction name the admin database; they go
// to the route the transaction began on, not to admin's route, which may
// lead to another deployment.
func TestTxnEndGoesToTheTransactionsRoute(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		for _, m := range []string{"statement", "transaction", "session"} {
			t.Run(m, func(t *testing.T) {
				orders := fakemongo.Start(t, fakemongo.Options{InMemory: true})
				other := fakemongo.Start(t, fakemongo.Options{InMemory: true})
				_, addr := bouncer(t, other.URI(), func(c *config.Config) {
					mode(m, 2)(c)
					c.Databases["test"] = config.Route{ConnectionString: config.URI(orders.URI())}
				})
				a := dialRaw(t, addr)
				a.hello()
				for i, end := range []string{"commitTransaction", "abortTransaction"} {
					lsid := newLSID(byte(0x60 + i))
					if r := a.cmd(txnCmd("insert", lsid, 1, true)); okOf(r) != 1 {
						t.Fatalf("start: %v", r)
					}
					if r := a.cmd(txnCmd(end, lsid, 1, false)); okOf(r) != 1 {
						t.Fatalf("%s: %v", end, r)
					}
				}
				txns := orders.Transactions()
				if len(txns) != 2 || txns[0].State != fakemongo.TxnCommitted || txns[1].State != fakemongo.TxnAborted {
					t.Fatalf("transactions on the route's upstream: %+v", txns)
				}
				if n := other.Requests("commitTransaction") + other.Requests("abortTransaction"); n != 0 {
					t.Fatalf("%d transaction ends went to admin's route", n)
				}
			})
		}
	})
}
