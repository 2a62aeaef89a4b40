package topology

// User pools: one pool per (server, user), for SCRAM pass-through, where
// mongobouncer logs in upstream as each client's own user. A server's user
// pools follow its main pool through every state change SDAM makes (ready
// when the server is usable, cleared when it is marked Unknown, closed when
// it leaves), so selection and the server's monitor serve them all. What is
// the user's alone stays with the user's pool: a login the upstream refuses
// (a changed password, a salt that differs) pauses that pool only, until
// the server's next successful check, and never marks the server Unknown
// for the other users. Errors that are about the server (a refused dial, a
// broken connection) go to the server's rules as the main pool's do.
//
// userPools.mu (usersMu) has its place in the lock order on Topology.

import (
	"context"
	"errors"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/auth"
	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// ErrNoUserPools is returned by UserPool when the topology was built
// without Options.UserDialer.
var ErrNoUserPools = errors.New("topology: user pools are not enabled (no UserDialer)")

// userPool is one user's pool on one server.
type userPool struct {
	user auth.UserID
	pool *pool.Pool
	// used is when UserPool last handed the pool out (Unix nanoseconds),
	// for the idle sweep.
	used atomic.Int64
	// warnedGen is the pool generation whose login failure was last
	// logged at warn, so that a failure is logged once per generation.
	warnedGen atomic.Uint64
}

// userPools is a server's set of user pools.
type userPools struct {
	mu sync.Mutex // usersMu: guards m; after Topology.mu, before a pool's lock (see Topology)
	m  map[auth.UserID]*userPool
}

// UserPool returns the server's pool for user (a name and its database:
// never a "name@db" string, which two users can share),
// creating it on first use with a connector from Options.UserDialer that
// logs in with a. The pool is ready when the server's main pool is. Its
// size is capped by Options.MaxUserConnections; it closes once unused for
// Options.UserPoolIdleTimeout. a is used only when the pool is created:
// callers that want to change the secret give an Authenticator that reads
// it when a connection logs in.
func (s *Server) UserPool(user auth.UserID, a upstream.Authenticator) (*pool.Pool, error) {
	now := time.Now().UnixNano()
	s.users.mu.Lock()
	if up := s.users.m[user]; up != nil {
		up.used.Store(now)
		s.users.mu.Unlock()
		return up.pool, nil
	}
	s.users.mu.Unlock()

	t := s.topo
	if t.opts.UserDialer == nil {
		return nil, ErrNoUserPools
	}
	// Under the topology's lock, so that the new pool's state matches the
	// server's: a clear or a ready of the server either happened before
	// (and the main pool shows it) or happens after (and sees this pool).
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || t.servers[s.addr] != s {
		return nil, &pool.PoolClosedError{Address: s.addr}
	}
	s.users.mu.Lock()
	defer s.users.mu.Unlock()
	if up := s.users.m[user]; up != nil {
		up.used.Store(now)
		return up.pool, nil
	}
	up := &userPool{user: user}
	up.used.Store(now)
	po := t.opts.Pool
	po.Share = s.share // the server's budget, with its main pool and the other users'
	po.MinPoolSize = 0
	if n := t.opts.MaxUserConnections; n > 0 && (po.MaxPoolSize == 0 || n < po.MaxPoolSize) {
		po.MaxPoolSize = n
	}
	po.Monitor = nil
	if t.opts.UserPoolMonitor != nil {
		po.Monitor = t.opts.UserPoolMonitor()
	}
	if po.Logger == nil {
		po.Logger = t.opts.Logger
	}
	po.OnBackgroundError = func(err error) { s.handleUserError(up, err, nil) }
	p, err := pool.New(s.addr, t.opts.UserDialer(a), po)
	if err != nil {
		return nil, err
	}
	up.pool = p
	if s.pool.Stats().State == pool.StateReady {
		_ = p.Ready() // a new pool is not closed
	}
	if s.users.m == nil {
		s.users.m = make(map[auth.UserID]*userPool)
	}
	s.users.m[user] = up
	t.ensureSweeperLocked()
	return p, nil
}

// RetryUserPool readies user's pool if a refused login paused it while
// the server is usable: the user's secret has changed (a new login), so
// the next try need not wait for the server's next check.
func (s *Server) RetryUserPool(user auth.UserID) {
	t := s.topo
	t.mu.Lock()
	defer t.mu.Unlock()
	s.users.mu.Lock()
	defer s.users.mu.Unlock()
	if up := s.users.m[user]; up != nil && s.pool.Stats().State == pool.StateReady {
		_ = up.pool.Ready()
	}
}

// UserPoolStats is one user pool's snapshot, for the admin commands.
type UserPoolStats struct {
	User  auth.UserID
	Stats pool.Stats
}

// UserPools returns a snapshot of the server's user pools, by user.
func (s *Server) UserPools() []UserPoolStats {
	s.users.mu.Lock()
	ups := make([]*userPool, 0, len(s.users.m))
	for _, up := range s.users.m {
		ups = append(ups, up)
	}
	s.users.mu.Unlock()
	out := make([]UserPoolStats, 0, len(ups))
	for _, up := range ups {
		out = append(out, UserPoolStats{User: up.user, Stats: up.pool.Stats()})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].User.User != out[j].User.User {
			return out[i].User.User < out[j].User.User
		}
		return out[i].User.DB < out[j].User.DB
	})
	return out
}

// eachUserPool calls f for every user pool of s, with usersMu held: f must
// not close a pool or handle an error.
func (s *Server) eachUserPool(f func(*pool.Pool)) {
	s.users.mu.Lock()
	for _, up := range s.users.m {
		f(up.pool)
	}
	s.users.mu.Unlock()
}

