package auth

// A flood of lookups (issue 27, item 9): names nobody has do not crowd out
// a real user's cached answer or its deduplication, and one client
// address runs at most MaxLookupsPerPeer lookups at once.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A flood of random names from one address fills the negative entries
// only: the real user's lookup is still cached and served, and while the
// cache is full of negatives a real user's concurrent logins still share
// one lookup.
func TestFloodKeepsRealUsersCached(t *testing.T) {
	up := newUpstreamUsers()
	up.set("real", "admin", scramCreds(t, "real", "pw", "salt-one-16bytes", 4096))
	c := NewCache(up, CacheOptions{PositiveTTL: time.Hour, NegativeTTL: time.Hour, MaxEntries: 50, MaxLookupsPerPeer: 64})
	a := New(&Users{}, nil, c)
	attacker := Peer{Remote: "203.0.113.9:4000", Local: "127.0.0.1:27017"}
	client := Peer{Remote: "192.0.2.1:5000", Local: "127.0.0.1:27017"}
	flood := func(from, n int) {
		ctx := WithPeer(context.Background(), attacker)
		for i := from; i < from+n; i++ {
			if _, err := c.Get(ctx, fmt.Sprintf("ghost%d", i), "admin"); !errors.Is(err, ErrNotFound) {
				t.Fatalf("ghost%d: %v", i, err)
			}
		}
	}
	flood(0, 200)
	if err := loginFrom(t, a, client, SCRAMSHA256, "real", "admin", "pw"); err != nil {
		t.Fatal(err)
	}
	flood(200, 200)
	for range 3 {
		if err := loginFrom(t, a, client, SCRAMSHA256, "real", "admin", "pw"); err != nil {
			t.Fatal(err)
		}
	}
	if n := up.n("real", "admin"); n != 1 {
		t.Fatalf("%d lookups of the real user, want 1 (cached despite the flood)", n)
	}

	// Deduplicated while the negatives are full: eight logins of a user
	// nobody asked about yet, at once, cost one lookup.
	up.set("second", "admin", scramCreds(t, "second", "pw", "salt-one-16bytes", 4096))
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			ctx := WithPeer(context.Background(), client)
			if _, err := c.Get(ctx, "second", "admin"); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := up.n("second", "admin"); n != 1 {
		t.Fatalf("%d lookups of one user asked at once, want 1", n)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.missing.m) > 50 || c.missing.order.Len() != len(c.missing.m) || len(c.inflight) != 0 {
		t.Fatalf("negatives %d (list %d), in flight %d", len(c.missing.m), c.missing.order.Len(), len(c.inflight))
	}
}

// One client address runs at most MaxLookupsPerPeer lookups at once;
// another address's lookups go on meanwhile; a lookup past the bound
// waits for a slot, then fails busy (not cached), counted as peer_busy.
func TestLookupsPerPeerBounded(t *testing.T) {
	var running, peak atomic.Int32
	release := make(chan struct{})
	c := NewCache(LookupFunc(func(ctx context.Context, user, db string) (Creds, error) {
		n := running.Add(1)
		defer running.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		if user != "other" {
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return Creds{}, ErrNotFound
	}), CacheOptions{MaxLookups: 16, MaxLookupsPerPeer: 3, Timeout: 2 * time.Second})
	obs := newCountingObserver()
	c.setObserver(obs)
	flooder := WithPeer(context.Background(), Peer{Remote: "203.0.113.9:4000"})
	var wg sync.WaitGroup
	var busy atomic.Int32
	for i := range 8 {
		wg.Go(func() {
			// Another port of the same host is the same peer.
			ctx := WithPeer(context.Background(), Peer{Remote: fmt.Sprintf("203.0.113.9:%d", 4000+i)})
			if _, err := c.Get(ctx, fmt.Sprintf("n%d", i), "admin"); errors.Is(err, ErrLookupsBusy) {
				busy.Add(1)
			}
		})
	}
	deadline := time.Now().Add(5 * time.Second)
	for running.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	if n := running.Load(); n != 3 {
		t.Fatalf("%d lookups running for one address, want 3", n)
	}
	// Another address is not held up by the flooder's.
	other := WithPeer(context.Background(), Peer{Remote: "192.0.2.1:5000"})
	if _, err := c.Get(other, "other", "admin"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("another address's lookup: %v", err)
	}
	close(release)
	wg.Wait()
	if peak.Load() != 4 {
		t.Fatalf("peak %d lookups at once, want 4 (3 of the flooder's, 1 other)", peak.Load())
	}
	// The waiting ones got slots as the first ended: none was busy.
	if busy.Load() != 0 {
		t.Fatalf("%d busy, want 0", busy.Load())
	}
	// The slots are given back just after the answers are published.
	peers := -1
	for deadline := time.Now().Add(2 * time.Second); peers != 0 && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		c.mu.Lock()
		peers = len(c.peers)
		c.mu.Unlock()
	}
	if peers != 0 {
		t.Fatalf("%d peers' slots left behind", peers)
	}

	// Past the bound for the whole timeout: busy, counted, not cached.
	block := make(chan struct{})
	c2 := NewCache(LookupFunc(func(ctx context.Context, user, db string) (Creds, error) {
		select { // past its own timeout, as a stuck upstream may
		case <-block:
		case <-time.After(5 * time.Second):
		}
		return Creds{}, ErrNotFound
	}), CacheOptions{MaxLookupsPerPeer: 1, Timeout: 200 * time.Millisecond})
	c2.setObserver(obs)
	go func() { _, _ = c2.Get(flooder, "a", "admin") }()
	time.Sleep(50 * time.Millisecond)
	if _, err := c2.Get(flooder, "b", "admin"); !errors.Is(err, ErrLookupsBusy) {
		t.Fatalf("past the per-address bound: %v", err)
	}
	close(block)
	time.Sleep(300 * time.Millisecond) // let "a" end
	if obs.looked(LookupPeerBusy) != 1 || obs.looked(LookupNotFound) != 10 {
		t.Fatalf("lookups counted: %v", obs.lookups)
	}
}
