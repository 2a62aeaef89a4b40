package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.uber.org/goleak"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/testutil/devmongo"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// TestDevmongoDrivers runs the Go driver through mongobouncer against a real
// MongoDB-compatible server (FerretDB). One devmongo serves every subtest;
// each subtest uses its own database and, where it needs particular
// settings, its own mongobouncer.
func TestDevmongoDrivers(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		// Registered first so it runs last, after every bouncer, client and the
		// devmongo process have been stopped by later cleanups.
		ignore := goleak.IgnoreCurrent()
		t.Cleanup(func() { goleak.VerifyNone(t, ignore) })

		up := devmongo.Start(t)

		// The subtests that need no special settings share one bouncer, closed
		// when they are done: ManyClients counts every connection this process
		// has to the upstream, so no other bouncer may be alive then.
		t.Run("Shared", func(t *testing.T) {
			_, addr := bouncer(t, up.URI(), nil)
			t.Run("CRUD", func(t *testing.T) { testCRUD(t, addr) })
			t.Run("GetMore", func(t *testing.T) { testGetMore(t, addr) })
			t.Run("Aggregate", func(t *testing.T) { testAggregate(t, addr) })
			t.Run("BulkWrite", func(t *testing.T) { testBulkWrite(t, addr) })
			t.Run("Sessions", func(t *testing.T) { testSessions(t, addr) })
			for _, name := range []string{"snappy", "zlib", "zstd"} {
				t.Run("Compression/"+name, func(t *testing.T) { testCompression(t, addr, name) })
			}
			t.Run("Pymongo", func(t *testing.T) { testPymongo(t, addr) })
		})
		t.Run("RetryableWrites", func(t *testing.T) { testRetryableWrites(t, up) })
		t.Run("ManyClients", func(t *testing.T) { testManyClients(t, up) })
	})
}

// cmdLog records the commands a driver sends, for assertions on what went
// over the wire (lsid, txnNumber, getMore counts).
type cmdLog struct {
	mu sync.Mutex
	// started, succeeded and failed are guarded by mu: the driver calls the
	// monitor from its own goroutines.
	started   []event.CommandStartedEvent
	succeeded []string
	failed    []string
}

func (l *cmdLog) monitor() *event.CommandMonitor {
	return &event.CommandMonitor{
		Started: func(_ context.Context, e *event.CommandStartedEvent) {
			c := *e
			c.Command = slices.Clone(e.Command)
			l.mu.Lock()
			l.started = append(l.started, c)
			l.mu.Unlock()
		},
		Succeeded: func(_ context.Context, e *event.CommandSucceededEvent) {
			l.mu.Lock()
			l.succeeded = append(l.succeeded, e.CommandName)
			l.mu.Unlock()
		},
		Failed: func(_ context.Context, e *event.CommandFailedEvent) {
			l.mu.Lock()
			l.failed = append(l.failed, e.CommandName+": "+e.Failure.Error())
			l.mu.Unlock()
		},
	}
}

// named returns the started commands called name.
func (l *cmdLog) named(name string) []bson.Raw {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []bson.Raw
	for _, e := range l.started {
		if e.CommandName == name {
			out = append(out, e.Command)
		}
	}
	return out
}

func (l *cmdLog) failures() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.failed)
}

// driverWith is driver with access to the client options (monitors,
// dialers) that a URI cannot express.
func driverWith(t testing.TB, addr, extra string, tweak func(*options.ClientOptions)) *mongo.Client {
	t.Helper()
	uri := fmt.Sprintf("mongodb://%s/?serverSelectionTimeoutMS=10000&connectTimeoutMS=5000%s", addr, extra)
	o := options.Client().ApplyURI(uri)
	if tweak != nil {
		tweak(o)
	}
	c, err := mongo.Connect(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = c.Disconnect(ctx)
	})
	return c
}

