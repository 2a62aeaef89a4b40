package evloop

// Closing a client of the io_uring driver, or handing its descriptor to
// the epoll driver (detachClient, for a loop of both: adapt_linux.go,
// only while no receive is in flight). A client's socket with a
// receive in flight is the kernel's until that receive completes, so its
// descriptor is closed by the completion (closeClient leaves it to the home
// thread, which shuts the socket down). That receive may sit behind the
// send of a small reply (sendReply), which has no completion of its own.
//
// Most closes (an idle timeout, a client gone, a protocol error) shut both
// sides: a reply still waiting for room in the socket is cut short, so a
// client that reads nothing is gone at once. Server.Close instead lets the
// replies out: the home thread shuts only the reading side, whose receive
// then ends once the send before it is whole, and awaitSends waits for
// those receives, bounded by Close's context. By then the socket lingers
// on a descriptor of Server.flush's (linger_linux.go), which waits until
// the kernel has sent what is queued; so this descriptor is closed as any
// other once its receive has ended.
//
// lingering counts the clients whose receive is awaited.

import (
	"context"
	"fmt"
	"syscall"
	"time"
)

// closeClient closes the endpoint's descriptor, or with a receive in
// flight leaves it to the home thread (armClose, then the receive's
// completion). It holds Mu.
func (d *ringDriver) closeClient(ep *Endpoint, flush bool) {
	rc := ep.reg.(*ringClient)
	rc.closed = true
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
			rc.flush = flush
			d.lingering.Add(1)
			rc.home.post(rc, armClose)
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

// awaitSends waits, bounded by ctx, until no client closed by
// Server.Close has a receive in flight behind a reply's send: stopping the
// loop would cancel such a send. What is left when ctx ends is cut short
// as the threads tear their rings down.
func (d *ringDriver) awaitSends(ctx context.Context) error {
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for d.lingering.Load() > 0 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("mongobouncer: %d clients with replies unsent at close: %w", d.lingering.Load(), ctx.Err())
		case <-tick.C:
		}
	}
	return nil
}

// detachClient hands the endpoint's descriptor over (adapt_linux.go) when
// no receive is armed for it; the registration is left closed, so that an
// arm posted for it meanwhile does nothing.
func (d *ringDriver) detachClient(ep *Endpoint) (int, bool) {
	rc := ep.reg.(*ringClient)
	if rc.armed || rc.closed || rc.fdn < 0 {
		return -1, false
	}
	rc.closed = true
	if !rc.left {
		rc.left = true
		rc.home.load.clients.Add(-1)
	}
	fd := rc.fdn
	rc.fdn = -1
	return fd, true
}
