package auth

// A flood of lookups (issue 27, item 9): names nobody has do not crowd out
// a real user's cached answer or its deduplication, and one client
// address runs at most MaxLookupsPerPeer lookups at once.

import (
	"context"
	"errors"
	"fmt"
	"strings"
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

// A lookup in flight is shared by every client asking for the user, but
// each waits for slots of its own: an address that keeps its own slots
// full names a real user first, and another address's login of that user
// neither fails nor waits for the first address's slots; a first asker
// whose context ends while it waits for a slot does not fail the others
// either. The user is still looked up once.
func TestSharedLookupNotFailedByAnotherPeersBusySlots(t *testing.T) {
	const timeout = 2 * time.Second
	var running, users atomic.Int32
	release := make(chan struct{})
	c := NewCache(LookupFunc(func(ctx context.Context, user, db string) (Creds, error) {
		running.Add(1)
		defer running.Add(-1)
		if strings.HasPrefix(user, "slow") {
			// Held past the lookup timeout: stands for a queue of lookups
			// that keeps an address's slots full without a break.
			<-release
			return Creds{}, ErrNotFound
		}
		users.Add(1)
		return Creds{}, nil // alice and bob exist
	}), CacheOptions{MaxLookups: 3, MaxLookupsPerPeer: 2, Timeout: timeout})
	obs := newCountingObserver()
	c.setObserver(obs)
	attacker := WithPeer(context.Background(), Peer{Remote: "203.0.113.9:4000"})
	victim := WithPeer(context.Background(), Peer{Remote: "192.0.2.1:5000"})
	stop := sync.OnceFunc(func() { close(release) })
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(3 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal(what)
			}
		}
	}
	inflight := func(user string) func() bool {
		return func() bool {
			c.mu.Lock()
			defer c.mu.Unlock()
			return c.inflight[lookupKey{user, "admin"}] != nil
		}
	}
	for _, n := range []string{"slow1", "slow2"} {
		wg.Go(func() { _, _ = c.Get(attacker, n, "admin") })
	}
	waitFor("the attacker's lookups did not start", func() bool { return running.Load() == 2 })

	// The attacker names alice: her lookup goes in flight, waiting for a
	// slot of the attacker's address. The victim, from another address,
	// logs in as alice at once, and the attacker's wait gets her answer.
	attackerErr := make(chan error, 1)
	wg.Go(func() {
		_, err := c.Get(attacker, "alice", "admin")
		attackerErr <- err
	})
	waitFor("alice's lookup not in flight", inflight("alice"))
	start := time.Now()
	_, err := c.Get(victim, "alice", "admin")
	if d := time.Since(start); err != nil || d > timeout/2 {
		t.Errorf("another address's login of a real user, behind the busy attacker's: %v after %v (busy: %v)",
			err, d, errors.Is(err, ErrLookupsBusy))
	}
	select {
	case err := <-attackerErr:
		if err != nil {
			t.Errorf("the attacker's wait for alice: %v, want her answer", err)
		}
	case <-time.After(2 * timeout):
		t.Error("the attacker's wait for alice did not end")
	}

	// The global slots full (a third address's lookup takes the last), a
	// first asker of bob gives up while it waits for a slot: the victim,
	// waiting too, gets bob's answer once a slot frees.
	wg.Go(func() { _, _ = c.Get(WithPeer(context.Background(), Peer{Remote: "198.51.100.8:1"}), "slow3", "admin") })
	waitFor("the third address's lookup did not start", func() bool { return running.Load() == 3 })
	first, cancel := context.WithCancel(WithPeer(context.Background(), Peer{Remote: "198.51.100.7:1"}))
	defer cancel()
	firstErr := make(chan error, 1)
	wg.Go(func() {
		_, err := c.Get(first, "bob", "admin")
		firstErr <- err
	})
	waitFor("bob's lookup not in flight", inflight("bob"))
	victimErr := make(chan error, 1)
	wg.Go(func() {
		_, err := c.Get(victim, "bob", "admin")
		victimErr <- err
	})
	time.Sleep(100 * time.Millisecond) // the victim waits for a slot too
	cancel()
	if err := <-firstErr; !errors.Is(err, context.Canceled) {
		t.Errorf("the first asker, cancelled: %v", err)
	}
	stop()
	if err := <-victimErr; err != nil {
		t.Errorf("the victim's login of bob after the first asker gave up: %v", err)
	}
	wg.Wait()
	if n := users.Load(); n != 2 {
		t.Errorf("%d lookups of alice and bob, want 2 (one each)", n)
	}
	if n := obs.looked(LookupBusy) + obs.looked(LookupPeerBusy); n != 0 {
		t.Errorf("%d lookups busy, want 0: %v", n, obs.lookups)
	}
	waitFor("lookups or slots left behind", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.inflight) == 0 && len(c.peers) == 0 && len(c.slots) == 0
	})
}

// TestPeerOfKeysIPv6ByItsSlash64: one IPv6 host, which usually has a whole
// /64, counts as one address whatever address of it connects; IPv4 (and
// IPv4-mapped IPv6) by the address.
func TestPeerOfKeysIPv6ByItsSlash64(t *testing.T) {
	key := func(remote string) string {
		return peerOf(WithPeer(context.Background(), Peer{Remote: remote}))
	}
	if a, b := key("[2001:db8:1:2::1]:5000"), key("[2001:db8:1:2:ffff::9]:6000"); a != b || a != "2001:db8:1:2::/64" {
		t.Errorf("one /64: %q and %q", a, b)
	}
	if a, b := key("[2001:db8:1:2::1]:5000"), key("[2001:db8:1:3::1]:5000"); a == b {
		t.Errorf("two /64s share %q", a)
	}
	if a, b := key("192.0.2.1:1"), key("[::ffff:192.0.2.1]:2"); a != "192.0.2.1" || b != "192.0.2.1" {
		t.Errorf("IPv4: %q, mapped: %q", a, b)
	}
	if a, b := key("192.0.2.1:1"), key("192.0.2.2:1"); a == b {
		t.Errorf("two IPv4 addresses share %q", a)
	}
	if k := key("/run/mb.sock"); k != "/run/mb.sock" {
		t.Errorf("unix socket: %q", k)
	}
}
