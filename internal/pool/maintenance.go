package pool

import (
	"slices"
	"time"
)

// maintain is the pool's background goroutine. It works in runs (run): each does the
// work available now and ends. Runs start MaintenanceInterval after the previous one
// ended, or at once when kicked (Ready, Clear, ClearService, SetLimits, and a finished
// establishment while the pool is below MinPoolSize).
func (p *Pool) maintain() {
	defer p.wg.Done()
	t := time.NewTimer(p.interval)
	defer t.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-p.runNow:
		case <-t.C:
		}
		p.run()
		t.Reset(p.interval)
	}
}

// kick schedules a maintenance run as soon as possible. It never blocks, so it may be
// called with p.mu held.
func (p *Pool) kick() {
	if p.runNow == nil {
		return
	}
	select {
	case p.runNow <- struct{}{}:
	default: // a run is already scheduled
	}
}

// run is one background run: close perished available connections, interrupt in-use
// connections after an interrupting clear, and start establishing connections up to
// MinPoolSize within MaxConnecting. It never waits (sockets close on their own
// goroutines, connections are established on theirs).
func (p *Pool) run() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state == StateClosed {
		return
	}
	p.pruneLocked()
	if p.share != nil {
		p.shareEvictLocked()
	}
	if p.interruptPending {
		p.interruptLocked()
	}
	p.populateLocked() // dispatches while ready, so serves a grant of the Share
	if p.state != StateReady {
		p.shareSettleLocked()
	}
}

// pruneLocked closes available connections that are stale or idle, and the oldest
// available ones while the pool is above MaxPoolSize (after SetLimits lowered it).
// Each is removed from p.idle before it is closed so that every event's counts add up.
func (p *Pool) pruneLocked() {
	var now instant
	if p.opts.MaxIdleTime > 0 {
		now = monoNow()
	}
	for i := 0; i < len(p.idle); {
		c := p.idle[i]
		var reason Reason
		switch {
		case p.staleLocked(c):
			reason = ReasonStale
		case now != 0 && now.sub(c.idleSince) > p.opts.MaxIdleTime:
			reason = ReasonIdle
		case p.opts.MaxPoolSize > 0 && len(p.conns) > p.opts.MaxPoolSize:
			reason = ReasonIdle
		default:
			i++
			continue
		}
		p.idle = slices.Delete(p.idle, i, i+1)
		p.shareIdleLocked()
		p.closeLocked(c, reason, nil)
	}
}

// interruptLocked interrupts every in-use connection whose generation is not newer
// than the last interrupting clear: its socket is closed (asynchronously) so that the
// owner's pending I/O fails at once; the connection is closed when checked in.
func (p *Pool) interruptLocked() {
	p.interruptPending = false
	for _, c := range p.conns {
		if c.state != connInUse || c.generation > p.interruptGen || c.interrupted.Load() {
			continue
		}
		c.interrupted.Store(true)
		if c.up != nil && !c.upClosed {
			c.upClosed = true
			p.closeUpstream(c.up)
		}
	}
}

// populateLocked starts establishing connections while the pool is ready, below
// MinPoolSize, and MaxPoolSize and MaxConnecting allow. They are unclaimed: a waiter
// may take one over, otherwise it becomes available when established.
func (p *Pool) populateLocked() {
	if p.state != StateReady {
		return
	}
	for len(p.conns) < p.opts.MinPoolSize && p.canCreateLocked() && (p.share == nil || p.share.tryAcquire()) {
		c := p.createLocked(true)
		p.unclaimed = append(p.unclaimed, c)
		p.establishLocked(c)
	}
	p.dispatchLocked()
}
