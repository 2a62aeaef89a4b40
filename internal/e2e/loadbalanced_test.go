package e2e

// Drivers in load-balanced mode (loadBalanced=true in the application's
// URI, for mongobouncers behind a TCP balancer or a Kubernetes Service):
// every connection's hello gets this process's serviceId, and the driver
// pins a cursor (find, getMore, killCursors) and a transaction to one
// connection. These tests drive the Go driver that way through each pool
// mode and check results, pinning as the driver saw it, and the serviceId
// it recorded on every command.

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/devmongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// lbURI is the option that puts a driver in load-balanced mode.
const lbURI = "&loadBalanced=true"

// serviceIDOf asks the mongobouncer at addr for its serviceId the way a
// load-balanced driver does, on a connection of its own.
func serviceIDOf(t testing.TB, addr string) bson.ObjectID {
	t.Helper()
	r := dialRaw(t, addr).cmd(bson.D{{Key: "hello", Value: 1}, {Key: "loadBalanced", Value: true}, {Key: "$db", Value: "admin"}})
	id, ok := r.Lookup("serviceId").ObjectIDOK()
	if !ok {
		t.Fatalf("hello with loadBalanced: no serviceId in %v", r)
	}
	return id
}

// lbLog records, for each command a driver started, its name, its driver
// connection and its serviceId: what pinning and serviceId look like from
// the application's side.
type lbLog struct {
	mu sync.Mutex
	// cmds is guarded by mu: the driver calls the monitor from its own
	// goroutines.
	cmds []lbCmd
	// failed is guarded by mu.
	failed []string
}

type lbCmd struct {
	name    string
	conn    string         // the driver's connection id
	service *bson.ObjectID // nil when the driver recorded none
}

func (l *lbLog) monitor() *event.CommandMonitor {
	return &event.CommandMonitor{
		Started: func(_ context.Context, e *event.CommandStartedEvent) {
			var sid *bson.ObjectID
			if e.ServiceID != nil {
				v := *e.ServiceID
				sid = &v
			}
			l.mu.Lock()
			l.cmds = append(l.cmds, lbCmd{name: e.CommandName, conn: e.ConnectionID, service: sid})
			l.mu.Unlock()
		},
		Failed: func(_ context.Context, e *event.CommandFailedEvent) {
			l.mu.Lock()
			l.failed = append(l.failed, e.CommandName+": "+e.Failure.Error())
			l.mu.Unlock()
		},
	}
}

// take returns the commands recorded so far and forgets them.
func (l *lbLog) take() ([]lbCmd, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c, f := l.cmds, l.failed
	l.cmds, l.failed = nil, nil
	return c, f
}

// checkOneConn fails unless every command in cmds ran on one driver
// connection and carried serviceId want; it returns the names in order.
func checkOneConn(t *testing.T, what string, cmds []lbCmd, want bson.ObjectID) []string {
	t.Helper()
	var names []string
	for _, c := range cmds {
		names = append(names, c.name)
		if c.conn != cmds[0].conn {
			t.Errorf("%s: %s ran on driver connection %s, the first command on %s: not pinned", what, c.name, c.conn, cmds[0].conn)
		}
		if c.service == nil || *c.service != want {
			t.Errorf("%s: %s has serviceId %v, want %v", what, c.name, c.service, want)
		}
	}
	return names
}

