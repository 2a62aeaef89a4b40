package auth

// The auth_user lookup cache: users missing from the auth_file are asked
// of the upstream (usersInfo with showCredentials, logged in as auth_user)
// through a Lookup, at most once at a time per user, MaxLookups at once in
// all and MaxLookupsPerPeer at once for one client address, with the
// answers kept for a while, found or not.
//
// The bounds matter because any client can start a lookup before logging
// in, by naming a user nobody has asked about in a saslStart: each costs
// the upstream a connection and a login. Past a bound a new lookup waits
// for a slot, up to the lookup timeout, on the goroutine of the client
// that asked; then the login fails as an unknown user's, and nothing is
// cached.
//
// Slots are taken per waiter: every client asking for a user whose lookup
// is in flight but not yet running waits for slots of its own (its
// address's and a global one), and the first to get them runs the lookup
// for all; the others stop waiting and give theirs back. A lookup running
// so holds one slot of one asker, and the per-address bound holds: each
// waiter holds at most one slot of its own address. A waiter that gets no
// slot (busy, or its own context ends) fails alone; the lookup stays in
// flight for the others, and is dropped only when nobody is left waiting
// for a slot for it. So an address that keeps its own slots full cannot
// fail, nor delay, another address's login of the same user by naming it
// first.
//
// A cached answer is replaced only by a new answer, found or not found: a
// failed proof's second look (get with notBefore) asks again but keeps the
// old entry meanwhile and serves it to other logins, and a failure to ask
// leaves it in place. So a wrong password, tried by anyone, cannot evict a
// real user during an upstream outage.
//
// Found users and users found missing are kept apart, each set bounded by
// MaxEntries and evicting its oldest entry when full, and lookups in flight
// in a third set bounded only by the slots: a flood of random names fills
// the negative set and evicts its own entries, never a found user's, and a
// real user's lookup is always deduplicated.

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Lookup finds a user's stored credentials somewhere other than the
// auth_file. It returns an error wrapping ErrNotFound for a user that does
// not exist; any other error is a failure to ask (not cached).
type Lookup interface {
	Lookup(ctx context.Context, user, db string) (Creds, error)
}

// LookupFunc adapts a function to Lookup.
type LookupFunc func(ctx context.Context, user, db string) (Creds, error)

// Lookup calls f.
func (f LookupFunc) Lookup(ctx context.Context, user, db string) (Creds, error) {
	return f(ctx, user, db)
}

// CacheOptions bound a Cache. Zero fields take the defaults.
type CacheOptions struct {
	// PositiveTTL keeps a found user this long (default
	// DefaultCacheTTL): how long a password changed or a user dropped
	// upstream keeps working at most, unless a failed proof looks the
	// user up again first. SetTTL changes it.
	PositiveTTL time.Duration
	// NegativeTTL keeps a user found missing this long, never longer
	// than PositiveTTL (default: as long). The same TTL for both keeps
	// timing from telling a name that exists upstream from one that does
	// not, once a shorter negative entry would have expired; a user
	// created upstream meanwhile still logs in at its second attempt (the
	// first one's failed proof looks it up again).
	NegativeTTL time.Duration
	// Timeout bounds one lookup (default 5s).
	Timeout time.Duration
	// MaxEntries bounds the found users remembered, and separately the
	// users found missing (default 10000 each).
	MaxEntries int
	// MaxLookups bounds the lookups running at once, for all users
	// (default DefaultMaxLookups). A lookup past it waits for one to end,
	// at most Timeout, then fails with ErrLookupsBusy.
	MaxLookups int
	// MaxLookupsPerPeer bounds the lookups one client address (its IP,
	// the port ignored) starts at once (default DefaultMaxLookupsPerPeer).
	// A lookup past it waits as one past MaxLookups does. Lookups asked
	// without a Peer in their context have no such bound. SetLimits
	// changes it.
	MaxLookupsPerPeer int
}

// DefaultMaxLookups is the default CacheOptions.MaxLookups. A lookup takes
// a few milliseconds (a connection, a login with cached keys, usersInfo):
// 16 at once serve thousands of distinct users' first logins a second,
// e.g. after a restart, while a client naming random users holds at most
// 16 upstream connections.
const DefaultMaxLookups = 16

// DefaultMaxLookupsPerPeer is the default CacheOptions.MaxLookupsPerPeer:
// an application host logging in many users at once after a restart still
// runs four lookups at a time, while one address naming random users
// holds at most a quarter of the DefaultMaxLookups slots.
const DefaultMaxLookupsPerPeer = 4

// DefaultCacheTTL is the default CacheOptions.PositiveTTL (auth_cache_ttl).
const DefaultCacheTTL = 30 * time.Second