// ctxNoDeadline is cancelled after d but has no deadline. With a deadline
// the driver adds maxTimeMS to every command, and FerretDB 1.24's distinct
// refuses that field ("unknown field maxTimeMS"), directly as through the
// bouncer.
func ctxNoDeadline(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	stop := time.AfterFunc(d, cancel)
	t.Cleanup(func() { stop.Stop(); cancel() })
	return ctx
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// ns returns the numbers in field n of docs, in order.
func ns(t testing.TB, docs []bson.M, field string) []int64 {
	t.Helper()
	out := make([]int64, 0, len(docs))
	for _, d := range docs {
		switch v := d[field].(type) {
		case int32:
			out = append(out, int64(v))
		case int64:
			out = append(out, v)
		case float64:
			out = append(out, int64(v))
		default:
			t.Fatalf("field %q of %v is %T, want a number", field, d, d[field])
		}
	}
	return out
}

func findAll(t testing.TB, ctx context.Context, coll *mongo.Collection, filter any, opts ...options.Lister[options.FindOptions]) []bson.M {
	t.Helper()
	cur, err := coll.Find(ctx, filter, opts...)
	must(t, err)
	var docs []bson.M
	must(t, cur.All(ctx, &docs))
	return docs
}

func testCRUD(t *testing.T, addr string) {
	c := driver(t, addr, "")
	ctx := ctxT(t, 30*time.Second)
	coll := c.Database("e2e_crud").Collection("items")

	one, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}, {Key: "kind", Value: "a"}, {Key: "n", Value: 1}})
	must(t, err)
	if one.InsertedID != int32(1) {
		t.Fatalf("InsertOne id = %v (%T), want 1", one.InsertedID, one.InsertedID)
	}
	many, err := coll.InsertMany(ctx, []any{
		bson.D{{Key: "_id", Value: 2}, {Key: "kind", Value: "a"}, {Key: "n", Value: 2}},
		bson.D{{Key: "_id", Value: 3}, {Key: "kind", Value: "b"}, {Key: "n", Value: 3}},
		bson.D{{Key: "_id", Value: 4}, {Key: "kind", Value: "b"}, {Key: "n", Value: 4}},
		bson.D{{Key: "_id", Value: 5}, {Key: "kind", Value: "c"}, {Key: "n", Value: 5}},
	})
	must(t, err)
	if len(many.InsertedIDs) != 4 {
		t.Fatalf("InsertMany inserted %d, want 4", len(many.InsertedIDs))
	}

	docs := findAll(t, ctx, coll, bson.D{{Key: "kind", Value: "b"}}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if got := ns(t, docs, "n"); !slices.Equal(got, []int64{3, 4}) {
		t.Fatalf("find kind=b: n = %v, want [3 4]", got)
	}

	var got bson.M
	must(t, coll.FindOne(ctx, bson.D{{Key: "_id", Value: 5}}).Decode(&got))
	if got["kind"] != "c" {
		t.Fatalf("findOne _id=5 = %v", got)
	}
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: 99}}).Err(); !errors.Is(err, mongo.ErrNoDocuments) {
		t.Fatalf("findOne missing: %v, want ErrNoDocuments", err)
	}

	ur, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: 10}}}})
	must(t, err)
	if ur.MatchedCount != 1 || ur.ModifiedCount != 1 {
		t.Fatalf("UpdateOne: %+v", ur)
	}
	ur, err = coll.UpdateMany(ctx, bson.D{{Key: "kind", Value: "b"}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 100}}}})
	must(t, err)
	if ur.MatchedCount != 2 || ur.ModifiedCount != 2 {
		t.Fatalf("UpdateMany: %+v", ur)
	}
	ur, err = coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: 6}}, bson.D{{Key: "$set", Value: bson.D{{Key: "kind", Value: "u"}, {Key: "n", Value: 6}}}},
		options.UpdateOne().SetUpsert(true))
	must(t, err)
	if ur.UpsertedCount != 1 || ur.UpsertedID != int32(6) {
		t.Fatalf("upsert: %+v", ur)
	}
	rr, err := coll.ReplaceOne(ctx, bson.D{{Key: "_id", Value: 5}}, bson.D{{Key: "kind", Value: "r"}, {Key: "n", Value: 50}})
	must(t, err)
	if rr.MatchedCount != 1 || rr.ModifiedCount != 1 {
		t.Fatalf("ReplaceOne: %+v", rr)
	}

	docs = findAll(t, ctx, coll, bson.D{}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if got := ns(t, docs, "n"); !slices.Equal(got, []int64{10, 2, 103, 104, 50, 6}) {
		t.Fatalf("after updates: n = %v, want [10 2 103 104 50 6]", got)
	}

	n, err := coll.CountDocuments(ctx, bson.D{{Key: "n", Value: bson.D{{Key: "$gt", Value: 5}}}})
	must(t, err)
	if n != 5 {
		t.Fatalf("CountDocuments n>5 = %d, want 5", n)
	}
	var kinds []string
	must(t, coll.Distinct(ctxNoDeadline(t, 30*time.Second), "kind", bson.D{}).Decode(&kinds))
	slices.Sort(kinds)
	if !slices.Equal(kinds, []string{"a", "b", "r", "u"}) {
		t.Fatalf("distinct kind = %v, want [a b r u]", kinds)
	}

	dr, err := coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: 1}})
	must(t, err)
	if dr.DeletedCount != 1 {
		t.Fatalf("DeleteOne deleted %d", dr.DeletedCount)
	}
	dr, err = coll.DeleteMany(ctx, bson.D{{Key: "n", Value: bson.D{{Key: "$gt", Value: 100}}}})
	must(t, err)
	if dr.DeletedCount != 2 {
		t.Fatalf("DeleteMany deleted %d, want 2", dr.DeletedCount)
	}
	n, err = coll.CountDocuments(ctx, bson.D{})
	must(t, err)
	if n != 3 {
		t.Fatalf("%d documents left, want 3", n)
	}
	// A server error must come back through the proxy as the server's own
	// error, not as a proxy failure.
	_, err = coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 2}})
	if !mongo.IsDuplicateKeyError(err) {
		t.Fatalf("duplicate _id insert: %v, want a duplicate key error", err)
	}
}

func testGetMore(t *testing.T, addr string) {
	var log cmdLog
	c := driverWith(t, addr, "", func(o *options.ClientOptions) { o.SetMonitor(log.monitor()) })
	ctx := ctxT(t, 30*time.Second)
	coll := c.Database("e2e_getmore").Collection("items")
	const total = 53
	docs := make([]any, total)
	for i := range docs {
		docs[i] = bson.D{{Key: "_id", Value: i}, {Key: "pad", Value: strings.Repeat("x", 100)}}
	}
	_, err := coll.InsertMany(ctx, docs)
	must(t, err)

	got := findAll(t, ctx, coll, bson.D{}, options.Find().SetBatchSize(5).SetSort(bson.D{{Key: "_id", Value: 1}}))
	ids := ns(t, got, "_id")
	if len(ids) != total {
		t.Fatalf("got %d docs, want %d", len(ids), total)
	}
	for i, id := range ids {
		if id != int64(i) {
			t.Fatalf("doc %d has _id %d", i, id)
		}
	}
	// 53 documents in batches of 5: the first batch and at least 10 more.
	if n := len(log.named("getMore")); n < 10 {
		t.Fatalf("%d getMore commands, want >= 10", n)
	}

	// A cursor abandoned half way is killed through the proxy.
	cur, err := coll.Find(ctx, bson.D{}, options.Find().SetBatchSize(5))
	must(t, err)
	for range 7 {
		if !cur.Next(ctx) {
			t.Fatalf("cursor ended early: %v", cur.Err())
		}
	}
	must(t, cur.Close(ctx))
	if n := len(log.named("killCursors")); n != 1 {
		t.Fatalf("%d killCursors commands, want 1", n)
	}
	if f := log.failures(); len(f) != 0 {
		t.Fatalf("failed commands: %v", f)
	}
}

