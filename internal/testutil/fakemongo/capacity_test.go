package fakemongo

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestCapacityQueuesBeyondWorkers: six pings on six connections against two
// workers of 50 ms take three services end to end, and hello is not served
// through the model.
func TestCapacityQueuesBeyondWorkers(t *testing.T) {
	s := Start(t, Options{Capacity: &Capacity{Workers: 2, Service: 50 * time.Millisecond}})
	clients := make([]*rawClient, 6)
	for i := range clients {
		clients[i] = dialRaw(t, s)
	}
	start := time.Now()
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Go(func() { mustOK(t, c.roundTrip(d{{"ping", 1}, {"$db", "admin"}})) })
	}
	wg.Wait()
	if el := time.Since(start); el < 150*time.Millisecond || el > 5*time.Second {
		t.Fatalf("6 pings on 2 workers of 50ms took %v, want at least 150ms", el)
	}

	slow := Start(t, Options{Capacity: &Capacity{Workers: 1, Service: 2 * time.Second}})
	start = time.Now()
	mustOK(t, dialRaw(t, slow).roundTrip(d{{"hello", 1}, {"$db", "admin"}}))
	if el := time.Since(start); el > time.Second {
		t.Fatalf("hello took %v on a 2s-per-command model; the handshake must not queue", el)
	}
}

func TestCapacityContentionStretchesService(t *testing.T) {
	m := newCapacity(&Capacity{Workers: 4, Service: 10 * time.Millisecond, Contention: 0.5})
	for _, c := range []struct {
		outstanding int64
		want        time.Duration
	}{{1, 10 * time.Millisecond}, {4, 10 * time.Millisecond}, {8, 15 * time.Millisecond}, {12, 20 * time.Millisecond}} {
		if got := m.serviceTime(c.outstanding); got != c.want {
			t.Errorf("service with %d outstanding = %v, want %v", c.outstanding, got, c.want)
		}
	}
	if newCapacity(&Capacity{Workers: 4}) != nil || newCapacity(nil) != nil {
		t.Error("a model without a service time must be off")
	}
}

// TestCapacityOccupy: with 2 of 3 workers taken by a background job, three
// pings of 50 ms run one at a time; after release they run together.
func TestCapacityOccupy(t *testing.T) {
	s := Start(t, Options{Capacity: &Capacity{Workers: 3, Service: 50 * time.Millisecond}})
	clients := []*rawClient{dialRaw(t, s), dialRaw(t, s), dialRaw(t, s)}
	round := func() time.Duration {
		start := time.Now()
		var wg sync.WaitGroup
		for _, c := range clients {
			wg.Go(func() { mustOK(t, c.roundTrip(d{{"ping", 1}, {"$db", "admin"}})) })
		}
		wg.Wait()
		return time.Since(start)
	}
	release := s.Occupy(context.Background(), 2)
	if el := round(); el < 150*time.Millisecond {
		t.Fatalf("3 pings with 1 free worker took %v, want at least 150ms", el)
	}
	release()
	release() // a second call does nothing
	if el := round(); el > 5*time.Second {
		t.Fatalf("3 pings on 3 free workers took %v", el)
	}
	if got := s.capacity.outstanding.Load(); got != 0 {
		t.Fatalf("outstanding %d after release, want 0", got)
	}
}
