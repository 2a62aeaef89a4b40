// The streaming protocol of the server monitor: once a server's hello has
// carried a topologyVersion, the monitor sends it back in an awaitable hello
// (maxAwaitTimeMS = HeartbeatInterval) with the OP_MSG exhaustAllowed flag,
// and the server then pushes a reply, flagged moreToCome, whenever its
// topology changes and at least every HeartbeatInterval. Each reply is a
// check. A reply without moreToCome ends the stream and the next check sends
// a new awaitable hello at once.
//
// A streaming check blocks in a read for up to HeartbeatTimeout +
// HeartbeatInterval (the specification's connectTimeoutMS +
// heartbeatFrequencyMS), so a watcher goroutine closes the connection when
// the topology closes, or when an application error cancels the check.

package topology

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// streamCheck is one check of the streaming protocol: with send, it sends
// an awaitable hello carrying the latest topologyVersion and reads the
// first reply; without, it reads the next reply of the open stream.
func (m *monitor) streamCheck(ctx context.Context, send bool) checkResult {
	s := m.s
	o := &s.topo.opts
	if send {
		// A server that answers every awaitable hello at once (one that
		// ignores maxAwaitTimeMS, or whose topologyVersion keeps changing)
		// must not turn the monitor into a busy loop.
		if d := time.Until(m.lastAwait.Add(o.MinHeartbeatInterval)); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return checkResult{err: ctx.Err()}
			case <-t.C:
			}
		}
	}
	s.emit(Event{Type: HeartbeatStarted, Awaited: true})
	start := time.Now()
	c := s.mconn
	stop := m.watch(ctx, c)
	h, err := m.exchange(c, send, start)
	cancelled := stop()
	r := checkResult{hello: h, err: err, dur: time.Since(start), awaited: true}
	switch {
	case cancelled:
		// The connection is closed, whatever the exchange returned.
		r.hello, r.err, r.cancelled = nil, errCheckCancelled, true
		m.exhaust = false
	case err != nil:
		m.exhaust = false
		if r.timeout = isTimeout(err); r.timeout {
			r.err = fmt.Errorf("%w (no hello within heartbeat timeout %v + maxAwaitTime %v)", err, o.HeartbeatTimeout, o.HeartbeatInterval)
		}
	}
	return r
}

// exchange sends the awaitable hello (with send) and reads one streamed
// reply, under the streaming socket timeout.
func (m *monitor) exchange(c *upstream.Conn, send bool, start time.Time) (*upstream.Hello, error) {
	o := &m.s.topo.opts
	if err := c.SetDeadline(start.Add(o.HeartbeatTimeout + o.HeartbeatInterval)); err != nil {
		return nil, c.IOError("read", err)
	}
	if send {
		m.reqID++
		m.buf = wire.AppendMsg(m.buf[:0], m.reqID, 0, wire.FlagExhaustAllowed, awaitableHello(m.tv, o.HeartbeatInterval))
		m.lastAwait = start
		if err := c.WriteMessage(m.buf); err != nil {
			return nil, err
		}
		m.respTo = m.reqID
	}
	msg, err := c.ReadMessage(m.buf[:0])
	if err != nil {
		return nil, err
	}
	m.buf = msg
	r, err := parseStreamed(msg, m.respTo, c.Hello())
	if err != nil {
		return nil, annotate(m.s.addr, err)
	}
	m.exhaust, m.respTo = r.moreToCome, r.requestID
	if r.err != nil {
		// The specification: a server never streams after ok:0; the
		// connection is closed anyway.
		return nil, r.err
	}
	return r.hello, nil
}

// streamed is one parsed reply of a stream.
type streamed struct {
	hello *upstream.Hello
	// err is the reply's command error (ok:0), or why its hello is
	// unusable; hello is nil then.
	err error
	// moreToCome: another reply follows, answering requestID.
	moreToCome bool
	requestID  int32
}