func testAggregate(t *testing.T, addr string) {
	c := driver(t, addr, "")
	ctx := ctxT(t, 30*time.Second)
	coll := c.Database("e2e_agg").Collection("sales")
	var docs []any
	for i := range 30 {
		docs = append(docs, bson.D{{Key: "region", Value: []string{"north", "south", "east"}[i%3]}, {Key: "amount", Value: i}, {Key: "open", Value: i%2 == 0}})
	}
	_, err := coll.InsertMany(ctx, docs)
	must(t, err)
	// FerretDB 1.24 computes only the first accumulator of a $group (the
	// others come back as 0, directly as through the bouncer), so each
	// pipeline has one.
	group := func(acc bson.D) map[string]int64 {
		t.Helper()
		pipeline := mongo.Pipeline{
			{{Key: "$match", Value: bson.D{{Key: "open", Value: true}, {Key: "amount", Value: bson.D{{Key: "$lt", Value: 20}}}}}},
			{{Key: "$group", Value: bson.D{{Key: "_id", Value: "$region"}, {Key: "v", Value: acc}}}},
			{{Key: "$sort", Value: bson.D{{Key: "_id", Value: 1}}}},
		}
		// batchSize 1 makes the aggregate cursor need getMore too.
		cur, err := coll.Aggregate(ctx, pipeline, options.Aggregate().SetBatchSize(1))
		must(t, err)
		var out []bson.M
		must(t, cur.All(ctx, &out))
		m := map[string]int64{}
		for _, d := range out {
			region, _ := d["_id"].(string)
			m[region] = ns(t, []bson.M{d}, "v")[0]
		}
		return m
	}
	// Even amounts under 20: north (i%3==0) 0,6,12,18; south 4,10,16;
	// east 2,8,14.
	if got, want := group(bson.D{{Key: "$sum", Value: "$amount"}}), map[string]int64{"north": 36, "south": 30, "east": 24}; !maps.Equal(got, want) {
		t.Fatalf("$sum of amount by region = %v, want %v", got, want)
	}
	if got, want := group(bson.D{{Key: "$sum", Value: 1}}), map[string]int64{"north": 4, "south": 3, "east": 3}; !maps.Equal(got, want) {
		t.Fatalf("count by region = %v, want %v", got, want)
	}
}

