package pool

// The pool's side of max_pool_size = "auto": what gates checkouts and what
// feeds the Limiter (limiter.go). Everything here runs under Pool.mu.

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
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
