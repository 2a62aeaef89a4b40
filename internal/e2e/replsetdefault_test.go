package e2e

import (
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// A route's read_preference applies to reads that carry none: they reach
// the secondaries (which refuse a read without $readPreference, so
// mongobouncer must add the route's), while writes stay on the primary and
// a read's own $readPreference wins.
func TestReplicaSetRouteDefaultReadPreference(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		rs := fakemongo.StartReplicaSet(t, fakemongo.ReplicaSetOptions{
			Tags: map[int]map[string]string{1: {"dc": "east"}, 2: {"dc": "west"}},
		})
		_, addr := rsBouncer(t, rs, func(c *config.Config) {
			r := c.Databases["*"]
			mode := config.ReadSecondary
			tags := []map[string]string{{"dc": "west"}}
			r.ReadPreference = &mode
			r.ReadPreferenceTags = &tags
			c.Databases["*"] = r
		})
		c := driver(t, addr, "")
		ctx := cancelCtx(t, 60*time.Second)
		coll := c.Database("db").Collection("c")
		ins := counts(rs, "insert")
		if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}}); err != nil {
			t.Fatal(err)
		}
		if got := since(ins, counts(rs, "insert")); got[0] != 1 {
			t.Fatalf("insert by member %v, want the primary", got)
		}
		before := counts(rs, "find")
		for range 30 {
			var d bson.D
			if err := coll.FindOne(ctx, bson.D{}).Decode(&d); err != nil {
				t.Fatalf("find with the route's default: %v", err)
			}
		}
		if got := since(before, counts(rs, "find")); got[2] != 30 {
			t.Errorf("finds by member %v, want all 30 on member 2 (secondary, dc west)", got)
		}
		// The driver's own read preference (primary is sent to a mongos as
		// none, so use primaryPreferred) beats the route's.
		before = counts(rs, "find")
		pc := driver(t, addr, "&readPreference=primaryPreferred").Database("db").Collection("c")
		for range 10 {
			var d bson.D
			if err := pc.FindOne(ctx, bson.D{}).Decode(&d); err != nil {
				t.Fatal(err)
			}
		}
		if got := since(before, counts(rs, "find")); got[0] != 10 {
			t.Errorf("primaryPreferred finds by member %v, want all 10 on the primary", got)
		}
	})
}