func testBulkWrite(t *testing.T, addr string) {
	c := driver(t, addr, "")
	ctx := ctxT(t, 30*time.Second)
	db := c.Database("e2e_bulk")

	mixed := func(coll *mongo.Collection) []mongo.WriteModel {
		return []mongo.WriteModel{
			mongo.NewInsertOneModel().SetDocument(bson.D{{Key: "_id", Value: 1}, {Key: "n", Value: 1}}),
			mongo.NewInsertOneModel().SetDocument(bson.D{{Key: "_id", Value: 2}, {Key: "n", Value: 2}}),
			mongo.NewInsertOneModel().SetDocument(bson.D{{Key: "_id", Value: 3}, {Key: "n", Value: 3}}),
			mongo.NewUpdateOneModel().SetFilter(bson.D{{Key: "_id", Value: 1}}).SetUpdate(bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: 11}}}}),
			mongo.NewUpdateManyModel().SetFilter(bson.D{{Key: "_id", Value: bson.D{{Key: "$gte", Value: 2}}}}).SetUpdate(bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 100}}}}),
			mongo.NewReplaceOneModel().SetFilter(bson.D{{Key: "_id", Value: 4}}).SetReplacement(bson.D{{Key: "n", Value: 4}}).SetUpsert(true),
			mongo.NewDeleteOneModel().SetFilter(bson.D{{Key: "_id", Value: 3}}),
			mongo.NewInsertOneModel().SetDocument(bson.D{{Key: "_id", Value: 5}, {Key: "n", Value: 5}}),
			mongo.NewDeleteManyModel().SetFilter(bson.D{{Key: "n", Value: bson.D{{Key: "$lt", Value: 5}}}}),
		}
	}
	for _, ordered := range []bool{true, false} {
		coll := db.Collection(fmt.Sprintf("mixed_ordered_%v", ordered))
		res, err := coll.BulkWrite(ctx, mixed(coll), options.BulkWrite().SetOrdered(ordered))
		must(t, err)
		want := mongo.BulkWriteResult{InsertedCount: 4, MatchedCount: 3, ModifiedCount: 3, DeletedCount: 2, UpsertedCount: 1, Acknowledged: true}
		// Unordered, the server may run the deletes before the updates and
		// inserts they depend on: check only the counts order cannot change.
		if ordered {
			if res.UpsertedIDs[5] != int32(4) {
				t.Fatalf("ordered bulk upserted %v, want index 5 -> 4", res.UpsertedIDs)
			}
			res.UpsertedIDs, want.UpsertedIDs = nil, nil
			if fmt.Sprint(*res) != fmt.Sprint(want) {
				t.Fatalf("ordered bulk: %+v, want %+v", *res, want)
			}
			docs := findAll(t, ctx, coll, bson.D{}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
			if got := ns(t, docs, "_id"); !slices.Equal(got, []int64{1, 2, 5}) {
				t.Fatalf("ordered bulk left _ids %v, want [1 2 5]", got)
			}
		} else if res.InsertedCount != 4 || res.UpsertedCount != 1 {
			t.Fatalf("unordered bulk: %+v", *res)
		}
	}

	// A duplicate key in the middle: ordered stops there, unordered goes on.
	dup := []mongo.WriteModel{
		mongo.NewInsertOneModel().SetDocument(bson.D{{Key: "_id", Value: 1}}),
		mongo.NewInsertOneModel().SetDocument(bson.D{{Key: "_id", Value: 1}}),
		mongo.NewInsertOneModel().SetDocument(bson.D{{Key: "_id", Value: 2}}),
		mongo.NewUpdateOneModel().SetFilter(bson.D{{Key: "_id", Value: 2}}).SetUpdate(bson.D{{Key: "$set", Value: bson.D{{Key: "seen", Value: true}}}}),
	}
	for _, tc := range []struct {
		ordered bool
		ids     []int64
	}{{true, []int64{1}}, {false, []int64{1, 2}}} {
		coll := db.Collection(fmt.Sprintf("dup_ordered_%v", tc.ordered))
		_, err := coll.BulkWrite(ctx, dup, options.BulkWrite().SetOrdered(tc.ordered))
		var bwe mongo.BulkWriteException
		if !errors.As(err, &bwe) {
			t.Fatalf("ordered=%v: %v, want a BulkWriteException", tc.ordered, err)
		}
		if len(bwe.WriteErrors) != 1 || bwe.WriteErrors[0].Index != 1 || !mongo.IsDuplicateKeyError(err) {
			t.Fatalf("ordered=%v: write errors %+v, want one duplicate key at index 1", tc.ordered, bwe.WriteErrors)
		}
		docs := findAll(t, ctx, coll, bson.D{}, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
		if got := ns(t, docs, "_id"); !slices.Equal(got, tc.ids) {
			t.Fatalf("ordered=%v left _ids %v, want %v", tc.ordered, got, tc.ids)
		}
	}
}

// breakProxy forwards TCP connections to an upstream and, once armed, drops
// the connection that carries the first message containing a marker, before
// forwarding it: the upstream never sees that attempt.
type breakProxy struct {
	ln       net.Listener
	upstream string
	marker   []byte
	armed    atomic.Bool
	broken   atomic.Int32
	wg       sync.WaitGroup

	mu sync.Mutex
	// conns is guarded by mu: every open connection, so close can end
	// them all.
	conns map[net.Conn]struct{}
}

func startBreakProxy(t testing.TB, upstream string, marker []byte) *breakProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	p := &breakProxy{ln: ln, upstream: upstream, marker: marker, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.acceptLoop()
	t.Cleanup(p.close)
	return p
}

func (p *breakProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *breakProxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		if !p.track(c) || !p.track(u) {
			c.Close()
			u.Close()
			return
		}
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			_, _ = io.Copy(c, u)
			c.Close()
			u.Close()
		}()
		go func() {
			defer p.wg.Done()
			p.forward(c, u)
			c.Close()
			u.Close()
		}()
	}
}

// forward copies whole messages from c to u, dropping both connections on
// the first armed match.
func (p *breakProxy) forward(c, u net.Conn) {
	r := bufio.NewReader(c)
	for {
		var hdr [4]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return
		}
		n := int(binary.LittleEndian.Uint32(hdr[:]))
		if n < wire.HeaderLen || n > wire.DefaultMaxMessageSize {
			return
		}
		msg := make([]byte, n)
		copy(msg, hdr[:])
		if _, err := io.ReadFull(r, msg[4:]); err != nil {
			return
		}
		if bytes.Contains(msg, p.marker) && p.armed.CompareAndSwap(true, false) {
			p.broken.Add(1)
			return
		}
		if _, err := u.Write(msg); err != nil {
			return
		}
	}
}

