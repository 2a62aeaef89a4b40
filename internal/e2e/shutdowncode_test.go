package e2e

import (
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// A member that answers ShutdownInProgress (a graceful shutdown) costs the
// application no connection to mongobouncer: the driver gets
// HostUnreachable, retries, and keeps its pool, where a shutdown code would
// have made it clear the pool.
func TestUpstreamShutdownCodeKeepsClientPool(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		var failed atomic.Int32
		up.Handle("find", func(req *fakemongo.Request) fakemongo.Reply {
			if failed.Add(1) == 1 {
				return fakemongo.Error(91, "ShutdownInProgress", "The server is in quiesce mode and will shut down")
			}
			return up.Builtin(req)
		})
		_, addr := bouncer(t, up.URI(), nil)
		var closed, cleared atomic.Int32
		c, err := mongo.Connect(options.Client().ApplyURI("mongodb://" + addr + "/?serverSelectionTimeoutMS=10000").
			SetPoolMonitor(&event.PoolMonitor{Event: func(e *event.PoolEvent) {
				switch e.Type {
				case event.ConnectionClosed:
					closed.Add(1)
				case event.ConnectionPoolCleared:
					cleared.Add(1)
				}
			}}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Disconnect(ctxT(t, 5*time.Second)) })
		coll := c.Database("db").Collection("c")
		ctx := ctxT(t, 30*time.Second)
		if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}}); err != nil {
			t.Fatal(err)
		}
		var d bson.D
		if err := coll.FindOne(ctx, bson.D{}).Decode(&d); err != nil {
			t.Fatalf("find after a ShutdownInProgress: %v", err)
		}
		if n := failed.Load(); n < 2 {
			t.Fatalf("%d finds reached the upstream, want the failed one and its retry", n)
		}
		if closed.Load() != 0 || cleared.Load() != 0 {
			t.Errorf("the driver closed %d connections and cleared its pool %d times", closed.Load(), cleared.Load())
		}
	})
}
