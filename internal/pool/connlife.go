package pool

// A connection's life in the pool: created (pending), established by
// dialing and the handshake off the lock, then handed to the waiter it was
// made for or pooled, and closed with its reason. Everything named ...Locked
// runs under Pool.mu; dial and establish run without it (pool.go states the
// lock's rules).

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// canCreateLocked reports whether another connection fits under
// maxPoolSize and maxConnecting.
func (p *Pool) canCreateLocked() bool {
	return (p.opts.MaxPoolSize == 0 || len(p.conns) < p.opts.MaxPoolSize) && p.pending < p.opts.MaxConnecting
}

// createLocked creates a pending connection (no I/O) and emits ConnectionCreated.
func (p *Pool) createLocked(background bool) *Conn {
	p.nextID++
	c := &Conn{pool: p, id: p.nextID, generation: p.generation, state: connPending, background: background}
	p.conns[c.id] = c
	p.shareConnsLocked()
	p.pending++
	if p.mon != nil {
		c.createdAt = monoNow()
		p.emitLocked(Event{Type: ConnectionCreated, ConnectionID: c.id, Generation: c.generation})
	}
	return c
}

// establishLocked starts establishing c on its own goroutine, outside the lock.
func (p *Pool) establishLocked(c *Conn) {
	ctx, cancel := context.WithCancel(p.baseCtx)
	c.cancel = cancel
	p.wg.Add(1)
	go p.establish(ctx, c)
}

// establish runs the Connector for c and records the outcome.
func (p *Pool) establish(ctx context.Context, c *Conn) {
	defer p.wg.Done()
	up, err := p.dial(ctx, c.id)
	var sid bson.ObjectID
	if err == nil && p.lb {
		ok := false
		if s, isS := up.(ServiceIDer); isS {
			sid, ok = s.ServiceID()
		}
		if !ok {
			p.closeUpstream(up)
			up, err = nil, ErrNoServiceID
		}
	}
	if err != nil {
		cerr := &ConnectionError{Address: p.address, ConnectionID: c.id, Generation: c.generation, Err: err}
		if p.onBgErr != nil {
			p.mu.Lock()
			report := c.cancelled == "" && p.state != StateClosed && (c.background || c.owner == nil)
			p.mu.Unlock()
			// Outside the lock: the handler typically calls Clear. Called before the
			// connection's ConnectionClosed, as SDAM error handling is part of the failure.
			if report {
				p.onBgErr(cerr)
			}
		}
		p.mu.Lock()
		p.failPendingLocked(c, cerr)
		p.mu.Unlock()
		return
	}
	p.mu.Lock()
	p.completePendingLocked(c, up, sid)
	p.mu.Unlock()
}

// dial calls the Connector, turning a panic or a nil connection into an error so that
// the pool's accounting stays right whatever the Connector does.
func (p *Pool) dial(ctx context.Context, id int64) (up Upstream, err error) {
	defer func() {
		if r := recover(); r != nil {
			up, err = nil, fmt.Errorf("pool: Connector panicked: %v", r)
		}
	}()
	up, err = p.connector.Connect(ctx, p.address, id)
	switch {
	case err != nil && up != nil:
		p.closeUpstream(up)
		up = nil
	case err == nil && up == nil:
		err = errors.New("pool: Connector returned no connection and no error")
	}
	return up, err
}

// failPendingLocked closes a pending connection whose establishment failed and fails
// the checkout it was made for, if any.
func (p *Pool) failPendingLocked(c *Conn, cerr *ConnectionError) {
	reason := ReasonError
	if c.cancelled != "" {
		reason = c.cancelled
	}
	w := c.owner
	c.owner = nil
	p.closeLocked(c, reason, cerr)
	if w != nil {
		p.failOwnerLocked(w, c, cerr)
	}
	p.dispatchLocked()
}

// failOwnerLocked fails the checkout a pending connection was established for.
func (p *Pool) failOwnerLocked(w *waiter, c *Conn, cerr error) {
	switch {
	case p.state == StateClosed || c.cancelled == ReasonPoolClosed:
		p.failWaiterLocked(w, ReasonPoolClosed, &PoolClosedError{Address: p.address})
	case c.cancelled != "":
		p.failWaiterLocked(w, ReasonConnectionError, &PoolClearedError{Address: p.address, Cause: p.clearCause, Interrupted: true})
	default:
		p.failWaiterLocked(w, ReasonConnectionError, cerr)
	}
}

