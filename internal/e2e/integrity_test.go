package e2e

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/topology"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// Connection integrity: statement mode does not pin transactions, a
// connection with unread reply bytes (or a reply to another request queued
// on it) is never pooled nor trusted, and an upstream failure in the middle
// of a transaction is labelled TransientTransactionError.

func whoamiCmd() bson.D { return bson.D{{Key: "whoami", Value: 1}, {Key: "$db", Value: "test"}} }

// In statement mode a transaction keeps server affinity but no connection:
// with a pool of one, another client's command runs on that one connection
// while the transaction is open. In transaction mode the same command waits
// for the connection and times out in the wait queue.
func TestStatementModeDoesNotPinAnOpenTransaction(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		for _, m := range []string{"statement", "transaction"} {
			t.Run(m, func(t *testing.T) {
				up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
				connRecorder(up)
				_, addr := bouncer(t, up.URI(), func(c *config.Config) {
					mode(m, 1)(c)
					c.Global.WaitQueueTimeout = 300 * time.Millisecond
				})
				a, b := dialRaw(t, addr), dialRaw(t, addr)
				a.hello()
				b.hello()
				lsid := newLSID(0x31)
				if r := a.cmd(txnCmd("insert", lsid, 1, true)); okOf(r) != 1 {
					t.Fatalf("start: %v", r)
				}
				// a's transaction is open: b asks for the only connection.
				start := time.Now()
				r := b.cmd(whoamiCmd())
				waited := time.Since(start)
				txns := up.Transactions()
				if len(txns) != 1 || len(txns[0].ConnIDs) == 0 {
					t.Fatalf("transactions: %+v", txns)
				}
				txnConn := txns[0].ConnIDs[0]
				if m == "statement" {
					got, _ := r.Lookup("conn").AsInt64OK()
					if okOf(r) != 1 || got != txnConn {
						t.Fatalf("b in the middle of a's transaction (after %v): %v, want ok on the transaction's conn %d", waited, r, txnConn)
					}
				} else if okOf(r) != 0 || codeOf(r) != 89 {
					t.Fatalf("b in the middle of a pinned transaction (after %v): %v, want a wait queue timeout (89)", waited, r)
				}
				// The transaction goes on and commits, on the one connection.
				if r := a.cmd(txnCmd("insert", lsid, 1, false)); okOf(r) != 1 {
					t.Fatalf("second insert: %v", r)
				}
				if r := a.cmd(txnCmd("commitTransaction", lsid, 1, false)); okOf(r) != 1 {
					t.Fatalf("commit: %v", r)
				}
				txns = up.Transactions()
				if len(txns) != 1 || txns[0].State != fakemongo.TxnCommitted {
					t.Fatalf("transactions: %+v", txns)
				}
				if r := b.cmd(whoamiCmd()); okOf(r) != 1 {
					t.Fatalf("b after commit: %v", r)
				}
			})
		}
	})
}

// A client that goes away in the middle of an exhaust stream leaves the rest
// of the stream unread on the upstream connection: that connection must be
// closed, and the next request must get a fresh one.
func TestClientGoneMidExhaustStreamClosesTheUpstreamConn(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{})
		connRecorder(up)
		var streamConn atomic.Int64
		up.Handle("stream", func(r *fakemongo.Request) fakemongo.Reply {
			streamConn.Store(r.ConnID)
			docs := make([]any, 100)
			for i := range docs {
				docs[i] = bson.D{{Key: "ok", Value: 1.0}, {Key: "i", Value: i}}
			}
			rep := fakemongo.Docs(docs...)
			rep.Interval = 20 * time.Millisecond
			return rep
		})
		_, addr := bouncer(t, up.URI(), mode("statement", 1))
		a, b := dialRaw(t, addr), dialRaw(t, addr)
		a.hello()
		b.hello()
		pooled := whoami(t, b)
		id := a.send(wire.FlagExhaustAllowed, bson.D{{Key: "stream", Value: 1}, {Key: "$db", Value: "test"}})
		if first := a.recv(); first.header.ResponseTo != id || first.flags&wire.FlagMoreToCome == 0 {
			t.Fatalf("first stream reply: responseTo=%d flags=%v", first.header.ResponseTo, first.flags)
		}
		if got := streamConn.Load(); got != pooled {
			t.Fatalf("stream ran on conn %d, want the only pooled one %d", got, pooled)
		}
		// Reset rather than FIN: the bouncer's next write of the stream fails.
		_ = a.c.(*net.TCPConn).SetLinger(0)
		a.c.Close()
		// b needs the only connection of the pool: it waits until the stream's
		// connection is given up, and must then get a new one.
		if got := whoami(t, b); got == pooled {
			t.Fatalf("b was served on conn %d, which still had a stream to read", got)
		}
		waitFor(t, "the stream's upstream connection to close", func() bool {
			return !slices.ContainsFunc(up.Conns(), func(c fakemongo.ConnInfo) bool { return c.ID == pooled })
		})
	})
}