// parseStreamed parses msg, a whole message read from a streaming
// connection, as a reply to request respTo; hs is the connection's
// handshake reply (see parseHello). Its error is a protocol violation,
// after which nothing more on the connection can be trusted.
func parseStreamed(msg []byte, respTo int32, hs *upstream.Hello) (streamed, error) {
	hd, err := wire.ParseHeader(msg)
	if err != nil {
		return streamed{}, fmt.Errorf("streamed hello reply: %w", err)
	}
	if hd.OpCode != wire.OpMsg {
		return streamed{}, fmt.Errorf("streamed hello reply opcode is %v, want OP_MSG", hd.OpCode)
	}
	if hd.ResponseTo != respTo {
		return streamed{}, fmt.Errorf("streamed hello reply answers %d, want %d", hd.ResponseTo, respTo)
	}
	pm, err := wire.ParseMsg(msg)
	if err != nil {
		return streamed{}, fmt.Errorf("streamed hello reply: %w", err)
	}
	r := streamed{moreToCome: pm.Flags.Has(wire.FlagMoreToCome), requestID: hd.RequestID}
	body := bsoncore.Document(bytes.Clone(pm.Body))
	if r.err = replyError(body); r.err != nil {
		return r, nil
	}
	// A hello we cannot read fails the check as it does when polling.
	r.hello, r.err = parseHello(body, hs)
	return r, nil
}

// annotate makes a reply the monitor could not use a network error, as
// RoundTrip does: the connection must be closed, and a known server is
// checked again at once.
func annotate(addr string, err error) error {
	return &upstream.NetworkError{Addr: addr, Op: "read", Err: fmt.Errorf("%w: %w", upstream.ErrBadReply, err)}
}

// awaitableHello is the request that starts a stream.
func awaitableHello(tv *upstream.TopologyVersion, maxAwait time.Duration) bsoncore.Document {
	tvDoc := bsoncore.NewDocumentBuilder().
		AppendObjectID("processId", tv.ProcessID).
		AppendInt64("counter", tv.Counter).
		Build()
	return bsoncore.NewDocumentBuilder().
		AppendInt32("hello", 1).
		AppendDocument("topologyVersion", tvDoc).
		AppendInt64("maxAwaitTimeMS", maxAwait.Milliseconds()).
		AppendString("$db", "admin").
		Build()
}

// replyError returns a *upstream.CommandError for a reply without ok:1,
// as RoundTrip does for the replies it reads.
func replyError(body bsoncore.Document) error {
	if v, err := body.LookupErr("ok"); err == nil {
		if f, isNum := v.AsFloat64OK(); isNum && f == 1 {
			return nil
		}
		if b, isBool := v.BooleanOK(); isBool && b {
			return nil
		}
	}
	ce := &upstream.CommandError{Message: "hello reply without ok: 1"}
	if n, ok := body.Lookup("code").AsInt64OK(); ok && n == int64(int32(n)) {
		ce.Code = int32(n)
	}
	ce.CodeName, _ = body.Lookup("codeName").StringValueOK()
	if msg, ok := body.Lookup("errmsg").StringValueOK(); ok {
		ce.Message = msg
	}
	return ce
}

// watch closes c when ctx ends, or when the application cancels the check,
// until the returned stop is called; stop reports whether the check was
// cancelled.
//
// Cancelling is the specification's "cancel the monitor check" after an
// application network error: HandleError marks the server Unknown, clears
// its pool and calls RequestCheck. A check requested while a streaming
// check is in progress is otherwise ignored, as the specification says
// (the stream delivers any change anyway); but when the server is Unknown
// because of a network error or a failed connection (cancelsCheck), the
// stream is cut and the server checked again on a new connection after
// MinHeartbeatInterval, rather than left Unknown until the server's next
// reply, up to HeartbeatInterval later.
func (m *monitor) watch(ctx context.Context, c *upstream.Conn) (stop func() (cancelled bool)) {
	done := make(chan struct{})
	result := make(chan bool, 1)
	go func() {
		cancelled := false
		defer func() { result <- cancelled }()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				_ = c.Close()
				return
			case <-m.s.checkNow:
				if cancelsCheck(m.s.Description()) {
					cancelled = true
					_ = c.Close()
					return
				}
			}
		}
	}()
	return func() bool {
		close(done)
		return <-result
	}
}

// cancelsCheck reports whether d is a server the application marked
// Unknown for a reason that cancels a streaming check: a network error
// that is not a timeout, or a failure to establish a connection (SDAM's
// "network error or not completedHandshake"). State-change errors do not:
// the server's own next streamed reply reports the change.
func cancelsCheck(d Description) bool {
	if d.State != Unknown || d.LastError == nil {
		return false
	}
	err := d.LastError
	if errors.As(err, new(*pool.ConnectionError)) || errors.As(err, new(*upstream.ConnectError)) {
		return true
	}
	return upstream.IsNetworkError(err) && !isTimeout(err)
}