func (p *breakProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

// testRetryableWrites drops the upstream connection under an insert: the
// bouncer must answer with a retryable error, and the driver's retry (same
// lsid and txnNumber) must succeed, leaving exactly one document.
func testRetryableWrites(t *testing.T, up *devmongo.Server) {
	marker := fmt.Sprintf("break-%d", time.Now().UnixNano())
	bp := startBreakProxy(t, up.Addr(), []byte(marker))
	_, addr := bouncer(t, "mongodb://"+bp.ln.Addr().String()+"/?directConnection=true", nil)
	var log cmdLog
	c := driverWith(t, addr, "", func(o *options.ClientOptions) { o.SetMonitor(log.monitor()) })
	ctx := ctxT(t, 30*time.Second)
	coll := c.Database("e2e_retry").Collection("items")
	must(t, c.Ping(ctx, nil))

	bp.armed.Store(true)
	_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}, {Key: "marker", Value: marker}})
	must(t, err)
	if bp.broken.Load() != 1 {
		t.Fatalf("the proxy broke %d connections, want 1", bp.broken.Load())
	}
	inserts := log.named("insert")
	if len(inserts) != 2 {
		t.Fatalf("%d insert attempts, want 2 (the first one and its retry); failures: %v", len(inserts), log.failures())
	}
	for _, field := range []string{"lsid", "txnNumber"} {
		a, errA := inserts[0].LookupErr(field)
		b, errB := inserts[1].LookupErr(field)
		if errA != nil || errB != nil || !a.Equal(b) {
			t.Fatalf("retry %s: first %v (%v), retry %v (%v); want equal and present", field, a, errA, b, errB)
		}
	}
	f := log.failures()
	if len(f) != 1 || !strings.HasPrefix(f[0], "insert: ") {
		t.Fatalf("failures %v, want exactly the first insert", f)
	}

	n, err := coll.CountDocuments(ctx, bson.D{{Key: "marker", Value: marker}})
	must(t, err)
	if n != 1 {
		t.Fatalf("%d documents after the retried insert, want 1", n)
	}

	// With retryWrites=false the same failure reaches the application as a
	// retryable network-class error.
	c2 := driver(t, addr, "&retryWrites=false")
	bp.armed.Store(true)
	_, err = c2.Database("e2e_retry").Collection("items").InsertOne(ctx, bson.D{{Key: "_id", Value: 2}, {Key: "marker", Value: marker}})
	var se mongo.ServerError
	if !errors.As(err, &se) || !se.HasErrorLabel("RetryableWriteError") {
		t.Fatalf("insert without retry: %v, want a server error labelled RetryableWriteError", err)
	}
}

func testSessions(t *testing.T, addr string) {
	var log cmdLog
	c := driverWith(t, addr, "", func(o *options.ClientOptions) { o.SetMonitor(log.monitor()) })
	ctx := ctxT(t, 30*time.Second)
	coll := c.Database("e2e_sessions").Collection("items")

	sess, err := c.StartSession(options.Session().SetCausalConsistency(true))
	must(t, err)
	defer sess.EndSession(ctx)
	sctx := mongo.NewSessionContext(ctx, sess)
	_, err = coll.InsertOne(sctx, bson.D{{Key: "_id", Value: "s1"}, {Key: "v", Value: 1}})
	must(t, err)
	_, err = coll.UpdateOne(sctx, bson.D{{Key: "_id", Value: "s1"}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "v", Value: 1}}}})
	must(t, err)
	var doc bson.M
	must(t, coll.FindOne(sctx, bson.D{{Key: "_id", Value: "s1"}}).Decode(&doc))
	if v := ns(t, []bson.M{doc}, "v"); v[0] != 2 {
		t.Fatalf("read in session saw v=%d, want 2 (read your writes)", v[0])
	}
	n, err := coll.CountDocuments(sctx, bson.D{})
	must(t, err)
	if n != 1 {
		t.Fatalf("count in session = %d", n)
	}

	// Every command of the session carried the session's lsid, and the
	// writes carried increasing txnNumbers (retryable writes are on).
	want := sess.ID().Lookup("id")
	var txns []int64
	for _, name := range []string{"insert", "update", "find", "aggregate"} {
		cmds := log.named(name)
		if len(cmds) != 1 {
			t.Fatalf("%d %s commands, want 1", len(cmds), name)
		}
		id, err := cmds[0].LookupErr("lsid", "id")
		if err != nil || !id.Equal(want) {
			t.Fatalf("%s lsid.id = %v (%v), want the session's %v", name, id, err, want)
		}
		if tn, err := cmds[0].LookupErr("txnNumber"); err == nil {
			txns = append(txns, tn.Int64())
		}
	}
	if !slices.Equal(txns, []int64{1, 2}) {
		t.Fatalf("txnNumbers of the session's writes = %v, want [1 2]", txns)
	}
	// Causal consistency: FerretDB returns no operationTime, so the driver
	// has nothing to wait for after its writes. Give the session one, as a
	// replica set would have, and check that the next read carries it as
	// afterClusterTime through the bouncer and still sees the writes.
	if sess.OperationTime() != nil {
		t.Fatalf("FerretDB now returns operationTime %v: assert the driver's own afterClusterTime instead", sess.OperationTime())
	}
	opTime := bson.Timestamp{T: uint32(time.Now().Unix()), I: 1}
	must(t, sess.AdvanceOperationTime(&opTime))
	doc = nil
	must(t, coll.FindOne(sctx, bson.D{{Key: "_id", Value: "s1"}}).Decode(&doc))
	if v := ns(t, []bson.M{doc}, "v"); v[0] != 2 {
		t.Fatalf("causally consistent read saw v=%d, want 2", v[0])
	}
	finds := log.named("find")
	act, err := finds[len(finds)-1].LookupErr("readConcern", "afterClusterTime")
	if err != nil {
		t.Fatalf("causally consistent find has no afterClusterTime: %v", err)
	}
	if ts, i := act.Timestamp(); ts != opTime.T || i != opTime.I {
		t.Fatalf("afterClusterTime = %v, want %v", act, opTime)
	}

	// Outside an explicit session the driver still sends an implicit lsid.
	_, err = coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "s2"}})
	must(t, err)
	if _, err := log.named("insert")[1].LookupErr("lsid", "id"); err != nil {
		t.Fatalf("implicit session insert has no lsid: %v", err)
	}
	if f := log.failures(); len(f) != 0 {
		t.Fatalf("failed commands: %v", f)
	}
}

