package proxy

// Panic isolation on the event loop (recover.go has the rest): a loop
// callback that panics while it holds a client's ownMu ends that client,
// still under ownMu, and returns; the loop thread goes on with the others.

// recoverOwned is deferred by each loop function that takes a client's
// ownMu, right after it does and after the deferred unlock, so that it
// runs under ownMu and the unlock follows: clientReady and upstreamReady
// (epoll), arm, clientDone and replyDone (io_uring), loopResume, and the
// hand-over from the goroutine (enterLoop).
func (c *client) recoverOwned() {
	v := recover()
	if v == nil {
		return
	}
	c.reportPanic("loop", v)
	c.afterPanic(c.releaseOwned)
}

// releaseOwned ends a client whose loop code panicked, holding ownMu,
// whatever its loop state.
func (c *client) releaseOwned() {
	lc := &c.lc
	switch lc.state {
	case lsGoroutine:
		// Handed to a goroutine before the panic: closing its connection
		// ends it there.
		if c.nc != nil {
			_ = c.nc.Close()
		}
		return
	case lsClosed:
		if c.registered() {
			c.loopForget()
			c.finalize(errPanicked)
		}
		return
	}
	// lsIdle, lsWaiting, lsUpstream. A request out on lc.up keeps lu.owner
	// and lc.buf: a receive of the ring may still be writing into lc.buf,
	// and through its slot (ringUp, lu, owner) keeps the client and the
	// buffer reachable until it completes, which the close of the
	// connection (releaseRequest) brings about; that completion, or epoll's
	// event, finds the client closed. A checkout still queued (lsWaiting)
	// is delivered later to loopResume, which gives it back.
	if lc.up == nil {
		putBuffer(lc.buf)
		lc.buf = nil
	}
	lc.unsent = false
	c.releaseRequest()
	lc.state = lsClosed
	c.finishLocked(errPanicked) // a loop client has nothing pinned nor open: no I/O
}
