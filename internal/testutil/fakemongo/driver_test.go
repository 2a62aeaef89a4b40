package fakemongo

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// connectDriver connects the official Go driver to s with directConnection
// and disconnects it when the test ends.
func connectDriver(t *testing.T, s *Server, tweak func(*options.ClientOptions)) *mongo.Client {
	t.Helper()
	o := options.Client().ApplyURI(s.URI()).
		SetServerSelectionTimeout(10 * time.Second).
		SetConnectTimeout(10 * time.Second)
	if tweak != nil {
		tweak(o)
	}
	c, err := mongo.Connect(o)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Disconnect(ctx); err != nil {
			t.Errorf("disconnect: %v", err)
		}
	})
	return c
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestDriverPing(t *testing.T) {
	for _, kind := range []Kind{Standalone, ReplicaSetMember, Mongos} {
		s := Start(t, Options{Kind: kind})
		c := connectDriver(t, s, func(o *options.ClientOptions) { o.SetAppName("drv") })
		if err := c.Ping(testCtx(t), nil); err != nil {
			t.Fatalf("kind %d: ping: %v", kind, err)
		}
		if s.Requests("ping") != 1 {
			t.Fatalf("kind %d: counts %v", kind, s.RequestCounts())
		}
		found := false
		for _, ci := range s.Conns() {
			found = found || ci.AppName == "drv"
		}
		if !found {
			t.Fatalf("kind %d: no connection with the app name: %+v", kind, s.Conns())
		}
	}
}

func TestDriverInsertFindGetMore(t *testing.T) {
	s := Start(t, Options{InMemory: true})
	c := connectDriver(t, s, nil)
	ctx := testCtx(t)
	coll := c.Database("db").Collection("things")
	docs := make([]any, 7)
	for i := range docs {
		docs[i] = bson.D{{Key: "_id", Value: i}, {Key: "even", Value: i%2 == 0}}
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatalf("insert: %v", err)
	}
	cur, err := coll.Find(ctx, bson.D{}, options.Find().SetBatchSize(2))
	if err != nil {
		t.Fatalf("find: %v", err)
	}
	var got []bson.M
	if err := cur.All(ctx, &got); err != nil {
		t.Fatalf("cursor: %v", err)
	}
	if len(got) != 7 {
		t.Fatalf("got %d docs, want 7", len(got))
	}
	if n := s.Requests("getMore"); n != 3 {
		t.Errorf("getMore requests %d, want 3 (batches 2+2+2+1)", n)
	}
	var one bson.M
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: 4}}).Decode(&one); err != nil || one["_id"] != int32(4) {
		t.Fatalf("findOne: %v %v", one, err)
	}
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: 99}}).Err(); !errors.Is(err, mongo.ErrNoDocuments) {
		t.Fatalf("findOne missing: %v", err)
	}
	// Closing a cursor early kills it on the server.
	cur, err = coll.Find(ctx, bson.D{{Key: "even", Value: true}}, options.Find().SetBatchSize(1))
	if err != nil {
		t.Fatal(err)
	}
	if !cur.Next(ctx) {
		t.Fatal(cur.Err())
	}
	if len(s.OpenCursors()) != 1 {
		t.Fatalf("open cursors %v", s.OpenCursors())
	}
	if err := cur.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if len(s.OpenCursors()) != 0 || s.Requests("killCursors") != 1 {
		t.Fatalf("open cursors %v, killCursors %d", s.OpenCursors(), s.Requests("killCursors"))
	}
}

func TestDriverFailPointAppName(t *testing.T) {
	s := Start(t, Options{})
	victim := connectDriver(t, s, func(o *options.ClientOptions) { o.SetAppName("victim").SetRetryReads(false) })
	other := connectDriver(t, s, func(o *options.ClientOptions) { o.SetAppName("other") })
	ctx := testCtx(t)
	// Make sure both pools hold a connection before failing anything.
	if err := victim.Ping(ctx, nil); err != nil {
		t.Fatal(err)
	}
	err := other.Database("admin").RunCommand(ctx, bson.D{
		{Key: "configureFailPoint", Value: "failCommand"},
		{Key: "mode", Value: bson.D{{Key: "times", Value: 1}}},
		{Key: "data", Value: bson.D{
			{Key: "failCommands", Value: bson.A{"ping"}},
			{Key: "errorCode", Value: 2},
			{Key: "appName", Value: "victim"},
		}},
	}).Err()
	if err != nil {
		t.Fatalf("configureFailPoint: %v", err)
	}
	if err := other.Ping(ctx, nil); err != nil {
		t.Fatalf("other app failed: %v", err)
	}
	err = victim.Ping(ctx, nil)
	var ce mongo.CommandError
	if !errors.As(err, &ce) || ce.Code != 2 {
		t.Fatalf("victim ping: %v, want code 2", err)
	}
	if err := victim.Ping(ctx, nil); err != nil {
		t.Fatalf("fail point should be exhausted: %v", err)
	}
}