// testLBCursors runs a find in batches of 5 (getMore), and a cursor
// abandoned half way (killCursors), with a load-balanced driver through
// the mongobouncer at addr, whose serviceId is sid.
func testLBCursors(t *testing.T, addr, db string, sid bson.ObjectID) {
	var log lbLog
	c := driverWith(t, addr, lbURI, func(o *options.ClientOptions) { o.SetMonitor(log.monitor()) })
	ctx := ctxNoDeadline(t, 30*time.Second)
	coll := c.Database(db).Collection("items")
	const total = 23
	docs := make([]any, total)
	for i := range docs {
		docs[i] = bson.D{{Key: "_id", Value: i}}
	}
	_, err := coll.InsertMany(ctx, docs)
	must(t, err)
	log.take()

	// No sort (the scripted server has none): the ids are checked as a set.
	got := findAll(t, ctx, coll, bson.D{}, options.Find().SetBatchSize(5))
	ids := ns(t, got, "_id")
	slices.Sort(ids)
	if len(ids) != total {
		t.Fatalf("got %d docs, want %d", len(ids), total)
	}
	for i, id := range ids {
		if id != int64(i) {
			t.Fatalf("doc %d has _id %d", i, id)
		}
	}
	cmds, failed := log.take()
	names := checkOneConn(t, "find in batches", cmds, sid)
	// 23 documents in batches of 5: the find's batch and 4 getMores (the
	// last one ends the cursor).
	if fmt.Sprint(names) != "[find getMore getMore getMore getMore]" {
		t.Errorf("commands %v, want a find and 4 getMores", names)
	}
	if len(failed) != 0 {
		t.Fatalf("failed commands: %v", failed)
	}

	cur, err := coll.Find(ctx, bson.D{}, options.Find().SetBatchSize(5))
	must(t, err)
	for range 7 {
		if !cur.Next(ctx) {
			t.Fatalf("cursor ended early: %v", cur.Err())
		}
	}
	must(t, cur.Close(ctx))
	cmds, failed = log.take()
	names = checkOneConn(t, "abandoned cursor", cmds, sid)
	if fmt.Sprint(names) != "[find getMore killCursors]" {
		t.Errorf("commands %v, want find, getMore, killCursors", names)
	}
	if len(failed) != 0 {
		t.Fatalf("failed commands: %v", failed)
	}
}

// countDocs counts coll's documents with a find (the scripted server has
// no aggregate, which CountDocuments uses).
func countDocs(ctx context.Context, coll *mongo.Collection) (int, error) {
	cur, err := coll.Find(ctx, bson.D{})
	if err != nil {
		return 0, err
	}
	var docs []bson.Raw
	err = cur.All(ctx, &docs)
	return len(docs), err
}

// testLBTransactions commits a transaction of three inserts and aborts one
// of two, with a load-balanced driver through the mongobouncer at addr
// (serviceId sid) to up, and checks what up committed.
func testLBTransactions(t *testing.T, addr string, up *fakemongo.Server, sid bson.ObjectID) {
	var log lbLog
	c := driverWith(t, addr, lbURI, func(o *options.ClientOptions) { o.SetMonitor(log.monitor()) })
	ctx := ctxT(t, 30*time.Second)
	coll := c.Database("lbtxn").Collection("orders")
	// Another client's traffic between the statements, so that a
	// connection not pinned would show.
	other := driverWith(t, addr, lbURI, nil).Database("lbtxn").Collection("other")

	run := func(commit bool, n int) {
		sess, err := c.StartSession()
		must(t, err)
		defer sess.EndSession(ctx)
		must(t, sess.StartTransaction())
		sctx := mongo.NewSessionContext(ctx, sess)
		for i := range n {
			_, err := coll.InsertOne(sctx, bson.D{{Key: "commit", Value: commit}, {Key: "i", Value: i}})
			must(t, err)
			_, err = other.InsertOne(ctx, bson.D{{Key: "i", Value: i}})
			must(t, err)
		}
		if commit {
			must(t, sess.CommitTransaction(ctx))
		} else {
			must(t, sess.AbortTransaction(ctx))
		}
	}
	log.take()
	run(true, 3)
	cmds, failed := log.take()
	if names := checkOneConn(t, "committed transaction", cmds, sid); fmt.Sprint(names) != "[insert insert insert commitTransaction]" {
		t.Errorf("committed transaction: commands %v", names)
	}
	run(false, 2)
	cmds, f2 := log.take()
	if names := checkOneConn(t, "aborted transaction", cmds, sid); fmt.Sprint(names) != "[insert insert abortTransaction]" {
		t.Errorf("aborted transaction: commands %v", names)
	}
	if failed = append(failed, f2...); len(failed) != 0 {
		t.Fatalf("failed commands: %v", failed)
	}

	var states []string
	for _, tx := range up.Transactions() {
		states = append(states, fmt.Sprintf("%s%v", tx.State, tx.Commands))
	}
	if want := "[committed[insert insert insert commitTransaction] aborted[insert insert abortTransaction]]"; fmt.Sprint(states) != want {
		t.Fatalf("upstream transactions %v, want %s", states, want)
	}
	n, err := countDocs(ctx, coll)
	must(t, err)
	if n != 3 {
		t.Fatalf("%d documents after one committed transaction of 3 and one aborted, want 3", n)
	}
}

