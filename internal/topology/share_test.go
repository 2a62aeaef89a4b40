package topology

// max_db_connections over a server's main pool and its user pools: the
// sum holds under a concurrent mix of users, and a user whose pool is
// empty gets a connection by closing another user's idle one.

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// sumCounter counts the connections alive over every pool it monitors
// (ConnectionCreated to ConnectionClosed) and records any moment, at a
// creation or a checkout, when they exceed max.
type sumCounter struct {
	max        int64
	live, peak atomic.Int64
	over       atomic.Int64
	mu         sync.Mutex
	first      string
}

func (c *sumCounter) HandleEvent(e pool.Event) {
	var n int64
	switch e.Type {
	case pool.ConnectionCreated:
		n = c.live.Add(1)
		for p := c.peak.Load(); n > p && !c.peak.CompareAndSwap(p, n); p = c.peak.Load() {
		}
	case pool.ConnectionCheckedOut:
		n = c.live.Load()
	case pool.ConnectionClosed:
		c.live.Add(-1)
		return
	default:
		return
	}
	if n > c.max && c.over.Add(1) == 1 {
		c.mu.Lock()
		c.first = fmt.Sprintf("%v: %d connections over the server's pools > max_db_connections %d", e.Type, n, c.max)
		c.mu.Unlock()
	}
}

func TestMaxDBConnectionsAcrossUserPools(t *testing.T) {
	fake := fakemongo.Start(t, fakemongo.Options{Users: fakeUsers})
	const maxDB = 3
	sc := &sumCounter{max: maxDB}
	o := userOptions(&recorder{}, fake.Addr())
	o.Pool.Monitor = sc
	o.UserPoolMonitor = func() pool.Monitor { return sc }
	o.Pool.MaxPoolSize = 10
	o.Pool.WaitQueueTimeout = 10 * time.Second
	o.MaxUserConnections = 3
	o.MaxDBConnections = maxDB
	topo := newTopology(t, o)
	s := mustSelect(t, topo)
	alice := mustUserPool(t, s, "alice@admin", scramAs(t, "alice", "alice-pw"))
	bob := mustUserPool(t, s, "bob@admin", scramAs(t, "bob", "bob-pw"))
	pools := []*pool.Pool{s.Pool(), alice, bob}

	// Alice fills the budget, then goes idle: Bob is served by evicting
	// one of her idle connections, without waiting for her.
	var held []*pool.Conn
	for range maxDB {
		c, err := alice.CheckOut(ctxTimeout(t, 5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	for _, c := range held {
		_ = alice.CheckIn(c)
	}
	start := time.Now()
	cb, err := bob.CheckOut(ctxTimeout(t, 5*time.Second))
	if err != nil {
		t.Fatalf("bob starved while alice held idle connections: %v", err)
	}
	t.Logf("bob served in %v by an eviction", time.Since(start))
	_ = bob.CheckIn(cb)
	if st := s.Share().Stats(); st.Evictions < 1 || st.Used > maxDB || st.Max != maxDB {
		t.Fatalf("share %+v", st)
	}

	// A concurrent mix of the three pools.
	const workers, rounds = 12, 40
	var wg sync.WaitGroup
	var failed atomic.Int64
	deadline := time.Now().Add(20 * time.Second)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				if time.Now().After(deadline) {
					return
				}
				p := pools[(w+i/10)%len(pools)]
				c, err := p.CheckOut(ctxTimeout(t, 10*time.Second))
				if err != nil {
					if failed.Add(1) == 1 {
						t.Errorf("checkout: %v", err)
					}
					return
				}
				if used := s.Share().Stats().Used; used > maxDB {
					t.Errorf("share counts %d > %d", used, maxDB)
				}
				_ = p.CheckIn(c)
			}
		}()
	}
	wg.Wait()
	if n := sc.over.Load(); n > 0 {
		sc.mu.Lock()
		t.Errorf("cap exceeded %d times; first: %s", n, sc.first)
		sc.mu.Unlock()
	}
	if p := sc.peak.Load(); p != maxDB {
		t.Errorf("peak %d connections, want max_db_connections %d reached", p, maxDB)
	}
	// Lowered live, the budget closes idle connections down to it.
	if err := topo.SetMaxDBConnections(1); err != nil {
		t.Fatal(err)
	}
	eventually(t, "idle connections closed down to the lowered cap", func() bool { return s.Share().Stats().Used <= 1 })
	t.Logf("share %+v", s.Share().Stats())
}
