// The server monitor: one goroutine per server checks it with hello over a
// dedicated connection and reports each outcome to the Server (markUsable,
// failed, addRTTSample, events). It speaks the two protocols of the
// server monitoring specification:
//
//   - Polling (this file): hello every HeartbeatInterval, or sooner when a
//     check is requested, at most every MinHeartbeatInterval. Used with
//     servers whose hello has no topologyVersion (FerretDB, MongoDB before
//     4.4), with MonitoringMode "poll", and behind a load balancer.
//   - Streaming (monitor_stream.go): an awaitable hello with exhaustAllowed,
//     after which the server pushes a reply whenever its topology changes
//     and at least every HeartbeatInterval. A second connection then
//     measures round-trip times (rtt.go), since streamed replies wait on
//     the server and say nothing about the network.
//
// Failures follow the specification ("Network or command error during
// server check"): the server is marked Unknown and its pool cleared
// (interrupting in-use connections after a timeout), and when a network
// error (or a timeout) hit a server that was known, the next check starts
// at once on a new connection, so a dropped monitoring connection costs a
// moment out of rotation, not a heartbeat interval.
package topology

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/sdam"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// EventType names a topology event.
type EventType int

// Event types, modelled on the SDAM monitoring events.
const (
	// HeartbeatStarted: a check is about to run.
	HeartbeatStarted EventType = iota
	// HeartbeatSucceeded: a check succeeded; Duration is its round trip.
	HeartbeatSucceeded
	// HeartbeatFailed: a check failed with Err after Duration.
	HeartbeatFailed
	// ServerChanged: the server's State or Kind changed.
	ServerChanged
)

// String returns the event type's name.
func (t EventType) String() string {
	switch t {
	case HeartbeatStarted:
		return "HeartbeatStarted"
	case HeartbeatSucceeded:
		return "HeartbeatSucceeded"
	case HeartbeatFailed:
		return "HeartbeatFailed"
	case ServerChanged:
		return "ServerChanged"
	}
	return fmt.Sprintf("EventType(%d)", int(t))
}

// Event is delivered to Options.OnEvent.
type Event struct {
	Type     EventType
	Topology string
	Address  string
	// Duration of the check (heartbeat succeeded or failed). For an awaited
	// check it includes the time the server waited before replying, so it
	// is no round-trip time.
	Duration time.Duration
	// Awaited is set on the heartbeat events of the streaming protocol,
	// whose replies the server holds back until its topology changes or
	// HeartbeatInterval passes (the SDAM events' "awaited" field).
	Awaited bool
	// Err is the check's error (HeartbeatFailed) or the new description's
	// LastError (ServerChanged).
	Err error
	// Previous and New are set for ServerChanged.
	Previous, New *Description
}

func (s *Server) emit(e Event) {
	if f := s.topo.opts.OnEvent; f != nil {
		e.Topology = s.topo.name
		e.Address = s.addr
		f(e)
	}
}

// errCheckCancelled is the HeartbeatFailed error of a streaming check that
// an application error cancelled (see cancelsCheck).
var errCheckCancelled = errors.New("topology: check cancelled after an application network error")

// monitor is the state of one server's monitor goroutine. Only that
// goroutine touches it.
// The monitoring connection itself stays in Server.mconn.
type monitor struct {
	s *Server
	// stream allows the streaming protocol (MonitoringMode, and not behind
	// a load balancer).
	stream bool
	// tv is the topologyVersion of the latest successful check, nil when
	// the server sent none: then the server is polled.
	tv *upstream.TopologyVersion

	// exhaust is set while the monitoring connection carries an exhaust
	// stream: the next check reads the next reply rather than sending.
	exhaust bool
	// reqID numbers the awaitable hellos; respTo is the request ID the
	// next streamed reply must answer (each streamed reply answers the
	// previous one's ID).
	reqID, respTo int32
	// lastAwait is when the latest awaitable hello was sent.
	lastAwait time.Time
	// buf is the streaming read and write scratch.
	buf []byte

	// rtt runs while the server is streamed; nil otherwise.
	rtt *rttMonitor
}

// checkResult is the outcome of one check.
type checkResult struct {
	hello *upstream.Hello
	err   error
	// dur is the check's duration; for a new connection, the whole dial.
	dur time.Duration
	// awaited: a streaming check.
	awaited bool
	// timeout: the check timed out (network timeout or heartbeat timeout).
	timeout bool
	// cancelled: an application error cancelled a streaming check.
	cancelled bool
}

