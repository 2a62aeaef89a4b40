package proxy

// Relay: the goroutine driver of the request state machine (exchange.go).
// It serves, with blocking calls on the client's goroutine, every request
// the event loop does not take: all of them when the loop is off, and
// otherwise transactions, exhaust streams, moreToCome requests, pinned
// clients, compressed or TLS upstreams and large messages. It does the I/O
// and calls the exchange at each step; the decisions are the exchange's.

import (
	"context"

	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/routing"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// forward sends one request to an upstream connection chosen by the route's
// pool mode and affinity, and relays the reply or the whole exhaust stream.
func (c *client) forward(route *routing.Route, msg []byte, h wire.Header, compressed bool, compID wire.CompressorID) error {
	x := &c.x
	x.begin(route, c.msg.Body, len(msg), h.RequestID)
	if c.sess.HasPinSlots() {
		c.dropStalePins()
	}
	err := c.relay(msg, compressed, compID)
	x.end()
	return err
}

// relay does the I/O of one request: checkout, send, replies.
func (c *client) relay(msg []byte, compressed bool, compID wire.CompressorID) error {
	x := &c.x
	req := &x.req
	if err := c.acquire(); err != nil {
		return c.replyError(x.reqID, compressed, compID, req, x.fail(err))
	}
	panicPoint("relay", req)
	up := x.pc.Upstream()
	if x.addRP {
		// The route's default read preference sent the read to a
		// secondary, which refuses a command that does not carry one.
		buf := getBuffer(len(msg) + len(x.route.DefaultReadPref()))
		defer putBuffer(buf)
		out, err := wire.AppendToMsgBody(buf.b[:0], msg, x.route.DefaultReadPref())
		if err != nil {
			return c.replyError(x.reqID, compressed, compID, req, x.fail(err))
		}
		msg = out
	}
	if err := up.WriteMessage(msg); err != nil {
		return c.replyError(x.reqID, compressed, compID, req, x.fail(err))
	}
	if req.More {
		// No reply is expected, but the upstream may send one anyway
		// (FerretDB does), at any time: the connection serves nobody else
		// before a fence has shown it clean.
		ctx, cancel := context.WithTimeout(context.Background(), c.s.opts.CommandTimeout)
		err := up.Fence(ctx, x.reqID)
		cancel()
		if err != nil {
			x.fail(err) // the client reads no reply, not even an error
			return nil
		}
		x.release()
		return nil
	}
	rbuf := getBuffer(16 * 1024)
	defer putBuffer(rbuf)
	respondTo := x.reqID
	for {
		reply, err := up.ReadMessage(rbuf.b[:0])
		if err != nil {
			return c.replyError(respondTo, compressed, compID, req, x.fail(err))
		}
		if cap(reply) > cap(rbuf.b) {
			rbuf.b = reply[:0]
		}
		if x.stray(reply) {
			continue
		}
		stream, err := x.onReply(reply, up.Buffered())
		if err != nil {
			return c.replyError(respondTo, compressed, compID, req, x.fail(err))
		}
		if !stream {
			x.release()
			return c.writeRaw(reply, compressed, compID, req.Name())
		}
		if werr := c.writeRaw(reply, compressed, compID, req.Name()); werr != nil {
			x.abandon(werr)
			return errClientGone
		}
		h, _ := wire.ParseHeader(reply)
		respondTo = h.RequestID
	}
}

// acquire finds the upstream connection for the request where target
// says: the client's pin, or a checkout, waited for when it queues.
func (c *client) acquire() error {
	x := &c.x
	if t, err := x.target(true); err != nil || t == targetPin {
		return err
	}
	for {
		pc, queued, err := x.checkOut(c.checkOutDone())
		if queued {
			// The pool calls done exactly once, at the latest when
			// wait_queue_timeout fails the checkout.
			got := <-c.checkedOutCh
			pc, err = got.pc, got.err
		}
		if retry, err := x.checkedOut(pc, err); !retry {
			return err
		}
	}
}

// checkOutResult is the result of a queued checkout.
type checkOutResult struct {
	pc  *pool.Conn
	err error
}

// checkOutDone returns the client goroutine's pool.CheckOutFunc callback,
// made at its first use: it hands the result to checkedOutCh, which has
// room for it (one request at a time), so it never blocks the pool.
func (c *client) checkOutDone() func(*pool.Conn, error) {
	if c.checkOutFn == nil {
		ch := make(chan checkOutResult, 1)
		c.checkedOutCh = ch
		c.checkOutFn = func(pc *pool.Conn, err error) { ch <- checkOutResult{pc, err} }
	}
	return c.checkOutFn
}