// The results a Cache reports to its Observer, one per lookup asked for.
const (
	LookupFound    = "found"     // the user exists upstream
	LookupNotFound = "not_found" // the user does not
	LookupError    = "error"     // the upstream could not be asked
	LookupBusy     = "busy"      // no slot within the timeout (MaxLookups)
	LookupPeerBusy = "peer_busy" // no slot for the client address (MaxLookupsPerPeer)
)

// lookupKey names a user for the cache.
type lookupKey struct{ user, db string }

// Cache is a Lookup's answers, shared by every client connection.
type Cache struct {
	l    Lookup
	opts CacheOptions
	now  func() time.Time
	// slots holds a token per lookup running (MaxLookups).
	slots chan struct{}
	// ttl and perPeer are PositiveTTL and MaxLookupsPerPeer as SetTTL and
	// SetLimits last set them.
	ttl     atomic.Int64
	perPeer atomic.Int64
	obs     atomic.Pointer[observerBox]
	// onFound is told of every user a lookup found (the Authenticator's
	// shapes); set before the cache is used.
	onFound func(Creds)

	mu sync.Mutex
	// inflight are the lookups running or waiting for a slot, found and
	// missing the answers kept; all guarded by mu.
	inflight map[lookupKey]*cacheEntry
	found    boundedSet
	missing  boundedSet
	// peers are the per-address slots of the addresses with a lookup
	// running or waiting. Guarded by mu (the map and refs).
	peers map[string]*peerSlots
}

type cacheEntry struct {
	key  lookupKey
	done chan struct{} // closed once creds/err are set
	// started is closed once a waiter has taken the slots and the lookup
	// runs; running says so and takers counts the waiters still waiting
	// for slots for it, both guarded by Cache.mu.
	started chan struct{}
	running bool
	takers  int
	creds   Creds
	err     error
	fetched time.Time // when the answer came
	expires time.Time
}

// peerSlots are one client address's lookup slots.
type peerSlots struct {
	ch   chan struct{}
	refs int // lookups holding or waiting for a slot; guarded by Cache.mu
}

// boundedSet is a bounded map of answers evicting its oldest entry when
// full. Not safe for concurrent use (Cache.mu guards it).
type boundedSet struct {
	max   int
	m     map[lookupKey]*list.Element // of *cacheEntry
	order list.List                   // oldest first
}

func (b *boundedSet) get(k lookupKey) *cacheEntry {
	if el, ok := b.m[k]; ok {
		return el.Value.(*cacheEntry)
	}
	return nil
}

func (b *boundedSet) put(e *cacheEntry) {
	b.del(e.key)
	for b.order.Len() >= b.max {
		old := b.order.Front()
		delete(b.m, old.Value.(*cacheEntry).key)
		b.order.Remove(old)
	}
	b.m[e.key] = b.order.PushBack(e)
}

func (b *boundedSet) del(k lookupKey) {
	if el, ok := b.m[k]; ok {
		b.order.Remove(el)
		delete(b.m, k)
	}
}

// NewCache returns a cache in front of l.
func NewCache(l Lookup, o CacheOptions) *Cache {
	if o.PositiveTTL <= 0 {
		o.PositiveTTL = DefaultCacheTTL
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = 10000
	}
	if o.MaxLookups <= 0 {
		o.MaxLookups = DefaultMaxLookups
	}
	if o.MaxLookupsPerPeer <= 0 {
		o.MaxLookupsPerPeer = DefaultMaxLookupsPerPeer
	}
	c := &Cache{l: l, opts: o, now: time.Now, slots: make(chan struct{}, o.MaxLookups),
		inflight: map[lookupKey]*cacheEntry{},
		found:    boundedSet{max: o.MaxEntries, m: map[lookupKey]*list.Element{}},
		missing:  boundedSet{max: o.MaxEntries, m: map[lookupKey]*list.Element{}},
		peers:    map[string]*peerSlots{},
	}
	c.ttl.Store(int64(o.PositiveTTL))
	c.perPeer.Store(int64(o.MaxLookupsPerPeer))
	return c
}

// SetTTL changes how long found users are kept (auth_cache_ttl, on
// reload); users found missing are kept as long, or NegativeTTL if set
// and shorter.
// Entries cached already keep their expiry.
func (c *Cache) SetTTL(d time.Duration) {
	if d > 0 {
		c.ttl.Store(int64(d))
	}
}

// TTL returns how long found users are kept now (SetTTL).
func (c *Cache) TTL() time.Duration { return time.Duration(c.ttl.Load()) }

