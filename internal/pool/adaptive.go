package pool

// The pool's side of max_pool_size = "auto": what gates checkouts and what
// feeds the Limiter (limiter.go). Everything here runs under Pool.mu.

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"time"
)

// limiterStatsLocked returns the adaptive limit's state, or nil without one.
func (p *Pool) limiterStatsLocked() *LimiterStats {
	if p.lim == nil {
		return nil
	}
	st := p.lim.Stats()
	return &st
}

// isDrop reports whether a connection's error counts as a drop for the
// limiter: a timeout or a network failure, which overload causes. Errors the
// client caused (it went away mid-reply, a request-ID clash) do not, or
// every disconnecting client would lower the limit.
func isDrop(err error) bool {
	if err == nil {
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded)
}

// limitedLocked reports whether the adaptive limit lets no further checkout
// be served: connections in use and those being established for a checkout
// already fill it.
func (p *Pool) limitedLocked() bool {
	return p.lim != nil && p.inUse+p.pending-len(p.unclaimed) >= p.lim.Limit()
}

// armProbeLocked arms a timer for the deadline of the limiter's probe, if
// one is under way and none is armed. A probe holds the limit at the floor
// until enough operations have run at that concurrency; were the
// connections in use held for long (a transaction waiting on its client),
// no check-in would come to end it, and every other checkout would wait
// behind it. The timer ends it at its deadline instead.
func (p *Pool) armProbeLocked() {
	if p.lim == nil || p.probeTimer != nil || p.state == StateClosed {
		return
	}
	until, ok := p.lim.ProbeDeadline()
	if !ok {
		return
	}
	d := max(until-time.Duration(monoNow()), 0)
	p.probeTimer = time.AfterFunc(d, p.probeExpired)
}

// probeExpired is the probe timer's function.
func (p *Pool) probeExpired() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.probeTimer = nil
	if p.state == StateClosed || p.lim == nil {
		return
	}
	if p.lim.Tick(time.Duration(monoNow())) {
		p.dispatchLocked()
	}
	p.armProbeLocked()
}
