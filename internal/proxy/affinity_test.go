package proxy

// The affinity maps' bounds and expiry, and mustDoc, the tests' BSON
// document maker.

import (
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

func mustDoc(t testing.TB, v any) bsoncore.Document {
	t.Helper()
	b, err := bson.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestAffinityBounded(t *testing.T) {
	a := newAffinity[int64, int](100, time.Minute)
	now := time.Unix(1000, 0)
	for i := int64(0); i < 1000; i++ {
		a.put(i, int(i), now.Add(time.Duration(i)*time.Millisecond))
	}
	if n := a.len(); n > 100 {
		t.Fatalf("affinity grew to %d entries, bound is 100", n)
	}
	// The newest entries survive eviction.
	if v, ok := a.get(999, now.Add(time.Second)); !ok || v != 999 {
		t.Fatalf("newest entry lost: %v %v", v, ok)
	}
	// Expired entries are not returned.
	if _, ok := a.get(999, now.Add(time.Hour)); ok {
		t.Fatal("expired entry returned")
	}
}

func TestAffinityExpiredMakeRoomFirst(t *testing.T) {
	a := newAffinity[int64, int](2, time.Second)
	t0 := time.Unix(0, 0)
	a.put(1, 1, t0)
	a.put(2, 2, t0.Add(500*time.Millisecond))
	a.put(3, 3, t0.Add(1200*time.Millisecond)) // 1 has expired: only it goes
	if _, ok := a.get(2, t0.Add(1300*time.Millisecond)); !ok {
		t.Fatal("live entry evicted while an expired one could go")
	}
	if a.evicted != 0 {
		t.Fatalf("evicted=%d, want 0 (expiry is not eviction)", a.evicted)
	}
}