// wireTap counts the messages that pass over a connection in each
// direction, by opcode and, for OP_COMPRESSED, by compressor id.
type wireTap struct {
	mu sync.Mutex
	// out and in are guarded by mu: the driver reads and writes from
	// different goroutines.
	out, in map[string]int
}

func (w *wireTap) count(dir map[string]int, key string) {
	w.mu.Lock()
	dir[key]++
	w.mu.Unlock()
}

func (w *wireTap) get(out bool, key string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if out {
		return w.out[key]
	}
	return w.in[key]
}

// DialContext implements options.ContextDialer.
func (w *wireTap) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	return &tapConn{Conn: c, w: w}, nil
}

// msgScanner follows message boundaries in a byte stream however it is
// chunked, and reports each message's opcode key once its first 25 bytes
// (header plus OP_COMPRESSED's original opcode, size and compressor id) are
// known.
type msgScanner struct {
	head []byte
	left int // bytes of the current message not yet seen
}

func (s *msgScanner) feed(p []byte, emit func(string)) {
	for len(p) > 0 {
		if s.left > 0 {
			k := min(s.left, len(p))
			s.left -= k
			p = p[k:]
			continue
		}
		k := min(25-len(s.head), len(p))
		s.head = append(s.head, p[:k]...)
		p = p[k:]
		if len(s.head) < 25 {
			continue
		}
		size := int(binary.LittleEndian.Uint32(s.head[:4]))
		op := wire.OpCode(binary.LittleEndian.Uint32(s.head[12:16]))
		key := strconv.Itoa(int(op))
		if op == wire.OpCompressed {
			key = fmt.Sprintf("compressed/%d", s.head[24])
		}
		emit(key)
		s.left = max(size-25, 0)
		s.head = s.head[:0]
	}
}

type tapConn struct {
	net.Conn
	w       *wireTap
	rd, wr  msgScanner
	rdMu    sync.Mutex
	writeMu sync.Mutex
}

func (c *tapConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.rdMu.Lock()
	c.rd.feed(p[:n], func(k string) { c.w.count(c.w.in, k) })
	c.rdMu.Unlock()
	return n, err
}

func (c *tapConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.writeMu.Lock()
	c.wr.feed(p[:n], func(k string) { c.w.count(c.w.out, k) })
	c.writeMu.Unlock()
	return n, err
}

var compressorIDs = map[string]int{"snappy": 1, "zlib": 2, "zstd": 3}

func testCompression(t *testing.T, addr, name string) {
	// The handshake: mongobouncer picks the client's first compressor it
	// supports.
	rc := dialRaw(t, addr)
	rep := rc.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "compression", Value: bson.A{"lz4", name}}, {Key: "$db", Value: "admin"}})
	arr, err := rep.LookupErr("compression")
	if err != nil {
		t.Fatalf("hello offering %s: no compression in reply %v", name, rep)
	}
	vals, _ := arr.Array().Values()
	if len(vals) != 1 || vals[0].StringValue() != name {
		t.Fatalf("hello offering [lz4 %s] agreed %v, want [%s]", name, arr, name)
	}

	tap := &wireTap{out: map[string]int{}, in: map[string]int{}}
	c := driverWith(t, addr, "&compressors="+name, func(o *options.ClientOptions) { o.SetDialer(tap) })
	ctx := ctxT(t, 30*time.Second)
	coll := c.Database("e2e_compress_" + name).Collection("items")
	var docs []any
	for i := range 40 {
		// Compressible payloads, so a broken compressor cannot hide behind
		// incompressible data.
		docs = append(docs, bson.D{{Key: "_id", Value: i}, {Key: "text", Value: strings.Repeat("mongobouncer ", 50)}})
	}
	_, err = coll.InsertMany(ctx, docs)
	must(t, err)
	got := findAll(t, ctx, coll, bson.D{}, options.Find().SetBatchSize(15))
	if len(got) != 40 {
		t.Fatalf("got %d docs, want 40", len(got))
	}
	for _, d := range got {
		if d["text"] != strings.Repeat("mongobouncer ", 50) {
			t.Fatalf("document corrupted: %v", d)
		}
	}
	_, err = coll.UpdateMany(ctx, bson.D{}, bson.D{{Key: "$set", Value: bson.D{{Key: "seen", Value: true}}}})
	must(t, err)
	n, err := coll.CountDocuments(ctx, bson.D{{Key: "seen", Value: true}})
	must(t, err)
	if n != 40 {
		t.Fatalf("count after update = %d, want 40", n)
	}
	dr, err := coll.DeleteMany(ctx, bson.D{})
	must(t, err)
	if dr.DeletedCount != 40 {
		t.Fatalf("deleted %d", dr.DeletedCount)
	}

	key := fmt.Sprintf("compressed/%d", compressorIDs[name])
	// insert, find + 2 getMore, update, aggregate, delete at least.
	if o, i := tap.get(true, key), tap.get(false, key); o < 7 || i < 7 {
		t.Fatalf("%s messages: %d sent, %d received; want >= 7 each way (out %v, in %v)", name, o, i, tap.out, tap.in)
	}
	for k := range compressorIDs {
		if k != name && (tap.get(true, fmt.Sprintf("compressed/%d", compressorIDs[k])) != 0 || tap.get(false, fmt.Sprintf("compressed/%d", compressorIDs[k])) != 0) {
			t.Fatalf("%s seen on a %s connection: out %v, in %v", k, name, tap.out, tap.in)
		}
	}
}

