package auth

// The auth_user lookup cache: users missing from the auth_file are asked
// of the upstream (usersInfo with showCredentials, logged in as auth_user)
// through a Lookup, at most once at a time per user, with the answers kept
// for a while, found or not.

import (
	"context"
	"errors"
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
}

// Cache is a Lookup's answers, shared by every client connection.
type Cache struct {
	l    Lookup
	opts CacheOptions
	now  func() time.Time

	mu      sync.Mutex
	entries map[string]*cacheEntry
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
	return &Cache{l: l, opts: o, now: time.Now, entries: map[string]*cacheEntry{}}
}

// Get returns user@db's credentials, asking the Lookup unless a fresh
// answer is cached or a lookup for the same user is already in flight (then
// it waits for that one). ctx bounds the wait, not the lookup, which runs
// for every waiter under the cache's own timeout.
func (c *Cache) Get(ctx context.Context, user, db string) (Creds, error) {
	key := UserKey(user, db)
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
		go c.run(key, e, user, db)
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
func (c *Cache) store(key string, e *cacheEntry) {
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

// run performs one lookup and publishes its answer.
func (c *Cache) run(key string, e *cacheEntry, user, db string) {
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.Timeout)
	defer cancel()
	creds, err := c.l.Lookup(ctx, user, db)
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
	key := UserKey(user, db)
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