// monitor runs the server's check loop until ctx is cancelled.
func (s *Server) monitor(ctx context.Context) {
	o := &s.topo.opts
	m := &monitor{s: s, stream: o.MonitoringMode != MonitoringPoll && !o.Pool.LoadBalanced}
	defer m.stop()
	timer := time.NewTimer(o.HeartbeatInterval)
	timer.Stop()
	defer timer.Stop()
	// retried is set while the immediate re-check after a failure on a
	// known server is under way, so that it happens once.
	retried := false
	for {
		start := time.Now()
		r := m.check(ctx)
		if ctx.Err() != nil {
			return
		}
		switch {
		case r.err == nil:
			retried = false
			m.succeeded(r)
			// After check has published its outcome: whoever sees
			// Checked sees the hello too.
			s.checked.Store(true)
			if m.streaming() {
				// The streaming protocol: no sleep, the next check
				// waits on the server.
				m.startRTT(ctx)
				continue
			}
			m.stopRTT()
		case r.cancelled:
			// HandleError marked the server Unknown and cleared its pool,
			// and asked for the check that will find it again: after
			// MinHeartbeatInterval, on a new connection.
			m.closeConn()
			s.emit(Event{Type: HeartbeatFailed, Duration: r.dur, Awaited: true, Err: errCheckCancelled})
			timer.Reset(o.MinHeartbeatInterval)
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
			continue
		default:
			m.closeConn()
			again := m.failed(r)
			s.checked.Store(true)
			if again && !retried {
				retried = true
				continue
			}
			m.stopRTT()
		}
		if !m.wait(ctx, timer, start) {
			return
		}
	}
}

// wait sleeps until HeartbeatInterval after start, or until a check is
// requested and MinHeartbeatInterval after start has passed. It returns
// false when ctx ends.
func (m *monitor) wait(ctx context.Context, timer *time.Timer, start time.Time) bool {
	o := &m.s.topo.opts
	timer.Reset(time.Until(start.Add(o.HeartbeatInterval)))
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	case <-m.s.checkNow:
	}
	// A requested check: honour the rate limit counted from the last
	// check's start. (Since Go 1.23, Reset discards a pending expiry.)
	if d := time.Until(start.Add(o.MinHeartbeatInterval)); d > 0 {
		timer.Reset(d)
		select {
		case <-ctx.Done():
			return false
		case <-timer.C:
		}
	}
	return true
}

// check runs the next check of whichever protocol applies.
func (m *monitor) check(ctx context.Context) checkResult {
	switch {
	case m.s.mconn == nil:
		return m.dial(ctx)
	case m.exhaust:
		return m.streamCheck(ctx, false)
	case m.stream && m.tv != nil:
		return m.streamCheck(ctx, true)
	}
	return m.poll(ctx)
}

// streaming reports whether the next check continues the streaming
// protocol.
func (m *monitor) streaming() bool {
	return m.exhaust || (m.stream && m.tv != nil)
}

// dial establishes the monitoring connection. Its handshake reply is the
// check's result and its duration an RTT sample.
func (m *monitor) dial(ctx context.Context) checkResult {
	s := m.s
	o := &s.topo.opts
	s.emit(Event{Type: HeartbeatStarted})
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, o.HeartbeatTimeout)
	c, err := o.MonitorDialer.Dial(cctx, s.addr, monitorConnID)
	cancel()
	r := checkResult{dur: time.Since(start)}
	if err != nil {
		r.timeout, r.err = heartbeatError(cctx, err, o.HeartbeatTimeout)
		return r
	}
	s.mconn = c
	m.exhaust = false
	if r.hello = c.Hello(); r.hello == nil {
		r.err = errors.New("topology: monitoring connection has no hello reply")
		return r
	}
	m.addRTT(r.dur)
	return r
}

