package routing

// The affinity maps stay bounded, keep their newest entries, and drop
// expired ones before live ones.

import (
	"testing"
	"time"
)

func TestAffinityBounded(t *testing.T) {
	a := NewAffinity[int64, int](100, time.Minute)
	now := time.Unix(1000, 0)
	for i := int64(0); i < 1000; i++ {
		a.Put(i, int(i), now.Add(time.Duration(i)*time.Millisecond))
	}
	if n := a.Len(); n > 100 {
		t.Fatalf("affinity grew to %d entries, bound is 100", n)
	}
	// The newest entries survive eviction.
	if v, ok := a.Get(999, now.Add(time.Second)); !ok || v != 999 {
		t.Fatalf("newest entry lost: %v %v", v, ok)
	}
	// Expired entries are not returned.
	if _, ok := a.Get(999, now.Add(time.Hour)); ok {
		t.Fatal("expired entry returned")
	}
}

func TestAffinityExpiredMakeRoomFirst(t *testing.T) {
	a := NewAffinity[int64, int](2, time.Second)
	t0 := time.Unix(0, 0)
	a.Put(1, 1, t0)
	a.Put(2, 2, t0.Add(500*time.Millisecond))
	a.Put(3, 3, t0.Add(1200*time.Millisecond)) // 1 has expired: only it goes
	if _, ok := a.Get(2, t0.Add(1300*time.Millisecond)); !ok {
		t.Fatal("live entry evicted while an expired one could go")
	}
	if a.evicted != 0 {
		t.Fatalf("evicted=%d, want 0 (expiry is not eviction)", a.evicted)
	}
}