// mangling says what startMangleRelay does to a marked reply.
type mangling int

const (
	mangleMore    mangling = iota // moreToCome set, then a copy: a stream the request did not allow
	mangleExtra                   // twice in one write: a reply nobody asked for
	mangleLate                    // once, then a copy 100ms later, after the connection is back in the pool
	mangleGoodSum                 // with a correct CRC-32C added
	mangleBadSum                  // with a wrong CRC-32C added
)

// withChecksum returns msg (an OP_MSG without one) with a CRC-32C added,
// correct or not.
func withChecksum(msg []byte, good bool) []byte {
	out := append(slices.Clone(msg), 0, 0, 0, 0)
	binary.LittleEndian.PutUint32(out, uint32(len(out)))
	flags := binary.LittleEndian.Uint32(out[wire.HeaderLen:])
	binary.LittleEndian.PutUint32(out[wire.HeaderLen:], flags|uint32(wire.FlagChecksumPresent))
	wire.UpdateChecksum(out)
	if !good {
		out[len(out)-1] ^= 0x5a
	}
	return out
}

// startMangleRelay forwards TCP connections to an upstream. Requests pass
// unchanged; an upstream reply containing marker is mangled as how says.
// lateSent is closed once the late copy of mangleLate has been written.
func startMangleRelay(t testing.TB, upstream string, marker []byte, how mangling) (addr string, lateSent <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	late := make(chan struct{})
	var lateOnce sync.Once
	closeAll := func() {
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		conns = nil
		mu.Unlock()
	}
	t.Cleanup(func() {
		ln.Close()
		closeAll()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.DialTimeout("tcp", upstream, 5*time.Second)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, u)
			mu.Unlock()
			wg.Add(2)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(u, c)
				c.Close()
				u.Close()
			}()
			go func() {
				defer wg.Done()
				defer c.Close()
				defer u.Close()
				r := bufio.NewReader(u)
				for {
					msg, err := wire.ReadMessage(r, nil, wire.DefaultMaxMessageSize)
					if err != nil {
						return
					}
					out := msg
					marked := bytes.Contains(msg, marker)
					switch {
					case marked && (how == mangleGoodSum || how == mangleBadSum):
						out = withChecksum(msg, how == mangleGoodSum)
					case marked && how != mangleLate:
						first := slices.Clone(msg)
						if how == mangleMore {
							flags := binary.LittleEndian.Uint32(first[wire.HeaderLen:])
							binary.LittleEndian.PutUint32(first[wire.HeaderLen:], flags|uint32(wire.FlagMoreToCome))
						}
						out = append(first, msg...)
					}
					if _, err := c.Write(out); err != nil {
						return
					}
					if marked && how == mangleLate {
						// The lateness is the mangling: the copy comes
						// after the bouncer has taken the reply, and
						// likely given the connection back to its pool.
						time.Sleep(100 * time.Millisecond)
						if _, err := c.Write(msg); err != nil {
							return
						}
						lateOnce.Do(func() { close(late) })
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), late
}

// An upstream that answers a plain request (no exhaustAllowed) with more
// than one reply leaves bytes on the connection that belong to no request:
// the connection must be closed, never returned to the pool, and the next
// request must run on a fresh connection and get its own reply. Statement
// mode serves the request on the event loop (when it is on), session mode
// on the client's goroutine.
func TestUnreadReplyBytesCloseTheUpstreamConn(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		for _, m := range []string{"statement", "session"} {
			for _, tc := range []struct {
				name string
				how  mangling
			}{{"moreToCome", mangleMore}, {"extraReply", mangleExtra}, {"lateReply", mangleLate}} {
				t.Run(m+"/"+tc.name, func(t *testing.T) {
					up := fakemongo.Start(t, fakemongo.Options{})
					connRecorder(up)
					marker := "mangle-me-" + m + tc.name
					var badConn atomic.Int64
					up.Handle("twice", func(r *fakemongo.Request) fakemongo.Reply {
						badConn.Store(r.ConnID)
						return fakemongo.OK(bson.E{Key: "marker", Value: marker})
					})
					relay, lateSent := startMangleRelay(t, up.Addr(), []byte(marker), tc.how)
					_, addr := bouncer(t, "mongodb://"+relay+"/?directConnection=true", mode(m, 1))
					a := dialRaw(t, addr)
					a.hello()
					pooled := whoami(t, a)
					id := a.send(0, bson.D{{Key: "twice", Value: 1}, {Key: "$db", Value: "test"}})
					rep := a.recv()
					if rep.header.ResponseTo != id {
						t.Fatalf("twice: responseTo %d, want %d", rep.header.ResponseTo, id)
					}
					if badConn.Load() != pooled {
						t.Fatalf("twice ran on conn %d, want the only pooled one %d", badConn.Load(), pooled)
					}
					if tc.how == mangleMore && (okOf(rep.body) != 0 || rep.flags&wire.FlagMoreToCome != 0) {
						t.Fatalf("a stream to a request that did not allow it was relayed: flags=%v %v", rep.flags, rep.body)
					}
					// The next requests get their own replies, on a new
					// connection: another client's (statement mode shares the
					// pool of one) and this client's.
					clients := []*rawClient{a}
					if m == "statement" {
						b := dialRaw(t, addr)
						b.hello()
						clients = []*rawClient{b, a}
					}
					if tc.how == mangleLate {
						// The late copy is on the pooled connection when the
						// next request is sent there: taken for that request's
						// reply, it must fail the request (retryably), never be
						// relayed as its answer.
						select {
						case <-lateSent:
						case <-time.After(10 * time.Second):
							t.Fatal("the relay never wrote the late copy")
						}
						r := clients[0].cmd(whoamiCmd())
						if _, err := r.LookupErr("conn"); err == nil {
							t.Fatalf("whoami answered on the connection with a stale reply queued: %v", r)
						}
						msg, _ := r.Lookup("errmsg").StringValueOK()
						// (Read with the answer that follows it, the stale copy
						// is also "more than one reply".)
						if okOf(r) != 0 || !strings.Contains(msg, "mongobouncer") ||
							!strings.Contains(msg, "answered request") && !strings.Contains(msg, "more than one reply") {
							t.Fatalf("whoami after a late extra reply: want a mongobouncer error about the stray reply, got %v", r)
						}
					}
					for _, c := range clients {
						r := c.cmd(whoamiCmd())
						got, err := r.LookupErr("conn")
						if err != nil {
							t.Fatalf("whoami got someone else's reply: %v", r)
						}
						if id, _ := got.AsInt64OK(); id == pooled {
							t.Fatalf("whoami served on conn %d, which had unread reply bytes", id)
						}
					}
				})
			}
		}
	})
}