// MaxLookupsPerPeer returns the per-address bound now (SetLimits).
func (c *Cache) MaxLookupsPerPeer() int { return int(c.perPeer.Load()) }

// MaxLookups returns the bound on lookups running at once (fixed).
func (c *Cache) MaxLookups() int { return cap(c.slots) }

// SetLimits changes MaxLookupsPerPeer (auth_lookups_per_peer, on
// reload), for addresses that have no lookup running now.
func (c *Cache) SetLimits(perPeer int) {
	if perPeer > 0 {
		c.perPeer.Store(int64(perPeer))
	}
}

// Get returns user@db's credentials, asking the Lookup unless a fresh
// answer is cached or a lookup for the same user is already in flight (then
// it waits for that one). ctx bounds the wait, not the lookup, which runs
// for every waiter under the cache's own timeout; its Peer (WithPeer) is
// who the lookup counts against. With MaxLookups running, or
// MaxLookupsPerPeer for the peer, a lookup not yet running waits for a
// slot of ctx's own (see take), however many others wait for it too; an
// error wrapping ErrLookupsBusy says this caller got none.
func (c *Cache) Get(ctx context.Context, user, db string) (Creds, error) {
	e, err := c.get(ctx, lookupKey{user, db}, time.Time{})
	if err != nil {
		return Creds{}, err
	}
	return e.creds, e.err
}