var lbModes = []string{"session", "transaction", "statement"}

// A load-balanced driver's cursors and transactions give the right results
// in every pool mode, pinned to one driver connection, every command
// carrying the one serviceId of this process (the scripted server: it has
// transactions).
func TestLoadBalancedDriverCursorsAndTransactions(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		for _, m := range lbModes {
			t.Run(m, func(t *testing.T) {
				up := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos, InMemory: true})
				_, addr := bouncer(t, up.URI(), mode(m, 2))
				sid := serviceIDOf(t, addr)
				if again := serviceIDOf(t, addr); again != sid {
					t.Fatalf("serviceId %v on one connection, %v on another: it must not change while the process runs", sid, again)
				}
				t.Run("Cursors", func(t *testing.T) { testLBCursors(t, addr, "lbcur", sid) })
				t.Run("Transactions", func(t *testing.T) { testLBTransactions(t, addr, up, sid) })
			})
		}
	})
}

// The same cursors against FerretDB (MONGOBOUNCER_DEVMONGO), a real
// server's cursors and batching.
func TestLoadBalancedDriverCursorsDevmongo(t *testing.T) {
	oneIO(t)
	up := devmongo.Start(t)
	for _, m := range lbModes {
		t.Run(m, func(t *testing.T) {
			_, addr := bouncer(t, up.URI(), mode(m, 2))
			testLBCursors(t, addr, "lbcur_"+m, serviceIDOf(t, addr))
		})
	}
}

// serviceId names one process: it survives a reload, and a restart (a new
// process on the same address) answers with a new one, which a
// load-balanced driver picks up on its new connections.
func TestLoadBalancedServiceIDAcrossReloadAndRestart(t *testing.T) {
	oneIO(t)
	up := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos, InMemory: true})
	// From a file, to reload; its clean-up closing it again is harmless.
	first, addr, _ := fileBouncer(t, baseTOML(up.URI(), ""))
	before := serviceIDOf(t, addr)
	must(t, first.Reload())
	if after := serviceIDOf(t, addr); after != before {
		t.Fatalf("serviceId %v before a reload, %v after: it must not change while the process runs", before, after)
	}

	var log lbLog
	c := driverWith(t, addr, lbURI, func(o *options.ClientOptions) { o.SetMonitor(log.monitor()) })
	coll := c.Database("lbrestart").Collection("items")
	ctx := ctxT(t, 30*time.Second)
	_, err := coll.InsertOne(ctx, bson.D{{Key: "i", Value: 1}})
	must(t, err)
	cmds, _ := log.take()
	checkOneConn(t, "before the restart", cmds, before)

	must(t, first.Close(ctxT(t, 10*time.Second)))
	bouncer(t, up.URI(), func(cfg *config.Config) { cfg.Global.Listen = addr })
	restarted := serviceIDOf(t, addr)
	if restarted == before {
		t.Fatalf("serviceId %v before a restart and after: a new process must answer with a new one", before)
	}
	// The driver's connection to the old process is gone: its next command
	// may fail with a network error (a read retries), and the ones after
	// run on new connections to the new process.
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := countDocs(ctx, coll)
		if err == nil {
			if n != 1 {
				t.Fatalf("count %d after the restart, want 1", n)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no successful command after the restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	cmds, _ = log.take()
	last := cmds[len(cmds)-1]
	if last.service == nil || *last.service != restarted {
		t.Fatalf("after the restart the driver recorded serviceId %v, want the new process's %v", last.service, restarted)
	}
}

// The load-balancer specification asks a service to abort a transaction
// when the connection it is pinned to closes: a load-balanced driver never
// continues it on another connection. In every pool mode, a client that
// said loadBalanced and disconnects mid-transaction has it aborted
// upstream.
func TestLoadBalancedClientGoneAbortsItsTransaction(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		for _, m := range lbModes {
			t.Run(m, func(t *testing.T) {
				up := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos, InMemory: true})
				_, addr := bouncer(t, up.URI(), mode(m, 2))
				c := dialRaw(t, addr)
				r := c.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "loadBalanced", Value: true}, {Key: "$db", Value: "admin"}})
				if _, ok := r.Lookup("serviceId").ObjectIDOK(); !ok {
					t.Fatalf("no serviceId: %v", r)
				}
				lsid := newLSID(0x7b)
				for i, start := range []bool{true, false} {
					if r := c.cmd(txnCmd("insert", lsid, 1, start)); okOf(r) != 1 {
						t.Fatalf("insert %d: %v", i, r)
					}
				}
				c.c.Close()
				waitFor(t, "the transaction aborted upstream", func() bool {
					txs := up.Transactions()
					return len(txs) == 1 && txs[0].State == fakemongo.TxnAborted
				})
				if txs := up.Transactions(); txs[0].AbortedBy != "abortTransaction" {
					t.Fatalf("aborted by %q, want abortTransaction", txs[0].AbortedBy)
				}
			})
		}
	})
}

