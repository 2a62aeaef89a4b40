package auth

// The auth_user lookup cache: users missing from the auth_file are asked
// of the upstream (usersInfo with showCredentials, logged in as auth_user)
// through a Lookup, at most once at a time per user and MaxLookups at once
// in all, with the answers kept for a while, found or not.
//
// The bound on lookups at once matters because any client can start one
// before logging in, by naming a user nobody has asked about (a hello's
// saslSupportedMechs, a saslStart): each costs the upstream a connection and
// a login. Past the bound a new lookup waits for a slot, up to the lookup
// timeout, on the goroutine of the client that asked; then the login fails
// as an unknown user's, and nothing is cached.

import (
	"context"
	"errors"
	"fmt"
	"sync"
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
	// PositiveTTL keeps a found user this long (default 5m).
	PositiveTTL time.Duration
	// NegativeTTL keeps a user found missing this long (default 30s).
	NegativeTTL time.Duration
	// Timeout bounds one lookup (default 5s).
	Timeout time.Duration
	// MaxEntries bounds the users remembered (default 10000).
	MaxEntries int
	// MaxLookups bounds the lookups running at once, for all users
	// (default DefaultMaxLookups). A lookup past it waits for one to end,
	// at most Timeout, then fails with ErrLookupsBusy.
	MaxLookups int
}

// DefaultMaxLookups is the default CacheOptions.MaxLookups. A lookup takes
// a few milliseconds (a connection, a login with cached keys, usersInfo):
// 16 at once serve thousands of distinct users' first logins a second,
// e.g. after a restart, while a client naming random users holds at most
// 16 upstream connections.
const DefaultMaxLookups = 16

// Cache is a Lookup's answers, shared by every client connection.
type Cache struct {
	l    Lookup
	opts CacheOptions
	now  func() time.Time
	// slots holds a token per lookup running (MaxLookups).
	slots chan struct{}

	mu      sync.Mutex
	entries map[UserID]*cacheEntry
}

type cacheEntry struct {
	done    chan struct{} // closed once creds/err are set
	creds   Creds
	err     error
	expires time.Time
}

// NewCache returns a cache in front of l.
func NewCache(l Lookup, o CacheOptions) *Cache {
	if o.PositiveTTL <= 0 {
		o.PositiveTTL = 5 * time.Minute
	}
	if o.NegativeTTL <= 0 {
		o.NegativeTTL = 30 * time.Second
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
	return &Cache{l: l, opts: o, now: time.Now, entries: map[UserID]*cacheEntry{},
		slots: make(chan struct{}, o.MaxLookups)}
}

// Get returns user@db's credentials, asking the Lookup unless a fresh
// answer is cached or a lookup for the same user is already in flight (then
// it waits for that one). ctx bounds the wait, not the lookup, which runs
// for every waiter under the cache's own timeout. With MaxLookups running,
// a new lookup first waits for a slot (see acquire); an error wrapping
// ErrLookupsBusy says it got none.
func (c *Cache) Get(ctx context.Context, user, db string) (Creds, error) {
	key := UserID{User: user, DB: db}
	c.mu.Lock()
	e := c.entries[key]
	fresh := e != nil
	if fresh {
		select {
		case <-e.done:
			fresh = c.now().Before(e.expires)
		default: // in flight
		}
	}
	if !fresh {
		e = &cacheEntry{done: make(chan struct{})}
		c.store(key, e)
		c.mu.Unlock()
		// Waiting for a slot here, not in run, takes no goroutine per
		// waiting lookup: only the asking client's own.
		if err := c.acquire(ctx); err != nil {
			c.publish(key, e, Creds{}, err)
		} else {
			go c.run(key, e, user, db)
		}
	} else {
		c.mu.Unlock()
	}
	select {
	case <-e.done:
		return e.creds, e.err
	case <-ctx.Done():
		return Creds{}, ctx.Err()
	}
}

// store records e, making room by dropping expired entries; when the cache
// is full of fresh ones, e is not remembered (its waiters still get it).
// Called with mu held.
func (c *Cache) store(key UserID, e *cacheEntry) {
	if _, ok := c.entries[key]; !ok && len(c.entries) >= c.opts.MaxEntries {
		now := c.now()
		for k, old := range c.entries {
			select {
			case <-old.done:
				if !now.Before(old.expires) {
					delete(c.entries, k)
				}
			default:
			}
		}
		if len(c.entries) >= c.opts.MaxEntries {
			return
		}
	}
	c.entries[key] = e
}

// acquire takes a lookup slot, waiting for one at most the lookup
// timeout, and as long as ctx allows.
func (c *Cache) acquire(ctx context.Context) error {
	select {
	case c.slots <- struct{}{}:
		return nil
	default:
	}
	t := time.NewTimer(c.opts.Timeout)
	defer t.Stop()
	select {
	case c.slots <- struct{}{}:
		return nil
	case <-t.C:
		return fmt.Errorf("%w (%d, for %v)", ErrLookupsBusy, cap(c.slots), c.opts.Timeout)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run performs one lookup in a slot acquire took, and publishes its
// answer.
func (c *Cache) run(key UserID, e *cacheEntry, user, db string) {
	defer func() { <-c.slots }()
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.Timeout)
	defer cancel()
	creds, err := c.l.Lookup(ctx, user, db)
	c.publish(key, e, creds, err)
}

// publish records a lookup's answer (cached unless a failure to ask) and
// wakes its waiters.
func (c *Cache) publish(key UserID, e *cacheEntry, creds Creds, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e.creds, e.err = creds, err
	switch {
	case err == nil:
		e.expires = c.now().Add(c.opts.PositiveTTL)
	case errors.Is(err, ErrNotFound):
		e.expires = c.now().Add(c.opts.NegativeTTL)
	default:
		// A failure to ask is not an answer: the next login asks again.
		if c.entries[key] == e {
			delete(c.entries, key)
		}
	}
	close(e.done)
}

// Forget drops user@db's cached answer, so that the next login asks the
// Lookup again. An upstream that refuses credentials the cache gave (code
// 18 on a pass-through login) means they changed there: the entry is
// stale. A lookup in flight is left to finish.
func (c *Cache) Forget(user, db string) {
	key := UserID{User: user, DB: db}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[key]; e != nil {
		select {
		case <-e.done:
			delete(c.entries, key)
		default:
		}
	}
}
