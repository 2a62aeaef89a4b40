package proxy

// The server's side of the event loop (internal/evloop): starting the
// engine on the I/O model the options ask for, the idle sweeper's policy
// (client_idle_timeout, client_login_timeout), and stopping it. What the
// loop does with a client's request is in loop_client_linux.go.
//
// The loop serves the common request without any goroutine: a plain
// OP_MSG command, outside a transaction and an exhaust stream, on a route
// in statement or transaction mode whose server is selectable
// (admitLoop, admit.go). Every other message goes to the client's goroutine,
// which hands the client back to the loop when it is idle again with
// nothing pinned. Waiting for a connection takes no goroutine either: the
// request waits in the pool's queue as a pool.CheckOutFunc, whose callback
// only posts the result to the engine's ready list (evloop.Loop.Post).

import (
	"context"
	"runtime"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/evloop"
)

// EventLoopSupported reports whether this platform has the event loop.
const EventLoopSupported = true

// loops is the server's event loop.
type loops = evloop.Loop

// loopsFor returns the server's loops, starting them at first use, or nil
// when the event loop is off or cannot start.
func (s *Server) loopsFor() *loops {
	if l := s.loopsPtr.Load(); l != nil {
		return l
	}
	if !s.opts.EventLoop {
		return nil
	}
	l, err := s.startLoops()
	if err != nil {
		s.log.Warn("event loop unavailable; every client is served by its goroutine", "error", err)
	}
	return l
}

// startLoops starts the loops once. Auto prefers io_uring and falls back to
// epoll with a warning; LoopIOUring never falls back (New starts the loops
// at once then, and fails where the ring cannot start).
func (s *Server) startLoops() (*loops, error) {
	s.loopsMu.Lock()
	defer s.loopsMu.Unlock()
	if l := s.loopsPtr.Load(); l != nil || s.loopsOff {
		return l, nil
	}
	n := s.opts.LoopThreads
	if n <= 0 {
		n = runtime.GOMAXPROCS(0)
	}
	io := string(s.opts.LoopIO) // evloop.IOEpoll or IOUring, spelled as config's
	if s.opts.LoopIO == LoopIOAuto {
		io = "" // the engine's auto
	}
	l, err := evloop.Start(evloop.Options{
		IO: io, Threads: n, Spin: s.opts.LoopSpin, Spins: &s.loopSpins, Log: s.log,
	})
	if err != nil {
		s.loopsOff = true
		return nil, err
	}
	s.loopsPtr.Store(l)
	l.Go(s.sweepIdle)
	return l, nil
}

// loopAdaptive is LoopAdaptive on Linux: the started loop's own report.
func (s *Server) loopAdaptive() (evloop.AdaptiveStats, bool) {
	if l := s.loopsPtr.Load(); l != nil {
		return l.Adaptive()
	}
	return evloop.AdaptiveStats{}, false
}

// awaitLoopSends waits, bounded by ctx, for the replies still being sent to
// clients that Close has closed (evloop.Loop.AwaitSends).
func (s *Server) awaitLoopSends(ctx context.Context) error {
	if l := s.loopsPtr.Load(); l != nil {
		return l.AwaitSends(ctx)
	}
	return nil
}

// stopLoops stops the loops, if they were started, for good. Requests
// still in their hands (Close ran out of time) are abandoned: their
// connections closed, their clients disconnected.
func (s *Server) stopLoops() {
	s.loopsMu.Lock()
	l := s.loopsPtr.Swap(nil)
	s.loopsOff = true
	s.loopsMu.Unlock()
	if l == nil {
		return
	}
	// Checkout results posted too late for a thread are resumed by Stop
	// (later ones find no loops and abandon on their own, in Resumed).
	l.Stop()
	for _, c := range s.snapshot() {
		c.lc.abandonUpstream()
	}
}

// abandonUpstream abandons the request a loop client has out on an
// upstream connection, if any, under ownMu.
func (lc *loopClient) abandonUpstream() {
	lc.Mu.Lock()
	defer lc.Mu.Unlock()
	if lc.State == lsUpstream {
		lc.abandon(nil)
	}
}

// sweepIdle closes loop-owned clients idle longer than client_idle_timeout,
// and those client_login_timeout closes (loopClient.loginExpired); goroutine-owned
// ones have a read deadline instead.
func (s *Server) sweepIdle(done <-chan struct{}) {
	t := time.NewTimer(time.Second)
	defer t.Stop()
	for {
		// Sweep at an eighth of the shortest timeout in force, so that a
		// client is closed at most that much late: at most a second late
		// for client_idle_timeout, while client_login_timeout (60s by
		// default, and in force by default) does not make every idle
		// client's lock taken every second.
		idle := time.Duration(s.idleTimeout.Load())
		if tb := s.table.Load(); tb != nil {
			for _, r := range tb.All() {
				if t := r.IdleLimit(); t > 0 && (idle <= 0 || t < idle) {
					idle = t
				}
			}
		}
		var every time.Duration
		if idle > 0 {
			every = min(max(idle/8, 5*time.Millisecond), time.Second)
		}
		if login := time.Duration(s.loginTimeout.Load()); login > 0 {
			if e := max(login/8, 5*time.Millisecond); every == 0 || e < every {
				every = e
			}
		}
		sweep := every > 0
		if !sweep {
			every = time.Second
		}
		t.Reset(every)
		select {
		case <-done:
			return
		case <-s.sweepKick:
			// A shorter client_login_timeout: wait by the new one.
			continue
		case <-t.C:
		}
		if !sweep {
			continue
		}
		// Read again: a reload during the wait may have lengthened it.
		login := time.Duration(s.loginTimeout.Load())
		now := monoNow()
		for _, c := range s.snapshot() {
			c.lc.sweep(now, login)
		}
	}
}

// sweep closes a loop-owned idle client past client_idle_timeout or
// client_login_timeout (login), under ownMu.
func (lc *loopClient) sweep(now, login time.Duration) {
	c := lc.c
	lc.Mu.Lock()
	defer lc.Mu.Unlock()
	if lc.State != lsIdle {
		return
	}
	if timeout := c.idleTimeout(); timeout > 0 && now-lc.lastActive > timeout {
		lc.close()
	} else if why, waited := c.lc.loginExpired(now, login); why != "" {
		c.s.loginTimedOut(c.log, why, waited, login)
		lc.close()
	}
}
