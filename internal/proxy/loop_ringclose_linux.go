package proxy

// Closing a client of the io_uring driver. A client's socket with a
// receive in flight is the kernel's until that receive completes, so its
// descriptor is closed by the completion (closeClient leaves it to the home
// thread, which shuts the socket down). That receive may sit behind the
// send of a small reply (sendReply), which has no completion of its own.
//
// Most closes (an idle timeout, a client gone, a protocol error) shut both
// sides: a reply still waiting for room in the socket is cut short, so a
// client that reads nothing is gone at once. Server.Close instead lets the
// replies out, bounded by its context: the home thread shuts only the
// reading side, whose receive then ends once the send before it is whole;
// the completion reads nothing more into the client (the client is
// closed) and hands the socket to flushing, where awaitSends closes it once
// the kernel has no byte of it left to send (SIOCOUTQ) and its unread input
// is discarded. Closing a TCP socket with unread input, or with bytes still
// queued, resets the connection and drops those bytes.
//
// lingering counts the clients in either wait; awaitSends returns once it
// is 0. Lock order: a client's ownMu before flushMu (received); flushed takes
// them one at a time.

import (
	"context"
	"fmt"
	"syscall"
	"time"
)

// closeClient closes the client's descriptor, or with a receive in flight
// leaves it to the home thread (armClose, then the receive's completion).
// It holds ownMu.
func (d *ringDriver) closeClient(c *client) {
	lc := &c.lc
	rc := lc.sock.(*ringClient)
	if !rc.left {
		rc.left = true
		rc.home.load.clients.Add(-1)
	}
	if rc.fdn < 0 {
		return
	}
	if rc.armed {
		// The receive is on the home thread's ring, maybe behind a reply
		// prepared there and not yet submitted (sendReply): that thread
		// shuts the socket down once the reply is out (armClose). Whether
		// the replies are let out is decided now, by who closes.
		if !rc.lingering {
			rc.lingering = true
			rc.flush = c.s.closing.Load()
			d.lingering.Add(1)
			rc.home.post(c, armClose)
		}
		return
	}
	_ = syscall.Close(rc.fdn)
	rc.fdn = -1
}

// shutClosed shuts a closed client's socket down, ending its receive in
// flight: only the reading side when its replies are to be let out. It
// runs on the home thread, holding ownMu.
func (d *ringDriver) shutClosed(rc *ringClient) {
	how := syscall.SHUT_RDWR
	if rc.flush {
		how = syscall.SHUT_RD
	}
	_ = syscall.Shutdown(rc.fdn, how)
}

// received handles the completion of a closed client's receive, holding
// ownMu: res < 0 is a failed send or receive, and nothing is left to let
// out.
func (d *ringDriver) received(c *client, res int32) {
	rc := c.lc.sock.(*ringClient)
	if !rc.flush || res < 0 || rc.fdn < 0 {
		d.closeLingering(rc)
		return
	}
	// The receive may have ended with data before armClose shut the
	// reading side: shut it now, so that discardInput ends at 0.
	_ = syscall.Shutdown(rc.fdn, syscall.SHUT_RD)
	d.flushMu.Lock()
	d.flushing = append(d.flushing, c)
	d.flushMu.Unlock()
}

// closeLingering closes the descriptor of a closed client whose receive has
// ended (or whose ring is gone). It holds the client's ownMu.
func (d *ringDriver) closeLingering(rc *ringClient) {
	if rc.fdn >= 0 {
		_ = syscall.Close(rc.fdn)
		rc.fdn = -1
	}
	if rc.lingering {
		rc.lingering = false
		d.lingering.Add(-1)
	}
}

// flushed closes the flushing sockets that have sent everything (all of
// them when force is set, which cuts the rest short), and reports how many
// are left.
func (d *ringDriver) flushed(force bool) int {
	d.flushMu.Lock()
	cs := d.flushing
	d.flushing = nil
	d.flushMu.Unlock()
	var left []*client
	for _, c := range cs {
		lc := &c.lc
		lc.ownMu.Lock()
		rc := lc.sock.(*ringClient)
		switch {
		case rc.fdn >= 0 && force:
			abortClose(rc.fdn)
			rc.fdn = -1
			d.closeLingering(rc)
		case rc.fdn >= 0 && unsent(rc.fdn):
			left = append(left, c)
		default:
			if rc.fdn >= 0 {
				discardInput(rc.fdn)
			}
			d.closeLingering(rc)
		}
		lc.ownMu.Unlock()
	}
	if len(left) == 0 {
		return 0
	}
	d.flushMu.Lock()
	d.flushing = append(d.flushing, left...)
	d.flushMu.Unlock()
	return len(left)
}

// awaitSends waits, bounded by ctx, until no client closed by
// Server.Close has replies left to send, closing each socket once it has
// sent them; when ctx ends it closes the rest, cutting them short.
func (d *ringDriver) awaitSends(ctx context.Context) error {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		d.flushed(false)
		if d.lingering.Load() == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			n := d.lingering.Load()
			d.flushed(true)
			return fmt.Errorf("mongobouncer: %d clients with replies unsent at close: %w", n, ctx.Err())
		case <-tick.C:
		}
	}
}
