package pool

// The pool's CMAP state and the calls that move it: paused at first, Ready,
// Clear (back to paused, a new generation, optionally interrupting what is
// in use), ClearService (load-balanced: one service's generation only), and
// Close, which is final. Each takes Pool.mu (pool.go states its rules),
// and none waits for a socket to close.

import "go.mongodb.org/mongo-driver/v2/bson"

// State is a pool's CMAP state.
type State uint8

// Pool states. A pool starts paused; Clear pauses it, Ready resumes it, Close is final.
const (
	StatePaused State = iota
	StateReady
	StateClosed
)

// String returns "paused", "ready" or "closed".
func (s State) String() string {
	switch s {
	case StatePaused:
		return "paused"
	case StateReady:
		return "ready"
	case StateClosed:
		return "closed"
	}
	return "unknown"
}

// Ready marks a paused pool ready: checkouts are served and minPoolSize population
// starts at once. Readying a ready pool does nothing; a closed pool returns a
// *PoolClosedError.
func (p *Pool) Ready() error {
	p.mu.Lock()
	switch p.state {
	case StateClosed:
		p.mu.Unlock()
		return &PoolClosedError{Address: p.address}
	case StateReady:
		p.mu.Unlock()
		return nil
	}
	p.state = StateReady
	// PoolReady is emitted before maintenance can observe the ready state, so no
	// ConnectionCreated of the population can precede it.
	if p.mon != nil {
		p.emitLocked(Event{Type: PoolReady})
	}
	p.mu.Unlock()
	p.kick()
	return nil
}

// Clear is ClearWithError(nil, interruptInUse).
func (p *Pool) Clear(interruptInUse bool) { p.ClearWithError(nil, interruptInUse) }

// ClearWithError clears a non-load-balanced pool: it bumps the generation (every
// existing connection becomes stale and is closed when next seen), pauses the pool,
// and fails every waiter at once with a *PoolClearedError (whose Cause is cause).
// PoolCleared is emitted unless the pool was already paused. With interruptInUse,
// connections being established are cancelled at once and in-use connections of the
// old generations are interrupted (their Upstream closed) by a maintenance run
// scheduled immediately, so Clear itself never blocks. It does nothing on a closed or
// load-balanced pool (use ClearService there).
func (p *Pool) ClearWithError(cause error, interruptInUse bool) {
	p.mu.Lock()
	if p.state == StateClosed || p.lb {
		p.mu.Unlock()
		return
	}
	wasPaused := p.state == StatePaused
	prev := p.generation
	p.generation++
	p.state = StatePaused
	p.clearCause = cause
	// Every waiter is evicted in the same instant; their failure events follow.
	evicted := p.queue.detach()
	if interruptInUse {
		p.interruptPending = true
		p.interruptGen = prev
		for _, c := range p.conns {
			if c.state == connPending && c.cancelled == "" {
				c.cancelled = ReasonStale
				c.cancel()
			}
		}
	}
	if !wasPaused && p.mon != nil {
		p.emitLocked(Event{Type: PoolCleared, Generation: p.generation, InterruptInUseConnections: interruptInUse})
	}
	if evicted != nil {
		p.failEvictedLocked(evicted, ReasonConnectionError, &PoolClearedError{Address: p.address, Cause: cause})
	}
	p.mu.Unlock()
	p.kick()
}

// ClearService clears the connections of one service in load-balancer mode: it bumps
// that service's generation and emits PoolCleared with the serviceId. It neither
// pauses the pool nor touches the wait queue. It does nothing on a closed or
// non-load-balanced pool.
func (p *Pool) ClearService(id bson.ObjectID) {
	p.mu.Lock()
	if !p.lb || p.state == StateClosed {
		p.mu.Unlock()
		return
	}
	// Without an entry there is no connection of that service to make stale; the
	// spec removes entries whose count drops to zero.
	var gen uint64
	if s := p.services[id]; s != nil {
		s.gen++
		gen = s.gen
	}
	if p.mon != nil {
		p.emitLocked(Event{Type: PoolCleared, Generation: gen, ServiceID: id, HasServiceID: true})
	}
	p.mu.Unlock()
	p.kick()
}

// Close closes the pool: available connections are closed at once, connections being
// established are cancelled, waiters fail with *PoolClosedError, and in-use
// connections are closed when checked in. Close is idempotent and does not wait for
// sockets to close; the pool's goroutines exit promptly afterwards.
func (p *Pool) Close() {
	p.mu.Lock()
	if p.state == StateClosed {
		p.mu.Unlock()
		return
	}
	p.state = StateClosed
	evicted := p.queue.detach()
	if p.share != nil {
		p.share.leave(p) // before closing: the freed slots go to pools that wait
	}
	for n := len(p.idle); n > 0; n = len(p.idle) {
		c := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.shareIdleLocked()
		p.closeLocked(c, ReasonPoolClosed, nil)
	}
	for _, c := range p.conns {
		if c.state == connPending {
			c.cancelled = ReasonPoolClosed
		}
	}
	p.baseCancel()
	if p.expiry != nil {
		p.expiry.Stop()
		p.expiryAt = 0
	}
	if p.probeTimer != nil {
		p.probeTimer.Stop()
		p.probeTimer = nil
	}
	if p.mon != nil {
		p.emitLocked(Event{Type: PoolClosed})
	}
	if evicted != nil {
		p.failEvictedLocked(evicted, ReasonPoolClosed, &PoolClosedError{Address: p.address})
	}
	p.mu.Unlock()
	close(p.done)
}
