package e2e

// Cursors behind a balancer: with a plain URI a driver gives its pooled
// connection back after a find and sends the cursor's getMore on whichever
// connection it checks out next, which the balancer may have put on another
// mongobouncer. That instance does not know which member of a replica set
// holds the cursor. With loadBalanced=true the driver sends every getMore
// on the find's connection, so it reaches the instance, and through its
// cursor affinity the member, that holds the cursor.

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"

	"github.com/mongobouncer/mongobouncer/internal/loadgen"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// runBalancedCursors reads cursors on secondaries, in batches of 2, from 8
// concurrent clients of one driver (URI options extra) through HAProxy in
// front of two mongobouncers over rs. It returns how many cursors were read
// whole and the errors of the others.
func runBalancedCursors(t *testing.T, rs *fakemongo.ReplicaSet, extra string) (int, []error) {
	_, addrA := rsBouncer(t, rs, nil)
	_, addrB := rsBouncer(t, rs, nil)
	h, err := loadgen.StartHAProxy(ctxT(t, 15*time.Second), loadgen.HAProxyOptions{
		Balance: []string{addrA, addrB}, Threads: 1, MaxConn: 1000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Stop)
	c := driver(t, h.Addr(), "&maxPoolSize=16"+extra)
	ctx := cancelCtx(t, 60*time.Second)
	const docs = 10
	coll := c.Database("lbcursor").Collection("c")
	rc := coll.Database().Collection("c", options.Collection().SetReadPreference(readpref.Secondary()))

	const workers, cursors = 8, 15
	var mu sync.Mutex
	var errs []error // guarded by mu
	whole := 0       // guarded by mu
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range cursors {
				cur, err := rc.Find(ctx, bson.D{}, options.Find().SetBatchSize(2))
				var got []bson.Raw
				if err == nil {
					err = cur.All(ctx, &got)
				}
				if err == nil && len(got) != docs {
					err = fmt.Errorf("read %d documents, want %d", len(got), docs)
				}
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					whole++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Logf("%d of %d cursors read whole; errors: %d", whole, workers*cursors, len(errs))
	return whole, errs
}

// With two mongobouncers behind a balancer over a replica set, cursors on
// secondaries read under concurrency all complete with loadBalanced=true.
// With the plain URI some getMores reach the other instance, which sends
// them to a member without the cursor (CursorNotFound), as the log shows;
// the count is logged, not asserted: it depends on the driver's choice of
// connection.
func TestBalancedCursorsOnSecondariesNeedLoadBalanced(t *testing.T) {
	oneIO(t)
	if _, err := loadgen.FindHAProxy(""); err != nil {
		t.Skipf("haproxy not installed (make haproxy): %v", err)
	}
	rs := fakemongo.StartReplicaSet(t, fakemongo.ReplicaSetOptions{})
	// The documents, written once through a mongobouncer of their own (the
	// set replicates them to the secondaries).
	_, seedAddr := rsBouncer(t, rs, nil)
	seed := driver(t, seedAddr, "")
	ctx := cancelCtx(t, 30*time.Second)
	docs := make([]any, 10)
	for i := range docs {
		docs[i] = bson.D{{Key: "_id", Value: i}}
	}
	must(t, func() error { _, err := seed.Database("lbcursor").Collection("c").InsertMany(ctx, docs); return err }())

	t.Run("plain", func(t *testing.T) {
		whole, errs := runBalancedCursors(t, rs, "")
		if len(errs) > 0 {
			t.Logf("plain URI: %d of %d cursors failed, the first: %v", len(errs), whole+len(errs), errs[0])
		}
	})
	t.Run("loadBalanced", func(t *testing.T) {
		whole, errs := runBalancedCursors(t, rs, lbURI)
		if len(errs) != 0 {
			t.Fatalf("loadBalanced: %d of %d cursors failed: %v", len(errs), whole+len(errs), errs)
		}
	})
}