// An upstream failure in the middle of a transaction is answered with an
// error labelled TransientTransactionError (and a retryable code naming
// mongobouncer), so that the driver retries the whole transaction.
func TestUpstreamFailureInTransactionIsTransient(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		check := func(t *testing.T, r bson.Raw, code int32) {
			t.Helper()
			msg, _ := r.Lookup("errmsg").StringValueOK()
			if okOf(r) != 0 || codeOf(r) != code || !strings.Contains(msg, "mongobouncer") {
				t.Fatalf("want a mongobouncer error with code %d, got %v", code, r)
			}
			if labels := limLabels(r); !slices.Equal(labels, []string{"TransientTransactionError"}) {
				t.Fatalf("errorLabels %v, want [TransientTransactionError]: %v", labels, r)
			}
		}
		for _, m := range []string{"statement", "transaction", "session"} {
			t.Run("connClosed/"+m, func(t *testing.T) {
				up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
				_, addr := bouncer(t, up.URI(), mode(m, 1))
				a := dialRaw(t, addr)
				a.hello()
				lsid := newLSID(0x41)
				if r := a.cmd(txnCmd("insert", lsid, 1, true)); okOf(r) != 1 {
					t.Fatalf("start: %v", r)
				}
				up.SetFailPoint(fakemongo.FailPoint{Mode: fakemongo.FailTimes, Times: 1,
					FailCommands: []string{"insert"}, CloseConnection: true})
				check(t, a.cmd(txnCmd("insert", lsid, 1, false)), 9001)
				if up.FailPointHits() != 1 {
					t.Fatalf("fail point hit %d times", up.FailPointHits())
				}
			})
		}
		// The server is gone before the command can get a connection: the
		// error comes from server selection.
		t.Run("serverGone/statement", func(t *testing.T) {
			up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
			app, addr := bouncer(t, up.URI(), func(c *config.Config) {
				mode("statement", 1)(c)
				c.Global.ServerSelectionTimeout = 300 * time.Millisecond
			})
			a := dialRaw(t, addr)
			a.hello()
			lsid := newLSID(0x42)
			if r := a.cmd(txnCmd("insert", lsid, 1, true)); okOf(r) != 1 {
				t.Fatalf("start: %v", r)
			}
			up.Kill()
			waitFor(t, "the killed server to be unusable", func() bool {
				for _, tp := range app.Topologies() {
					for _, s := range tp.Servers() {
						if s.State() == topology.Usable {
							return false
						}
					}
				}
				return true
			})
			check(t, a.cmd(txnCmd("find", lsid, 1, false)), 6)
		})
	})
}