// readyPoolsLocked readies the main pool and every user pool, as a
// successful check does: a user pool paused by a refused login gets its
// next try now. Called with the topology's mu held.
func (s *Server) readyPoolsLocked() error {
	if err := s.pool.Ready(); err != nil {
		return err
	}
	s.eachUserPool(func(p *pool.Pool) { _ = p.Ready() })
	return nil
}

// clearPoolsLocked clears every pool of s with cause. Called with the
// topology's mu held.
func (s *Server) clearPoolsLocked(cause error, interrupt bool) {
	s.pool.ClearWithError(cause, interrupt)
	s.eachUserPool(func(p *pool.Pool) { p.ClearWithError(cause, interrupt) })
}

// closePools closes every pool of s: it has left the topology, or the
// topology is closing. Called without the topology's mu.
func (s *Server) closePools() {
	s.pool.Close()
	s.users.mu.Lock()
	ups := s.users.m
	s.users.m = nil
	s.users.mu.Unlock()
	for _, up := range ups {
		up.pool.Close()
	}
}

// SetPoolLimits changes the limits of the server's pools live (a reload):
// the main pool gets l, each user pool l with its MaxPoolSize capped by
// maxUser (0: no cap of its own). MinPoolSize applies to the main pool
// only.
func (s *Server) SetPoolLimits(l pool.Limits, maxUser int) error {
	if err := s.pool.SetLimits(l); err != nil {
		return err
	}
	ul := l
	ul.MinPoolSize = 0
	if maxUser > 0 && (ul.MaxPoolSize == 0 || maxUser < ul.MaxPoolSize) {
		ul.MaxPoolSize = maxUser
	}
	var err error
	s.eachUserPool(func(p *pool.Pool) {
		var closed *pool.PoolClosedError
		if e := p.SetLimits(ul); e != nil && !errors.As(e, &closed) && err == nil {
			err = e
		}
	})
	return err
}

// HandlePoolError is HandleError for an error seen on a user pool's
// connection or checkout: p is the pool the connection came from (the
// server's main pool goes to HandleError).
func (s *Server) HandlePoolError(p *pool.Pool, err error, c *pool.Conn) {
	if p == s.pool {
		s.HandleError(err, c)
		return
	}
	s.users.mu.Lock()
	var found *userPool
	for _, up := range s.users.m {
		if up.pool == p {
			found = up
			break
		}
	}
	s.users.mu.Unlock()
	if found != nil {
		s.handleUserError(found, err, c)
	}
}

// handleUserError applies the rules to an error of up's: a refused login
// pauses up alone; anything else the server's rules judge, once it is
// known not to be stale for up.
func (s *Server) handleUserError(up *userPool, err error, c *pool.Conn) {
	t := s.topo
	if err == nil || t.isClosed() || errors.Is(err, context.Canceled) {
		return
	}
	gen, known := errorGeneration(err, c)
	st := up.pool.Stats()
	if known && gen < st.Generation {
		return // from before the pool's last clear
	}
	var authErr *upstream.AuthError
	if errors.As(err, &authErr) {
		// The user's own failure: pause this pool until the server's
		// next successful check readies it (readyPoolsLocked), so that
		// logins follow the checks, not the clients.
		up.pool.ClearWithError(err, false)
		if up.warnedGen.Swap(st.Generation+1) != st.Generation+1 {
			t.log.Warn("pass-through login to the upstream failed; this user's pool is paused until the server's next successful check",
				slog.String("topology", t.name), slog.String("address", s.addr), slog.String("user", up.user.String()),
				slog.String("mechanism", authErr.Mechanism), slog.Any("error", err))
		}
		return
	}
	// Not stale for this pool: the server's rules judge it as current.
	s.handleError(err, c, true)
}

// errorGeneration returns the pool generation an error belongs to: its
// connection's, or the failed establishment's.
func errorGeneration(err error, c *pool.Conn) (uint64, bool) {
	if c != nil {
		return c.Generation(), true
	}
	var connErr *pool.ConnectionError
	if errors.As(err, &connErr) {
		return connErr.Generation, true
	}
	return 0, false
}

// ensureSweeperLocked starts the goroutine that closes idle user pools,
// once, when the first user pool is made. Called with mu held.
func (t *Topology) ensureSweeperLocked() {
	if t.sweeping || t.opts.UserPoolIdleTimeout <= 0 {
		return
	}
	t.sweeping = true
	every := t.opts.UserPoolIdleTimeout / 4
	every = max(min(every, 30*time.Second), 10*time.Millisecond)
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-t.ctx.Done():
				return
			case <-tick.C:
				t.sweepUserPools(time.Now())
			}
		}
	}()
}

// sweepUserPools closes the user pools that nobody has asked for during
// UserPoolIdleTimeout and that hold no connection in use, being made or
// waited for. Their idle connections close with them.
func (t *Topology) sweepUserPools(now time.Time) {
	limit := now.Add(-t.opts.UserPoolIdleTimeout).UnixNano()
	var idle []*userPool
	for _, s := range t.Servers() {
		s.users.mu.Lock()
		for key, up := range s.users.m {
			if up.used.Load() > limit {
				continue
			}
			c := up.pool.Stats().Counts
			if c.InUse > 0 || c.Pending > 0 || c.Waiters > 0 {
				continue
			}
			delete(s.users.m, key)
			idle = append(idle, up)
		}
		s.users.mu.Unlock()
	}
	for _, up := range idle {
		up.pool.Close()
		t.log.Debug("closed an idle user pool", slog.String("topology", t.name),
			slog.String("address", up.pool.Address()), slog.String("user", up.user.String()))
	}
}
