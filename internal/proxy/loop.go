package proxy

// The event loop's names that build everywhere: the client's loop states
// (the engine's endpoint states) and the spin counters the server reports.

import "github.com/mongobouncer/mongobouncer/internal/evloop"

// loopState says who owns a client's socket: its goroutine or the event
// loop (loop_client_linux.go); the engine's endpoint states, named for
// what they mean to a client.
type loopState = evloop.State

const (
	lsGoroutine = evloop.Detached   // the client's goroutine reads and writes c.nc
	lsIdle      = evloop.Idle       // the loop owns the client; no request in flight
	lsWaiting   = evloop.Busy       // the request waits in the pool's queue (CheckOutFunc)
	lsUpstream  = evloop.AwaitReply // the loop sent a request and waits for the reply
	lsClosed    = evloop.Closed     // finished
)

// snapshot returns the connected clients.
func (s *Server) snapshot() []*client {
	s.clientsMu.Lock()
	defer s.clientsMu.Unlock()
	cs := make([]*client, 0, len(s.clients))
	for c := range s.clients {
		cs = append(cs, c)
	}
	return cs
}

// spinCounts counts the io_uring loop threads' spins (event_loop_spin) since
// the server started; they outlive the loops, so that the counters never go
// back.
type spinCounts = evloop.SpinCounts

// LoopAdaptive reports the event loop's choice between epoll and io_uring
// when it runs both (event_loop_io = "auto" where io_uring is allowed);
// ok is false otherwise, or before the loop starts.
func (s *Server) LoopAdaptive() (st evloop.AdaptiveStats, ok bool) { return s.loopAdaptive() }

// LoopSpins reports the event loop's spins since the server started: the
// replies a loop thread caught while waiting awake for them, and the
// spins that ended without a reply (their CPU spent for nothing). Both
// stay 0 off io_uring, or with Options.LoopSpin 0.
func (s *Server) LoopSpins() (caught, missed uint64) {
	return s.loopSpins.Caught.Load(), s.loopSpins.Missed.Load()
}