// An upstream reply with a checksum is relayed unchanged when the checksum
// is right; with a wrong one the request fails retryably and the
// connection is not used again. Statement mode serves the request on the
// event loop (when it is on), session mode on the client's goroutine.
func TestUpstreamReplyChecksum(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		for _, m := range []string{"statement", "session"} {
			for _, good := range []bool{true, false} {
				t.Run(fmt.Sprintf("%s/good=%v", m, good), func(t *testing.T) {
					up := fakemongo.Start(t, fakemongo.Options{})
					connRecorder(up)
					marker := fmt.Sprintf("sum-%s-%v", m, good)
					up.Handle("summed", func(r *fakemongo.Request) fakemongo.Reply {
						return fakemongo.OK(bson.E{Key: "marker", Value: marker})
					})
					how := mangleBadSum
					if good {
						how = mangleGoodSum
					}
					relay, _ := startMangleRelay(t, up.Addr(), []byte(marker), how)
					_, addr := bouncer(t, "mongodb://"+relay+"/?directConnection=true", mode(m, 1))
					a := dialRaw(t, addr)
					a.hello()
					pooled := whoami(t, a)
					a.send(0, bson.D{{Key: "summed", Value: 1}, {Key: "$db", Value: "test"}})
					rep := a.recv()
					if good {
						if okOf(rep.body) != 1 || rep.flags&wire.FlagChecksumPresent == 0 {
							t.Fatalf("a reply with a good checksum: flags=%v %v, want it relayed with its checksum", rep.flags, rep.body)
						}
						if got := whoami(t, a); got != pooled {
							t.Fatalf("after a good reply the client moved from conn %d to %d", pooled, got)
						}
						return
					}
					msg, _ := rep.body.Lookup("errmsg").StringValueOK()
					if okOf(rep.body) != 0 || !strings.Contains(msg, "mongobouncer") || !strings.Contains(msg, "checksum") {
						t.Fatalf("a reply with a bad checksum: want a mongobouncer error about it, got %v", rep.body)
					}
					if got := whoami(t, a); got == pooled {
						t.Fatalf("the connection that sent a bad checksum (%d) served the next request", got)
					}
				})
			}
		}
	})
}