// poll runs one hello on the monitoring connection.
func (m *monitor) poll(ctx context.Context) checkResult {
	s := m.s
	o := &s.topo.opts
	s.emit(Event{Type: HeartbeatStarted})
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, o.HeartbeatTimeout)
	reply, err := s.mconn.RoundTrip(cctx, "admin", helloCmd)
	cancel()
	r := checkResult{dur: time.Since(start)}
	if err == nil {
		r.hello, err = parseHello(reply, s.mconn.Hello())
	}
	if err != nil {
		r.timeout, r.err = heartbeatError(cctx, err, o.HeartbeatTimeout)
		return r
	}
	m.addRTT(r.dur)
	return r
}

// heartbeatError names the heartbeat timeout in err when it is what ended
// the check, and reports whether the check timed out.
func heartbeatError(cctx context.Context, err error, limit time.Duration) (timeout bool, _ error) {
	expired := cctx.Err() == context.DeadlineExceeded
	if expired && !isTimeout(err) {
		err = fmt.Errorf("%w (heartbeat timeout %v)", err, limit)
	}
	return expired || isTimeout(err), err
}

// succeeded publishes a successful check.
func (m *monitor) succeeded(r checkResult) {
	m.s.emit(Event{Type: HeartbeatSucceeded, Duration: r.dur, Awaited: r.awaited})
	m.s.markUsable(r.hello)
	m.tv = r.hello.TopologyVersion
}

// failed publishes a failed check as sdam.CheckFailed decides: the server
// is marked Unknown and its pool cleared (interrupting in-use connections
// after a timeout). It reports whether the next check should start at
// once (a network error on a server that was known).
func (m *monitor) failed(r checkResult) bool {
	s := m.s
	o := &s.topo.opts
	m.tv = nil
	s.emit(Event{Type: HeartbeatFailed, Duration: r.dur, Awaited: r.awaited, Err: r.err})
	attrs := []any{slog.String("topology", s.topo.name), slog.String("address", s.addr),
		slog.Duration("duration", r.dur), slog.Bool("awaited", r.awaited), slog.Bool("timeout", r.timeout),
		slog.Any("error", r.err)}
	if prev := s.Description(); prev.State == Usable || prev.LastError == nil || failureClass(prev.LastError) != failureClass(r.err) {
		s.topo.log.Warn("server check failed", attrs...)
	} else {
		// The same failure again: its text differs from the last one's by
		// the monitoring connection's local port, or by which of a timeout
		// and the close it caused was seen first, so comparing messages
		// would log at every heartbeat.
		s.topo.log.Debug("server check failed", attrs...)
	}
	kind := sdam.CommandError
	switch {
	case r.timeout:
		kind = sdam.NetworkTimeout
	case upstream.IsNetworkError(r.err):
		kind = sdam.NetworkError
	}
	cur := s.Description().SDAM
	cur.Address = s.addr // none before the server's first description
	a := sdam.CheckFailed(cur, kind, r.err)
	if !o.Pool.LoadBalanced {
		// No SDAM behind a load balancer: a failed check says nothing
		// about the backend the next connection will reach.
		s.topo.update(s, a.Unknown, nil, a.ClearPool, a.InterruptInUse)
	}
	return a.CheckAgainNow
}

// stop releases everything when the monitor exits.
func (m *monitor) stop() {
	m.stopRTT()
	m.closeConn()
}

// closeConn closes the monitoring connection; the next check dials anew.
func (m *monitor) closeConn() {
	m.exhaust = false
	m.s.closeMonitorConn()
}

// addRTT records an RTT sample.
func (m *monitor) addRTT(d time.Duration) { m.s.addRTTSample(d) }

// monitorConnID is the connection ID given to the monitor dialer. Pools
// number their connections from 1, so 0 tells monitoring connections apart
// in the dialer's logs.
const monitorConnID = 0

// helloCmd is the check. The handshake already used hello, so the server
// supports it; the legacy isMaster is never needed.
var helloCmd = bsoncore.NewDocumentBuilder().AppendInt32("hello", 1).Build()

func (s *Server) closeMonitorConn() {
	if s.mconn != nil {
		_ = s.mconn.Close()
		s.mconn = nil
	}
}

// failureClass groups check failures that are the same problem seen again:
// any timeout (a hung server times out in the dial or in the hello, as the
// machine's load decides), else the error's type and a connection error's
// stage.
func failureClass(err error) string {
	if isTimeout(err) {
		return "timeout"
	}
	var ce *upstream.ConnectError
	if errors.As(err, &ce) {
		return "connect " + ce.Stage
	}
	return fmt.Sprintf("%T", err)
}
