package proxy

// Panic isolation on the event loop (recover.go has the rest): a loop
// callback that panics while it holds a client's ownMu ends that client,
// still under ownMu, and returns; the loop thread goes on with the others.

// Recover (evloop.Handler) is deferred by each engine function that takes
// a client's endpoint Mu, right after it does and after the deferred
// unlock, so that it runs under Mu and the unlock follows (clientReady
// and upstreamReady on epoll; arm, clientDone and replyDone on io_uring;
// Resume), and by the hand-over from the goroutine (loopClient.enter).
func (lc *loopClient) Recover() {
	v := recover()
	if v == nil {
		return
	}
	c := lc.c
	c.s.reportPanic(c.log, "loop", v)
	afterPanic(c.log, lc.releaseOwned, c.finalizeOnce)
}

// releaseOwned ends a client whose loop code panicked, holding ownMu,
// whatever its loop state.
func (lc *loopClient) releaseOwned() {
	c := lc.c
	switch lc.State {
	case lsGoroutine:
		// Handed to a goroutine before the panic: closing its connection
		// ends it there.
		if c.nc != nil {
			_ = c.nc.Close()
		}
		return
	case lsClosed:
		if c.s.registered(c) {
			lc.forget()
			c.finalize(errPanicked)
		}
		return
	}
	// lsIdle, lsWaiting, lsUpstream. A request out on an upstream keeps
	// lc.buf: a receive of the ring may still be writing into it, and its
	// slot in the engine keeps the buffer reachable until it completes,
	// which the close of the connection (exchange.releaseAfterPanic) brings about; that
	// completion, or epoll's event, finds the client closed. A checkout
	// still queued (lsWaiting) is delivered later to Resumed, which gives
	// it back.
	if lc.State != lsUpstream {
		putBuffer(lc.buf)
		lc.buf = nil
	}
	lc.unsent = false
	c.x.releaseAfterPanic()
	lc.State = lsClosed
	c.finishOwned(errPanicked) // a loop client has nothing pinned nor open: no I/O
}