// socketInodes returns the inodes of this process's sockets.
func socketInodes() (map[string]bool, error) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil, err
	}
	out := make(map[string]bool, len(ents))
	for _, e := range ents {
		l, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil {
			continue // closed since ReadDir
		}
		if ino, ok := strings.CutPrefix(l, "socket:["); ok {
			out[strings.TrimSuffix(ino, "]")] = true
		}
	}
	return out, nil
}

// tcpSocket is one line of /proc/net/tcp{,6}: addresses as hex IP:PORT,
// the state as a hex TCP state ("01" is ESTABLISHED), the queues as hex
// TX:RX byte counts.
type tcpSocket struct{ local, remote, state, queues, inode string }

// remotePort returns the socket's remote port in /proc's hex spelling.
func (s tcpSocket) remotePort() string {
	_, port, _ := strings.Cut(s.remote, ":")
	return port
}

// ownSockets returns this process's TCP sockets, from /proc/net/tcp{,6}.
func ownSockets() ([]tcpSocket, error) {
	inodes, err := socketInodes()
	if err != nil {
		return nil, err
	}
	var out []tcpSocket
	// /proc/net/tcp is not a snapshot: it is read in chunks, and sockets
	// opened or closed between two chunks can make the kernel list another
	// socket twice. A socket's inode is unique, so count each once (this
	// is what made ManyClients see up to 33 "upstream connections" when
	// 11 existed).
	seen := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			if f == "/proc/net/tcp6" {
				continue
			}
			return nil, err
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			// sl local rem st tx:rx tr:when retrnsmt uid timeout inode
			if len(fs) >= 10 && inodes[fs[9]] && !seen[fs[9]] {
				seen[fs[9]] = true
				out = append(out, tcpSocket{local: fs[1], remote: fs[2], state: fs[3], queues: fs[4], inode: fs[9]})
			}
		}
	}
	return out, nil
}

// establishedTo counts this process's established TCP connections whose
// remote port is each of ports.
func establishedTo(ports ...int) (map[int]int, error) {
	socks, err := ownSockets()
	if err != nil {
		return nil, err
	}
	want := map[string]int{}
	for _, p := range ports {
		want[fmt.Sprintf("%04X", p)] = p
	}
	out := map[int]int{}
	for _, s := range socks {
		if p, hit := want[s.remotePort()]; hit && s.state == "01" {
			out[p]++
		}
	}
	return out, nil
}

// describeUpstreamUse lists this process's sockets whose remote port is
// port, in every TCP state, and the stacks of the goroutines that are in
// the upstream, pool or topology packages or dialling.
func describeUpstreamUse(port int) string {
	var b strings.Builder
	socks, err := ownSockets()
	if err != nil {
		return err.Error()
	}
	for _, s := range socks {
		if s.remotePort() == fmt.Sprintf("%04X", port) {
			fmt.Fprintf(&b, "socket local %s remote %s state %s inode %s\n", s.local, s.remote, s.state, s.inode)
		}
	}
	var all bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&all, 1)
	for _, g := range strings.Split(all.String(), "\n\n") {
		if strings.Contains(g, "internal/upstream.") || strings.Contains(g, "internal/pool.") ||
			strings.Contains(g, "internal/topology.") || strings.Contains(g, "net.(*Dialer)") {
			b.WriteString(g)
			b.WriteString("\n\n")
		}
	}
	return b.String()
}

func portOf(t testing.TB, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	must(t, err)
	n, err := strconv.Atoi(p)
	must(t, err)
	return n
}

