package proxy

// Panic isolation: a panic while serving one client ends that client only.
// The recovery points (doc.go, "Panics") are the tops of the goroutines
// that serve a client and the loop's per-client callbacks; this file has
// what they do: log the panic with its stack at error level, count it
// (Server.Panics, PanicObserver), close the connection the interrupted
// request held (its state is unknown: never pooled, never kept pinned),
// and finish the client, so that the server's accounting of it (wg, the
// client count, the client set) is final and Shutdown does not wait for it.
// The loop's part, which knows the loop's state, is in recover_linux.go.
// Each part has its owner: the server reports (its count, its observer),
// the loopClient releases what its loop state holds, and the client only
// recovers at the top of its goroutines and ends itself.
//
// The client's locks (sessMu, ownMu) are unlocked by a defer in the
// function that locks them, always (lockrule_test.go checks the package
// and internal/session):
// a panic in a critical section unlocks on its way up, before any recovery
// runs. So a recovery never finds a lock its own goroutine left held, and
// takes them with a plain Lock: one held is held by another goroutine, for
// a critical section that ends (a few lines, no blocking I/O), and the
// recovery waits for it. Inferring the holder instead (a lock still held
// after a while taken for the panicking frame's, and unlocked) would
// unlock a lock another goroutine holds, whose own Unlock is then fatal to
// the whole process. The recovery's own critical sections follow the rule
// too, so that a panic in them (afterPanic) leaves no lock held either.

import (
	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/session"

	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync/atomic"
)

// errPanicked ends a client whose serving panicked.
var errPanicked = errors.New("internal error (a panic) while serving the client")

// PanicObserver is implemented by an Observer that counts the panics
// recovered while serving a client; path is "goroutine" (the client's
// goroutine) or "loop" (the event loop's code for the client).
type PanicObserver interface {
	ClientPanicked(path string)
}

// Panics returns the number of panics recovered while serving clients
// since the server started.
func (s *Server) Panics() uint64 { return s.panics.Load() }

// testPanicHook, set by tests only, is called at the named points of the
// request path (panicPoint) with the command's name: a test makes it
// panic there. Unset, a point costs an atomic load.
var testPanicHook atomic.Pointer[func(at, cmd string)]

// panicPoint calls testPanicHook, if set.
func panicPoint(at string, req *command.Request) {
	if h := testPanicHook.Load(); h != nil {
		(*h)(at, req.Name())
	}
}

// reportPanic logs a recovered panic with its stack on the client's log,
// and counts it (Panics, PanicObserver): the server's part of every
// recovery.
func (s *Server) reportPanic(log *slog.Logger, path string, v any) {
	s.panics.Add(1)
	if o, ok := s.opts.Observer.(PanicObserver); ok {
		o.ClientPanicked(path)
	}
	log.Error("panic while serving a client: the client is disconnected, the others go on",
		"path", path, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
}

// recoverGoroutine is deferred at the top of each goroutine that serves a
// client: serve, run, and the one that writes a reply the loop could not.
// No lock of the client's is held there: the panicking frames' deferred
// unlocks have run.
func (c *client) recoverGoroutine() {
	v := recover()
	if v == nil {
		return
	}
	c.s.reportPanic(c.log, "goroutine", v)
	afterPanic(c.log, c.endGoroutine, c.finalizeOnce)
}

// recoverRefused is deferred by the goroutine that refuses a connection
// over max_client_conn: its client was never in the set, nor served, so
// closing the connection is all there is to do.
func (s *Server) recoverRefused(cn *conn, log *slog.Logger) {
	if v := recover(); v != nil {
		s.reportPanic(log, "goroutine", v)
		cn.closeConn()
	}
}

// afterPanic runs release, the clean-up after a recovered panic. A panic
// in it as well is logged, and finalize (the client's finalizeOnce) takes
// the client at least off the server, so that Shutdown does not wait for
// it.
func afterPanic(log *slog.Logger, release, finalize func()) {
	defer func() {
		if v := recover(); v != nil {
			log.Error("releasing a client after a panic panicked too", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			finalize()
		}
	}()
	release()
}

// endGoroutine ends the client of a goroutine that panicked. The goroutine
// owns the client unless the panic came from loop code it ran (the hand-
// over in loopClient.enter recovers its own): the loop's state says which.
func (c *client) endGoroutine() {
	if c.lc.releaseIfOwned() {
		return
	}
	c.x.releaseAfterPanic()
	c.finish(errPanicked)
}

// releaseIfOwned ends the client under ownMu, as the loop's recovery does
// (releaseOwned), unless its goroutine owns it; it reports whether it did.
// The unlock is deferred: a panic in releaseOwned as well (caught by
// afterPanic) must not leave ownMu held, or the client's next loop
// callback would block its loop thread for good.
func (lc *loopClient) releaseIfOwned() bool {
	lc.Mu.Lock()
	defer lc.Mu.Unlock()
	if lc.State == lsGoroutine {
		return false
	}
	panicPoint("release-loop-owned", &lc.c.x.req)
	lc.releaseOwned()
	return true
}

// releaseAfterPanic releases what the request a panic interrupted holds,
// its owner calling: the connection, whose state is unknown (a request
// may be half sent, a reply half read), is closed, unpinned if pinned;
// the client is idle. Other pins, between requests, are in a known state
// and go through the usual clean-up.
func (x *exchange) releaseAfterPanic() {
	if pc := x.pc; pc != nil {
		pc.MarkErrored(errPanicked)
		x.dropConn()
	}
	x.sess.SetPhase(session.PhaseIdle)
	x.route, x.srv, x.need, x.pinned = nil, nil, nil, false
}

// registered reports whether c is still in the server's set, which
// finalize takes it out of.
func (s *Server) registered(c *client) bool {
	s.clientsMu.Lock()
	defer s.clientsMu.Unlock()
	_, ok := s.clients[c]
	return ok
}

// finalizeOnce finalizes a client that a panic interrupted before its
// finalize ran.
func (c *client) finalizeOnce() {
	if c.s.registered(c) {
		c.finalize(errPanicked)
	}
}