// get returns the entry of key once it is done. A cached answer fetched
// before notBefore is not used (a failed proof's second look): the user is
// asked again, the old answer kept until a new one replaces it; the zero
// notBefore takes any fresh one.
func (c *Cache) get(ctx context.Context, key lookupKey, notBefore time.Time) (*cacheEntry, error) {
	c.mu.Lock()
	if e := c.cached(key); e != nil && !e.fetched.Before(notBefore) {
		c.mu.Unlock()
		return e, nil
	}
	e := c.inflight[key]
	if e == nil {
		e = &cacheEntry{key: key, done: make(chan struct{}), started: make(chan struct{})}
		c.inflight[key] = e
	}
	take := !e.running
	if take {
		e.takers++
	}
	c.mu.Unlock()
	if take {
		if err := c.take(ctx, e); err != nil {
			return nil, err
		}
	}
	select {
	case <-e.done:
		return e, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// cached returns key's fresh answer, nil for none; an expired one is
// dropped. c.mu must be held.
func (c *Cache) cached(key lookupKey) *cacheEntry {
	e := c.found.get(key)
	if e == nil {
		e = c.missing.get(key)
	}
	if e != nil && !c.now().Before(e.expires) {
		c.found.del(key)
		c.missing.del(key)
		return nil
	}
	return e
}

// take waits for slots of ctx's own (acquire) to run e's lookup, and runs
// it unless another waiter did first. An error is this waiter's alone (no
// slot, or ctx ended): e stays in flight for the waiters still waiting for
// slots, and is dropped once none is left, so that the next login asks
// again.
func (c *Cache) take(ctx context.Context, e *cacheEntry) error {
	// Waiting for a slot here, not in run, takes no goroutine per
	// waiting lookup: only the asking client's own.
	peer, err := c.acquire(ctx, e.started)
	c.mu.Lock()
	e.takers--
	switch {
	case err == nil && !e.running:
		e.running = true
		close(e.started)
		c.mu.Unlock()
		go c.run(e, peer)
		return nil
	case err == nil: // another waiter started it meanwhile
		c.mu.Unlock()
		<-c.slots
		c.releasePeer(peer)
		return nil
	case errors.Is(err, errStarted):
		c.mu.Unlock()
		return nil
	}
	if !e.running && e.takers == 0 && c.inflight[e.key] == e {
		// Every waiter has given up: nobody waits for e.done.
		delete(c.inflight, e.key)
	}
	c.mu.Unlock()
	return err
}

// errStarted tells a waiter in acquire that another waiter took the slots
// for the same lookup: it needs none.
var errStarted = errors.New("auth: lookup started by another waiter")

// peerOf is the address a lookup counts against: the IP of ctx's Peer's
// remote address (any port), for IPv6 its /64 (one host is usually given
// a whole /64, and could otherwise rotate addresses within it to escape
// the bound), its whole address when not IP:port (a Unix socket), ""
// without a Peer.
func peerOf(ctx context.Context) string {
	p, ok := PeerFrom(ctx)
	if !ok {
		return ""
	}
	host, _, err := net.SplitHostPort(p.Remote)
	if err != nil {
		return p.Remote
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	if a = a.Unmap(); a.Is6() {
		pfx, _ := a.WithZone("").Prefix(64)
		return pfx.String()
	}
	return a.String()
}

// acquire takes the peer's slot, then a lookup slot, waiting for them at
// most the lookup timeout in all, as long as ctx allows, and until started
// is closed (errStarted: another waiter's slots run the lookup). It
// returns the peer whose slot it holds ("" for none).
func (c *Cache) acquire(ctx context.Context, started <-chan struct{}) (string, error) {
	t := time.NewTimer(c.opts.Timeout)
	defer t.Stop()
	peer := peerOf(ctx)
	if peer != "" {
		c.mu.Lock()
		ps := c.peers[peer]
		if ps == nil {
			ps = &peerSlots{ch: make(chan struct{}, c.perPeer.Load())}
			c.peers[peer] = ps
		}
		ps.refs++
		c.mu.Unlock()
		var err error
		select {
		case ps.ch <- struct{}{}:
		case <-t.C:
			err = fmt.Errorf("%w (%d for one client address, for %v)", ErrLookupsBusy, cap(ps.ch), c.opts.Timeout)
			c.observe(LookupPeerBusy)
		case <-ctx.Done():
			err = ctx.Err()
		case <-started:
			err = errStarted
		}
		if err != nil {
			c.unrefPeer(peer, ps)
			return "", err
		}
	}
	select {
	case c.slots <- struct{}{}:
		return peer, nil
	case <-t.C:
		c.releasePeer(peer)
		c.observe(LookupBusy)
		return "", fmt.Errorf("%w (%d, for %v)", ErrLookupsBusy, cap(c.slots), c.opts.Timeout)
	case <-ctx.Done():
		c.releasePeer(peer)
		return "", ctx.Err()
	case <-started:
		c.releasePeer(peer)
		return "", errStarted
	}
}

// releasePeer gives back the peer's slot ("" holds none).
func (c *Cache) releasePeer(peer string) {
	if peer == "" {
		return
	}
	c.mu.Lock()
	ps := c.peers[peer]
	c.mu.Unlock()
	<-ps.ch
	c.unrefPeer(peer, ps)
}

// unrefPeer drops one use of ps, and ps itself once unused.
func (c *Cache) unrefPeer(peer string, ps *peerSlots) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ps.refs--; ps.refs == 0 {
		delete(c.peers, peer)
	}
}

// run performs one lookup in the slots acquire took, and publishes its
// answer.
func (c *Cache) run(e *cacheEntry, peer string) {
	defer c.releasePeer(peer)
	defer func() { <-c.slots }()
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.Timeout)
	defer cancel()
	creds, err := c.l.Lookup(ctx, e.key.user, e.key.db)
	switch {
	case err == nil:
		c.observe(LookupFound)
		if c.onFound != nil {
			c.onFound(creds)
		}
	case errors.Is(err, ErrNotFound):
		c.observe(LookupNotFound)
	default:
		c.observe(LookupError)
	}
	c.publish(e, creds, err)
}

// publish records a lookup's answer and wakes its waiters. A found or
// not-found answer replaces the user's cached one; a failure to ask is not
// kept and leaves the cached one in place.
func (c *Cache) publish(e *cacheEntry, creds Creds, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inflight[e.key] == e {
		delete(c.inflight, e.key)
	}
	now := c.now()
	e.creds, e.err, e.fetched = creds, err, now
	ttl := time.Duration(c.ttl.Load())
	switch {
	case err == nil:
		e.expires = now.Add(ttl)
		c.missing.del(e.key)
		c.found.put(e)
	case errors.Is(err, ErrNotFound):
		neg := ttl
		if c.opts.NegativeTTL > 0 {
			neg = min(c.opts.NegativeTTL, ttl)
		}
		e.expires = now.Add(neg)
		c.found.del(e.key)
		c.missing.put(e)
	}
	// A failure to ask is not an answer: the next login asks again.
	close(e.done)
}

// Forget drops user@db's cached answer, so that the next login asks the
// Lookup again. An upstream that refuses credentials the cache gave (code
// 18 on a pass-through login) means they changed there: the entry is
// stale. A lookup in flight is left to finish.
func (c *Cache) Forget(user, db string) {
	key := lookupKey{user, db}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.found.del(key)
	c.missing.del(key)
}

// observerBox holds an Observer for an atomic.Pointer.
type observerBox struct{ o Observer }

// setObserver makes the cache report its lookups to o (nil: to nobody).
func (c *Cache) setObserver(o Observer) {
	if o == nil {
		c.obs.Store(nil)
		return
	}
	c.obs.Store(&observerBox{o})
}

func (c *Cache) observe(result string) {
	if b := c.obs.Load(); b != nil {
		b.o.AuthLookup(result)
	}
}
