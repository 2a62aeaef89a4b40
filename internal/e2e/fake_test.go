package e2e

import (
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

func TestDriverThroughBouncerToFake(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		_, addr := bouncer(t, up.URI(), nil)
		c := driver(t, addr, "")
		ctx := ctxT(t, 30*time.Second)
		if err := c.Ping(ctx, nil); err != nil {
			t.Fatal(err)
		}
		coll := c.Database("shop").Collection("orders")
		for i := range 25 {
			if _, err := coll.InsertOne(ctx, bson.D{{Key: "n", Value: i}}); err != nil {
				t.Fatal(err)
			}
		}
		cur, err := coll.Find(ctx, bson.D{}, options.Find().SetBatchSize(4))
		if err != nil {
			t.Fatal(err)
		}
		var docs []bson.M
		if err := cur.All(ctx, &docs); err != nil {
			t.Fatal(err)
		}
		if len(docs) != 25 {
			t.Fatalf("got %d docs, want 25", len(docs))
		}
		if n := up.Requests("getMore"); n < 6 {
			t.Fatalf("getMore reached upstream %d times, want >= 6", n)
		}
	})
}