// testManyClients runs 200 driver clients, one connection each, through a
// bouncer whose pool holds at most 10 upstream connections.
func testManyClients(t *testing.T, up *devmongo.Server) {
	const clients, poolSize, rounds = 200, 10, 3
	useProc := runtime.GOOS == "linux"
	upPort := portOf(t, up.Addr())
	if useProc {
		// The upstream count below is this bouncer's pool plus its monitor
		// only if nothing else in this process is still connected.
		deadline := time.Now().Add(5 * time.Second)
		for {
			n, err := establishedTo(upPort)
			must(t, err)
			if n[upPort] == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d connections to the upstream remain from earlier subtests", n[upPort])
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	a, addr := bouncer(t, up.URI(), func(c *config.Config) {
		c.Global.MaxPoolSize = poolSize
		c.Global.WaitQueueTimeout = 30 * time.Second
	})
	ctx := ctxT(t, 90*time.Second)
	bPort := portOf(t, addr)

	// Sample the pool and, on Linux, the sockets, for the whole run.
	var maxTotal, maxUp, maxClientConns, maxClients, samples atomic.Int64
	// atMaxUp is the pool's state at the sample with the most upstream
	// sockets, for the failure message. Written by the sampler only, read
	// after it has stopped.
	var atMaxUp pool.Stats
	// overLimit describes the first sample over the limit: the sockets and
	// the goroutines that deal with upstream connections, so that a
	// failure says who opened the extra ones. Written by the sampler only.
	var overLimit string
	stop := make(chan struct{})
	sampled := make(chan error, 1)
	pl := a.Topologies()[0].Servers()[0].Pool()
	gen0 := pl.Stats().Generation
	setMax := func(m *atomic.Int64, v int64) {
		for cur := m.Load(); v > cur && !m.CompareAndSwap(cur, v); cur = m.Load() {
		}
	}
	go func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			setMax(&maxTotal, int64(pl.Stats().Total))
			setMax(&maxClients, int64(a.Server().ClientCount()))
			if useProc {
				n, err := establishedTo(upPort, bPort)
				if err != nil {
					sampled <- err
					return
				}
				if int64(n[upPort]) > maxUp.Load() {
					atMaxUp = pl.Stats()
					if n[upPort] > poolSize+1 && overLimit == "" {
						overLimit = describeUpstreamUse(upPort)
					}
				}
				setMax(&maxUp, int64(n[upPort]))
				setMax(&maxClientConns, int64(n[bPort]))
			}
			samples.Add(1)
			select {
			case <-stop:
				sampled <- nil
				return
			case <-tick.C:
			}
		}
	}()

	// Connect every client and make each open its one pooled connection
	// before the load starts, so all of them are connected at once.
	cs := make([]*mongo.Client, clients)
	var wg sync.WaitGroup
	errs := make(chan error, clients*(rounds+2))
	for i := range cs {
		cs[i] = driver(t, addr, "&maxPoolSize=1&maxConnecting=1")
	}
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Ping(ctx, nil); err != nil {
				errs <- fmt.Errorf("client %d ping: %w", i, err)
			}
		}()
	}
	wg.Wait()
	start := make(chan struct{})
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			coll := c.Database("e2e_many").Collection("items")
			for r := range rounds {
				id := fmt.Sprintf("%d-%d", i, r)
				if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "client", Value: i}}); err != nil {
					errs <- fmt.Errorf("client %d insert: %w", i, err)
					return
				}
				var d bson.M
				if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&d); err != nil {
					errs <- fmt.Errorf("client %d find: %w", i, err)
					return
				}
				if _, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$set", Value: bson.D{{Key: "r", Value: r}}}}); err != nil {
					errs <- fmt.Errorf("client %d update: %w", i, err)
					return
				}
			}
			n, err := coll.CountDocuments(ctx, bson.D{{Key: "client", Value: i}})
			if err == nil && n != rounds {
				err = fmt.Errorf("%d documents, want %d", n, rounds)
			}
			if err != nil {
				errs <- fmt.Errorf("client %d count: %w", i, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	close(stop)
	if err := <-sampled; err != nil {
		t.Fatalf("sampling /proc: %v", err)
	}
	close(errs)
	var failed []error
	for err := range errs {
		failed = append(failed, err)
	}
	if len(failed) > 0 {
		t.Fatalf("%d operations failed; first: %v", len(failed), failed[0])
	}

	n, err := cs[0].Database("e2e_many").Collection("items").CountDocuments(ctx, bson.D{})
	must(t, err)
	if n != clients*rounds {
		t.Fatalf("%d documents, want %d", n, clients*rounds)
	}
	t.Logf("samples %d: pool max total %d; max clients %d; sockets: max %d to bouncer, max %d to upstream",
		samples.Load(), maxTotal.Load(), maxClients.Load(), maxClientConns.Load(), maxUp.Load())
	if maxTotal.Load() > poolSize {
		t.Fatalf("pool reached %d connections, max_pool_size is %d", maxTotal.Load(), poolSize)
	}
	if maxTotal.Load() < 1 {
		t.Fatalf("the pool never held a connection: the sampler saw nothing")
	}
	// Each driver client has its pooled connection and a monitoring one.
	if maxClients.Load() < clients {
		t.Fatalf("at most %d clients connected at once, want >= %d", maxClients.Load(), clients)
	}
	if useProc {
		if maxClientConns.Load() < clients {
			t.Fatalf("at most %d sockets to the bouncer at once, want >= %d", maxClientConns.Load(), clients)
		}
		// The pool's connections plus the monitor's one connection, which
		// lives outside the pool.
		if maxUp.Load() > poolSize+1 {
			t.Fatalf("%d upstream connections at once, want <= %d (pool %d + monitor 1); pool then: %+v (generation %d at the start, %d at the end)\n%s",
				maxUp.Load(), poolSize+1, poolSize, atMaxUp.Counts, gen0, pl.Stats().Generation, overLimit)
		}
		if maxUp.Load() < 2 {
			t.Fatalf("at most %d upstream connection seen: the sampler missed the pool", maxUp.Load())
		}
	}
}

// debianPython is the interpreter Debian's python3-pymongo installs for; a
// python3 earlier in PATH (pyenv, venv) would not see it.
const debianPython = "/usr/bin/python3"

// testPymongo runs a pymongo script through the bouncer. pymongo 3.11
// (Debian 12's) shakes hands with legacy OP_QUERY isMaster, then speaks
// OP_MSG: a second real driver, and the legacy handshake path.
func testPymongo(t *testing.T, addr string) {
	if err := exec.Command(debianPython, "-c", "import pymongo").Run(); err != nil {
		msg := fmt.Sprintf("pymongo is not installed for %s (%v): run `make python-tools` as root", debianPython, err)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, debianPython, filepath.Join("testdata", "pymongo_smoke.py"), "mongodb://"+addr+"/")
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("pymongo script: %v (ctx %v); output:\n%s", err, ctx.Err(), out)
	}
	want := []string{
		"inserted: 20",
		"find: [0,2,4,6,8,10,12,14,16,18]",
		`aggregate: [{"_id":"a","total":20},{"_id":"b","total":25}]`,
		"update: [10,10]",
		"count: 10",
		"bulk: [2,1,1,[[1,11000]]]",
		"ping: 1.0",
		"unknown command: 59",
	}
	got := strings.TrimSpace(strings.ReplaceAll(string(out), "\r\n", "\n"))
	if got != strings.Join(want, "\n") {
		t.Fatalf("pymongo output:\n%s\nwant:\n%s", out, strings.Join(want, "\n"))
	}
}