// completePendingLocked records a successful establishment: ConnectionReady, then the
// connection goes to its checkout, or becomes available (and so to the oldest
// waiter), or is closed if it can no longer be used. The pending count drops in the
// same critical section that makes the connection available, so nobody can start a
// new establishment while it is unaccounted for.
func (p *Pool) completePendingLocked(c *Conn, up Upstream, sid bson.ObjectID) {
	c.up = up
	if c.cancel != nil {
		c.cancel()
		c.cancel = nil
	}
	if p.lb {
		s := p.services[sid]
		if s == nil {
			s = &serviceGen{}
			p.services[sid] = s
		}
		s.count++
		c.serviceID, c.hasServiceID, c.generation = sid, true, s.gen
	}
	if p.mon != nil {
		p.emitLocked(Event{Type: ConnectionReady, ConnectionID: c.id, Generation: c.generation, Duration: since(c.createdAt)})
	}
	p.pending--
	p.removeUnclaimedLocked(c)
	c.state = connAvailable
	w := c.owner
	c.owner = nil
	switch {
	case p.state == StateClosed || c.cancelled != "":
		// The Connector finished despite the cancellation.
		reason := c.cancelled
		if p.state == StateClosed {
			reason = ReasonPoolClosed
		}
		p.closeLocked(c, reason, nil)
		if w != nil {
			p.failOwnerLocked(w, c, nil)
		}
	case w != nil:
		// As in the spec's checkOut, the connection goes to the checkout that created
		// it even if a non-interrupting clear made it stale meanwhile; it is closed
		// when checked in.
		p.handOutLocked(c, w.start)
		p.deliverLocked(w, c)
	case p.staleLocked(c):
		p.closeLocked(c, ReasonStale, nil)
	case p.shareReclaimLocked():
		p.closeLocked(c, ReasonIdle, nil)
		p.share.checkedInEviction()
	default:
		p.makeAvailableLocked(c)
	}
	p.dispatchLocked()
	if p.state == StateReady && len(p.conns) < p.opts.MinPoolSize && p.canCreateLocked() {
		p.kick()
	}
}

// closeLocked removes c from the pool's accounting (the caller has already taken it
// out of p.idle), emits ConnectionClosed, and closes its socket asynchronously.
func (p *Pool) closeLocked(c *Conn, reason Reason, err error) {
	switch c.state {
	case connClosed:
		return
	case connPending:
		p.pending--
		p.removeUnclaimedLocked(c)
	case connInUse:
		p.inUse--
	}
	c.state = connClosed
	delete(p.conns, c.id)
	p.shareConnsLocked()
	if c.hasServiceID {
		if s := p.services[c.serviceID]; s != nil {
			if s.count--; s.count <= 0 {
				delete(p.services, c.serviceID)
			}
		}
	}
	if c.cancel != nil {
		c.cancel()
		c.cancel = nil
	}
	if p.mon != nil {
		p.emitLocked(Event{Type: ConnectionClosed, ConnectionID: c.id, Generation: c.generation, Reason: reason, Err: err})
	}
	if p.share != nil {
		p.share.release() // after the event: events never count more than the Share
	}
	if c.up != nil && !c.upClosed {
		c.upClosed = true
		p.closeUpstream(c.up)
	}
}

// closeUpstream closes a socket on its own goroutine: closing may block (TLS
// close_notify), and the spec wants closing to never block the pool or its callers.
func (p *Pool) closeUpstream(up Upstream) {
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		_ = up.Close()
	}()
}

func (p *Pool) removeUnclaimedLocked(c *Conn) {
	if i := slices.Index(p.unclaimed, c); i >= 0 {
		p.unclaimed = slices.Delete(p.unclaimed, i, i+1)
	}
}

// staleLocked reports whether c's generation is older than its pool's (or, in
// load-balancer mode, its service's).
func (p *Pool) staleLocked(c *Conn) bool {
	if p.lb {
		s := p.services[c.serviceID]
		return s != nil && c.generation < s.gen
	}
	return c.generation < p.generation
}
