package auth

// Review finding: a lookup in flight is shared by every client that asks
// for the same user, but its slot is charged to the peer that asked first.
// A peer whose own per-address slots are full can so make another peer's
// login of a real user fail (busy), though that peer and the global slots
// are free.

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestReviewPeerBusyFailsAnotherPeersLookup(t *testing.T) {
	var running atomic.Int32
	release := make(chan struct{})
	c := NewCache(LookupFunc(func(ctx context.Context, user, db string) (Creds, error) {
		running.Add(1)
		defer running.Add(-1)
		if strings.HasPrefix(user, "slow") {
			// Held past the lookup timeout: stands for the attacker's queue
			// of lookups that keeps its slots full without a break (each
			// real one is bounded by Timeout; the test keeps it simple).
			<-release
			return Creds{}, ErrNotFound
		}
		return Creds{}, nil // alice exists
	}), CacheOptions{MaxLookups: 16, MaxLookupsPerPeer: 2, Timeout: time.Second})
	attacker := WithPeer(context.Background(), Peer{Remote: "203.0.113.9:4000"})
	victim := WithPeer(context.Background(), Peer{Remote: "192.0.2.1:5000"})
	var wg sync.WaitGroup
	defer func() { close(release); wg.Wait() }()
	for _, n := range []string{"slow1", "slow2"} {
		wg.Go(func() { _, _ = c.Get(attacker, n, "admin") })
	}
	for deadline := time.Now().Add(3 * time.Second); running.Load() < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the attacker's lookups did not start")
		}
	}
	// The attacker names the victim's user: the entry goes in flight,
	// waiting for a slot of the attacker's.
	wg.Go(func() { _, _ = c.Get(attacker, "alice", "admin") })
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(time.Millisecond) {
		c.mu.Lock()
		_, ok := c.inflight[lookupKey{"alice", "admin"}]
		c.mu.Unlock()
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("alice's lookup not in flight")
		}
	}
	// The victim, from another address with free slots, logs in as alice.
	start := time.Now()
	_, err := c.Get(victim, "alice", "admin")
	t.Logf("victim: err=%v after %v", err, time.Since(start))
	if err != nil {
		t.Fatalf("another address's lookup of a real user failed because the attacker's address is busy: %v (busy: %v)",
			err, errors.Is(err, ErrLookupsBusy))
	}
}