// An operator checks which applications use loadBalanced=true: showClients
// (and /admin/clients) marks their connections loadBalanced, and no other.
func TestShowClientsMarksLoadBalancedClients(t *testing.T) {
	oneIO(t)
	up := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos, InMemory: true})
	a, addr, _ := fileBouncer(t, baseTOML(up.URI(), ""))
	waitUsable(t, a, 1)
	lb := driver(t, addr, lbURI+"&appName=lb-app")
	plain := driver(t, addr, "&appName=plain-app")
	ctx := ctxT(t, 20*time.Second)
	for _, c := range []*mongo.Client{lb, plain} {
		must(t, c.Ping(ctx, nil))
	}
	raw := adminCmd(t, plain, bson.D{{Key: "showClients", Value: 1}})
	var reply struct {
		Clients []struct {
			AppName      string `bson:"appName"`
			LoadBalanced bool   `bson:"loadBalanced"`
		} `bson:"clients"`
	}
	must(t, bson.Unmarshal(raw, &reply))
	seen := map[string]int{}
	for _, c := range reply.Clients {
		switch {
		case c.AppName == "lb-app" && !c.LoadBalanced:
			t.Errorf("a loadBalanced=true driver's connection is not marked loadBalanced: %v", raw)
		case c.AppName != "lb-app" && c.LoadBalanced:
			t.Errorf("a %q connection is marked loadBalanced: %v", c.AppName, raw)
		}
		seen[c.AppName]++
	}
	if seen["lb-app"] == 0 || seen["plain-app"] == 0 {
		t.Fatalf("showClients lacks a driver's connections: %v", raw)
	}
}

// The Node driver in load-balanced mode (testdata/node_loadbalanced.js):
// cursors and transactions pinned to one connection with this process's
// serviceId, in every pool mode.
func TestLoadBalancedNodeDriver(t *testing.T) {
	modules := nodeModulesPath(t)
	script, err := filepath.Abs(filepath.Join("testdata", "node_loadbalanced.js"))
	must(t, err)
	oneIO(t)
	for _, m := range lbModes {
		t.Run(m, func(t *testing.T) {
			up := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos, InMemory: true})
			_, addr := bouncer(t, up.URI(), mode(m, 2))
			sid := serviceIDOf(t, addr)
			runNodeTool(t, []string{"NODE_PATH=" + modules}, "node", script, "mongodb://"+addr+"/?loadBalanced=true", sid.Hex())
			var states []string
			for _, tx := range up.Transactions() {
				states = append(states, tx.State.String())
			}
			if fmt.Sprint(states) != "[committed aborted]" {
				t.Fatalf("upstream transactions %v, want [committed aborted]", states)
			}
		})
	}
}
