package e2e

// A load-balanced driver's cursor across a drain: its getMores can only
// reach the mongobouncer that opened it (the driver pins the cursor to one
// connection), so the drain lets them through and waits for the cursor to
// end, as it waits for an open transaction. A plain driver's cursor is not
// waited for: its getMore gets ShutdownInProgress, and the driver may send
// the next one to another mongobouncer.

import (
	"errors"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// openCursor finds every document of coll in batches of 2 and reads n.
func openCursor(t *testing.T, coll *mongo.Collection, n int) *mongo.Cursor {
	t.Helper()
	ctx := ctxT(t, 20*time.Second)
	cur, err := coll.Find(ctx, bson.D{}, options.Find().SetBatchSize(2))
	must(t, err)
	for i := range n {
		if !cur.Next(ctx) {
			t.Fatalf("cursor ended after %d documents: %v", i, cur.Err())
		}
	}
	return cur
}

func TestDrainLetsALoadBalancedCursorFinish(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		for _, m := range lbModes {
			t.Run(m, func(t *testing.T) {
				up := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos, InMemory: true})
				a, addr := bouncer(t, up.URI(), mode(m, 4))
				lb := driver(t, addr, lbURI).Database("lbdraincur").Collection("c")
				plain := driver(t, addr, "").Database("lbdraincur").Collection("c")
				ctx := ctxT(t, 30*time.Second)
				const total = 20
				docs := make([]any, total)
				for i := range docs {
					docs[i] = bson.D{{Key: "_id", Value: i}}
				}
				_, err := lb.InsertMany(ctx, docs)
				must(t, err)

				reading := openCursor(t, lb, 3)
				closing := openCursor(t, lb, 1)
				plainCur := openCursor(t, plain, 3)

				done := make(chan error, 1)
				start := time.Now()
				go func() { done <- a.GracefulClose(ctxT(t, 20*time.Second)) }()
				waitDraining(t, a, addr)
				select {
				case err := <-done:
					t.Fatalf("the drain ended (%v) with two load-balanced cursors open", err)
				case <-time.After(300 * time.Millisecond):
				}

				// The plain driver's cursor is refused: its getMore gets the
				// drain's 91, or, when the driver's streaming monitor has
				// seen the quiesce first and cleared its pool, fails with
				// the pool cleared. Either way it does not go on.
				for plainCur.Next(ctx) {
				}
				var se mongo.ServerError
				err = plainCur.Err()
				if !(errors.As(err, &se) && se.HasErrorCode(91)) && !strings.Contains(err.Error(), "connection pool for") {
					t.Fatalf("plain cursor during the drain: %v, want ShutdownInProgress or its pool cleared", err)
				}

				// The load-balanced ones finish: one killed, one read to its end.
				must(t, closing.Close(ctx))
				n := 3
				for reading.Next(ctx) {
					n++
				}
				must(t, reading.Err())
				if n != total {
					t.Fatalf("the load-balanced cursor read %d documents across the drain, want %d", n, total)
				}
				select {
				case err := <-done:
					if err != nil {
						t.Fatalf("drain: %v", err)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("the drain did not end once the load-balanced cursors had")
				}
				t.Logf("drain took %v", time.Since(start).Round(time.Millisecond))
				// Upstream, only the plain driver's cursor is left.
				if open := up.OpenCursors(); len(open) != 1 {
					t.Fatalf("upstream cursors open after the drain: %v, want only the plain driver's", open)
				}
			})
		}
	})
}
