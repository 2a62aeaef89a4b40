package auth

// Review finding: a failed proof's second look drops the user's cached
// answer before it knows whether the new lookup succeeds. Anyone who knows
// a user name can so, with one garbage attempt, throw a real user's cached
// credentials away; while the upstream cannot be asked (an election, a
// partition), that user can no longer log in, though its credentials were
// cached for auth_cache_ttl.

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

func TestReviewFailedProofEvictsCachedUserDuringOutage(t *testing.T) {
	up := newUpstreamUsers()
	up.set("alice", "admin", scramCreds(t, "alice", "pw", "salt-one-16bytes", 4096))
	var down atomic.Bool
	c := NewCache(LookupFunc(func(ctx context.Context, user, db string) (Creds, error) {
		if down.Load() {
			return Creds{}, errors.New("no primary")
		}
		return up.Lookup(ctx, user, db)
	}), CacheOptions{PositiveTTL: time.Hour})
	a := New(&Users{}, nil, c)
	alice := Peer{Remote: "192.0.2.1:5000", Local: "127.0.0.1:27017"}
	attacker := Peer{Remote: "203.0.113.9:4000", Local: "127.0.0.1:27017"}
	if err := loginFrom(t, a, alice, SCRAMSHA256, "alice", "admin", "pw"); err != nil {
		t.Fatal(err)
	}
	down.Store(true)
	// Cached: alice logs in while the upstream is down.
	if err := loginFrom(t, a, alice, SCRAMSHA256, "alice", "admin", "pw"); err != nil {
		t.Fatalf("cached user during the outage: %v", err)
	}
	time.Sleep(time.Millisecond)
	// One attempt with a wrong password, by anyone.
	if err := loginFrom(t, a, attacker, SCRAMSHA256, "alice", "admin", "guess"); err == nil {
		t.Fatal("a wrong password logged in")
	}
	if err := loginFrom(t, a, alice, SCRAMSHA256, "alice", "admin", "pw"); err != nil {
		t.Fatalf("after another client's failed attempt, the cached user cannot log in during the outage: %v", err)
	}
}
