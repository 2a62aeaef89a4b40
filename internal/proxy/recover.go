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

import (
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"
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

// lockWait bounds the wait of a recovery for a lock of the client's. Its
// locks are held for a few lines without I/O, so one still held after
// that was left held by the panic itself, in a frame of the recovering
// goroutine: the recovery adopts it (holds it from then on) rather than
// block forever, and the loop thread or Shutdown with it. A sync.Mutex
// may be unlocked by another than its locker.
const lockWait = time.Second

// lockOrAdopt takes mu, or adopts it when it stays held for lockWait: the
// caller holds it either way.
func (c *client) lockOrAdopt(mu *sync.Mutex, name string) {
	deadline := time.Now().Add(lockWait)
	for !mu.TryLock() {
		if time.Now().After(deadline) {
			c.log.Error("the panic left a lock of the client's held: the recovery takes it over", "lock", name)
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// testPanicHook, set by tests only, is called at the named points of the
// request path (panicPoint) with the command's name: a test makes it
// panic there. Unset, a point costs an atomic load.
var testPanicHook atomic.Pointer[func(at, cmd string)]

// panicPoint calls testPanicHook, if set.
func panicPoint(at string, req *request) {
	if h := testPanicHook.Load(); h != nil {
		(*h)(at, req.name())
	}
}

// reportPanic logs a recovered panic with its stack, and counts it.
func (c *client) reportPanic(path string, v any) {
	c.s.panics.Add(1)
	if o, ok := c.s.opts.Observer.(PanicObserver); ok {
		o.ClientPanicked(path)
	}
	c.log.Error("panic while serving a client: the client is disconnected, the others go on",
		"path", path, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
}

// recoverGoroutine is deferred at the top of each goroutine that serves a
// client: serve, run, and the one that writes a reply the loop could not.
// No lock of the client's is held there, except one a panicking frame
// left held (lockOrAdopt).
func (c *client) recoverGoroutine() {
	v := recover()
	if v == nil {
		return
	}
	c.reportPanic("goroutine", v)
	c.afterPanic(c.endGoroutine)
}

// recoverRefused is deferred by the goroutine that refuses a client over
// max_client_conn: that client was never in the set, nor served.
func (c *client) recoverRefused() {
	if v := recover(); v != nil {
		c.reportPanic("goroutine", v)
		c.closeConn()
	}
}

// afterPanic runs release, the clean-up after a recovered panic. A panic
// in it as well is logged, and the client is at least taken off the
// server, so that Shutdown does not wait for it.
func (c *client) afterPanic(release func()) {
	defer func() {
		if v := recover(); v != nil {
			c.log.Error("releasing a client after a panic panicked too", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			c.finalizeOnce()
		}
	}()
	release()
}

// endGoroutine ends the client of a goroutine that panicked. The goroutine
// owns the client unless the panic came from loop code it ran (the hand-
// over in enterLoop recovers its own): the loop's state says which.
func (c *client) endGoroutine() {
	lc := &c.lc
	c.lockOrAdopt(&lc.ownMu, "ownMu")
	if lc.state != lsGoroutine {
		c.releaseOwned()
		lc.ownMu.Unlock()
		return
	}
	lc.ownMu.Unlock()
	c.releaseRequest()
	c.finish(errPanicked)
}

// releaseRequest releases what the request the panic interrupted holds,
// its owner calling: the connection, whose state is unknown (a request
// may be half sent, a reply half read), is closed, unpinned if pinned;
// the client is idle. Other pins, between requests, are in a known state
// and go through the usual clean-up.
func (c *client) releaseRequest() {
	c.lockOrAdopt(&c.sessMu, "sessMu")
	c.sessMu.Unlock()
	x := &c.x
	if pc := x.pc; pc != nil {
		pc.MarkErrored(errPanicked)
		x.dropConn()
	}
	c.setPhase(phaseIdle)
	x.route, x.srv, x.need, x.pinned = nil, nil, nil, false
}

// registered reports whether the client is still in the server's set,
// which finalize takes it out of.
func (c *client) registered() bool {
	c.s.clientsMu.Lock()
	defer c.s.clientsMu.Unlock()
	_, ok := c.s.clients[c]
	return ok
}

// finalizeOnce finalizes a client that a panic interrupted before its
// finalize ran.
func (c *client) finalizeOnce() {
	if c.registered() {
		c.finalize(errPanicked)
	}
}
