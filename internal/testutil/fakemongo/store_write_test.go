package fakemongo

import (
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

func TestDriverUpdateDelete(t *testing.T) {
	s := Start(t, Options{InMemory: true})
	ctx := testCtx(t)
	coll := connectDriver(t, s, nil).Database("db").Collection("c")
	docs := []any{
		bson.D{{Key: "_id", Value: 1}, {Key: "k", Value: "a"}, {Key: "n", Value: 1}},
		bson.D{{Key: "_id", Value: 2}, {Key: "k", Value: "a"}, {Key: "n", Value: 2}},
		bson.D{{Key: "_id", Value: 3}, {Key: "k", Value: "b"}, {Key: "n", Value: 3}},
	}
	if _, err := coll.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	get := func(id int) bson.M {
		t.Helper()
		var m bson.M
		if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&m); err != nil {
			t.Fatalf("find %d: %v", id, err)
		}
		return m
	}

	ur, err := coll.UpdateOne(ctx, bson.D{{Key: "k", Value: "a"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: 10}, {Key: "new", Value: true}}}})
	if err != nil || ur.MatchedCount != 1 || ur.ModifiedCount != 1 {
		t.Fatalf("UpdateOne: %+v %v", ur, err)
	}
	if m := get(1); m["n"] != int32(10) || m["new"] != true || m["k"] != "a" {
		t.Fatalf("after $set: %v", m)
	}
	ur, err = coll.UpdateMany(ctx, bson.D{{Key: "k", Value: "a"}}, bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: 10}}}})
	if err != nil || ur.MatchedCount != 2 || ur.ModifiedCount != 1 {
		t.Fatalf("UpdateMany: %+v %v", ur, err)
	}
	ur, err = coll.ReplaceOne(ctx, bson.D{{Key: "_id", Value: 3}}, bson.D{{Key: "k", Value: "c"}})
	if err != nil || ur.ModifiedCount != 1 {
		t.Fatalf("ReplaceOne: %+v %v", ur, err)
	}
	if m := get(3); len(m) != 2 || m["k"] != "c" {
		t.Fatalf("after replace: %v", m)
	}
	ur, err = coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: 4}}, bson.D{{Key: "$set", Value: bson.D{{Key: "k", Value: "d"}}}}, options.UpdateOne().SetUpsert(true))
	if err != nil || ur.UpsertedCount != 1 || ur.UpsertedID != int32(4) {
		t.Fatalf("upsert: %+v %v", ur, err)
	}
	if m := get(4); m["k"] != "d" {
		t.Fatalf("upserted: %v", m)
	}
	if _, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: 1}}}}); err == nil {
		t.Fatal("$inc was accepted")
	}

	dr, err := coll.DeleteOne(ctx, bson.D{{Key: "k", Value: "a"}})
	if err != nil || dr.DeletedCount != 1 {
		t.Fatalf("DeleteOne: %+v %v", dr, err)
	}
	dr, err = coll.DeleteMany(ctx, bson.D{})
	if err != nil || dr.DeletedCount != 3 {
		t.Fatalf("DeleteMany: %+v %v", dr, err)
	}
	if n := len(s.Collection("db", "c")); n != 0 {
		t.Fatalf("%d documents left", n)
	}
}

func TestReplicaSetDriverUpdatesThroughFailover(t *testing.T) {
	rs := StartReplicaSet(t, ReplicaSetOptions{ElectionDelay: 200 * time.Millisecond})
	ctx := testCtx(t)
	coll := connectURI(t, rs.URI(), nil).Database("db").Collection("c")
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}, {Key: "n", Value: 0}}); err != nil {
		t.Fatal(err)
	}
	var failedOver atomic.Bool
	errc := make(chan error, 1)
	// Update until 20 updates after the failover ended (bounded).
	updates, after := 0, 0
	for deadline := time.Now().Add(15 * time.Second); after < 20 && updates < 5000 && time.Now().Before(deadline); {
		updates++
		if updates == 20 {
			go func() {
				_, err := rs.Failover()
				errc <- err
				failedOver.Store(true)
			}()
		}
		if _, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: 1}}, bson.D{{Key: "$set", Value: bson.D{{Key: "n", Value: updates}}}}); err != nil {
			t.Fatalf("update %d: %v", updates, err)
		}
		if failedOver.Load() {
			after++
		}
	}
	if !failedOver.Load() {
		t.Fatal("the failover did not end during the updates")
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	docs := rs.Collection("db", "c")
	if n, _ := docs[0].Lookup("n").AsInt64OK(); len(docs) != 1 || n != int64(updates) {
		t.Fatalf("documents %v", docs)
	}
	if rs.Primary().Index() == 0 {
		t.Fatal("no failover happened")
	}
}

// FuzzApplyUpdate feeds arbitrary documents, filters and updates from the
// wire to the update engine: it may refuse them, never panic, and what it
// returns must be a valid document.
func FuzzApplyUpdate(f *testing.F) {
	doc := func(v any) []byte { return Doc(v) }
	f.Add(doc(bson.D{{Key: "_id", Value: 1}, {Key: "a", Value: 1}}), doc(bson.D{{Key: "$set", Value: bson.D{{Key: "a", Value: 2}, {Key: "b", Value: "x"}}}}), doc(bson.D{{Key: "_id", Value: 1}}))
	f.Add(doc(bson.D{{Key: "a", Value: 1}}), doc(bson.D{{Key: "_id", Value: 2}, {Key: "z", Value: true}}), doc(bson.D{{Key: "a", Value: bson.D{{Key: "$gt", Value: 1}}}}))
	f.Add([]byte{5, 0, 0, 0, 0}, []byte{5, 0, 0, 0, 0}, []byte{})
	f.Fuzz(func(t *testing.T, d, u, q []byte) {
		if out, err := applyUpdate(d, u); err == nil {
			if verr := out.Validate(); verr != nil {
				t.Fatalf("applyUpdate returned an invalid document: %v", verr)
			}
		}
		if verr := upsertBase(q).Validate(); verr != nil {
			t.Fatalf("upsertBase returned an invalid document: %v", verr)
		}
	})
}