func TestDriverCompression(t *testing.T) {
	for _, comp := range []string{"snappy", "zlib", "zstd"} {
		t.Run(comp, func(t *testing.T) {
			s := Start(t, Options{Compressors: []string{"snappy", "zlib", "zstd"}, InMemory: true})
			var mu sync.Mutex
			seen := map[string]int{}
			s.Handle("ping", func(req *Request) Reply {
				mu.Lock()
				seen[req.Compressor]++
				mu.Unlock()
				return s.Builtin(req)
			})
			c := connectDriver(t, s, func(o *options.ClientOptions) { o.SetCompressors([]string{comp}) })
			ctx := testCtx(t)
			if err := c.Ping(ctx, nil); err != nil {
				t.Fatal(err)
			}
			coll := c.Database("db").Collection("z")
			if _, err := coll.InsertOne(ctx, bson.D{{Key: "payload", Value: string(make([]byte, 4096))}}); err != nil {
				t.Fatal(err)
			}
			if n, err := coll.CountDocuments(ctx, bson.D{}); err == nil || n != 0 {
				// aggregate is not built in: the error proves the reply
				// path works compressed for errors too.
				t.Fatalf("count: %d %v", n, err)
			}
			mu.Lock()
			defer mu.Unlock()
			if seen[comp] != 1 {
				t.Fatalf("ping compressors seen %v, want one %s", seen, comp)
			}
			agreed := false
			for _, ci := range s.Conns() {
				agreed = agreed || slices.Equal(ci.Compressors, []string{comp})
			}
			if !agreed {
				t.Fatalf("no connection agreed on %s: %+v", comp, s.Conns())
			}
		})
	}
}

func TestDriverLegacyHandshake(t *testing.T) {
	// Without a declared API version the driver's first hello is an
	// OP_QUERY isMaster; with one it is OP_MSG hello.
	s := Start(t, Options{})
	var mu sync.Mutex
	ops := map[string]int{}
	for _, name := range []string{"isMaster", "hello"} {
		s.Handle(name, func(req *Request) Reply {
			mu.Lock()
			ops[req.Command+"/"+req.OpCode.String()]++
			mu.Unlock()
			return s.Builtin(req)
		})
	}
	c := connectDriver(t, s, nil)
	if err := c.Ping(testCtx(t), nil); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if ops["isMaster/OP_QUERY"] == 0 {
		t.Fatalf("no legacy handshake seen: %v", ops)
	}
}

func TestDriverTransactions(t *testing.T) {
	s := Start(t, Options{Kind: Mongos, InMemory: true})
	c := connectDriver(t, s, nil)
	ctx := testCtx(t)
	coll := c.Database("db").Collection("tx")

	sess, err := c.StartSession()
	if err != nil {
		t.Fatal(err)
	}
	_, err = sess.WithTransaction(ctx, func(ctx context.Context) (any, error) {
		if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}}); err != nil {
			return nil, err
		}
		return coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 2}})
	})
	if err != nil {
		t.Fatalf("transaction: %v", err)
	}
	if err := sess.StartTransaction(); err != nil {
		t.Fatal(err)
	}
	if _, err := coll.InsertOne(mongo.NewSessionContext(ctx, sess), bson.D{{Key: "_id", Value: 3}}); err != nil {
		t.Fatal(err)
	}
	if err := sess.AbortTransaction(ctx); err != nil {
		t.Fatal(err)
	}
	sess.EndSession(ctx)

	txns := s.Transactions()
	if len(txns) != 2 {
		t.Fatalf("transactions %+v", txns)
	}
	if txns[0].State != TxnCommitted || !slices.Equal(txns[0].Commands, []string{"insert", "insert", "commitTransaction"}) {
		t.Errorf("first %+v", txns[0])
	}
	if txns[1].State != TxnAborted || txns[1].AbortedBy != "abortTransaction" {
		t.Errorf("second %+v", txns[1])
	}
	if got := len(s.Collection("db", "tx")); got != 2 {
		t.Errorf("collection has %d docs, want 2", got)
	}
}

func TestDriverStreamingMonitor(t *testing.T) {
	// With topologyVersion the driver monitors with awaitable hello over an
	// exhaust stream; each BumpTopologyVersion pushes one more reply.
	s := Start(t, Options{Kind: Mongos, TopologyVersion: true})
	awaited := make(chan struct{}, 64)
	mon := &event.ServerMonitor{
		ServerHeartbeatFailed: func(e *event.ServerHeartbeatFailedEvent) {
			t.Logf("heartbeat failed (awaited %v) after %v: %v", e.Awaited, e.Duration, e.Failure)
		},
		ServerHeartbeatSucceeded: func(e *event.ServerHeartbeatSucceededEvent) {
			if e.Awaited {
				select {
				case awaited <- struct{}{}:
				default:
				}
			}
		},
	}
	// Not a longer heartbeat: the Go driver's Disconnect sometimes waits
	// for the awaitable hello in flight, whose maxAwaitTimeMS is the
	// heartbeat, to end (a one-minute heartbeat stalled 1 run in ~20).
	c := connectDriver(t, s, func(o *options.ClientOptions) {
		o.SetServerMonitor(mon).SetHeartbeatInterval(10 * time.Second).SetServerMonitoringMode(options.ServerMonitoringModeStream)
	})
	if err := c.Ping(testCtx(t), nil); err != nil {
		t.Fatal(err)
	}
	hellos := s.Requests("hello")
	for i := range 3 {
		deadline := time.After(10 * time.Second)
		// The monitor may not have sent its awaitable hello yet: bump until
		// a streamed reply arrives.
		for got := false; !got; {
			s.BumpTopologyVersion()
			select {
			case <-awaited:
				got = true
			case <-time.After(50 * time.Millisecond):
			case <-deadline:
				t.Fatalf("no awaited heartbeat %d", i)
			}
		}
	}
	// Streamed replies need no new request: at most the first awaitable
	// hello (and an RTT probe) was sent during the loop.
	if n := s.Requests("hello") - hellos; n > 2 {
		t.Errorf("%d hello requests for 3 streamed heartbeats: not streaming", n)
	}
}
