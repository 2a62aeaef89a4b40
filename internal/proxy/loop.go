package proxy

import "sync/atomic"

// loopState says who owns a client's socket: its goroutine or the event
// loop (loop_linux.go).
type loopState uint8

const (
	lsGoroutine loopState = iota // the client's goroutine reads and writes c.nc
	lsIdle                       // the loop owns the client; no request in flight
	lsWaiting                    // the request waits in the pool's queue (CheckOutFunc)
	lsUpstream                   // the loop sent a request and waits for the reply
	lsClosed                     // finished
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
// the server started: replies a spin caught, and spins that ended without
// one. They outlive the loops, so that the counters never go back.
type spinCounts struct {
	caught, missed atomic.Uint64
}

// LoopSpins reports the event loop's spins since the server started: the
// replies a loop thread caught while waiting awake for them, and the
// spins that ended without a reply (their CPU spent for nothing). Both
// stay 0 off io_uring, or with Options.LoopSpin 0.
func (s *Server) LoopSpins() (caught, missed uint64) {
	return s.loopSpins.caught.Load(), s.loopSpins.missed.Load()
}
