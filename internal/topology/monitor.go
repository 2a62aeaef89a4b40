package topology

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

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
	// Duration of the check (heartbeat succeeded or failed).
	Duration time.Duration
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

// monitor runs the server's check loop until ctx is cancelled.
func (s *Server) monitor(ctx context.Context) {
	defer s.closeMonitorConn()
	o := &s.topo.opts
	timer := time.NewTimer(o.HeartbeatInterval)
	timer.Stop()
	defer timer.Stop()
	for {
		wasUsable := s.State() == Usable
		start := time.Now()
		err := s.check(ctx)
		if ctx.Err() != nil {
			return
		}
		// After check has published its outcome: whoever sees Checked
		// sees the hello or the error too.
		s.checked.Store(true)
		// SDAM: a network error on a server that was known is retried at
		// once, so one dropped monitoring connection (a restarted mongos, an
		// idle timeout on a firewall) does not cost a heartbeat interval.
		if err != nil && wasUsable && (upstream.IsNetworkError(err) || isTimeout(err)) {
			continue
		}
		timer.Reset(time.Until(start.Add(o.HeartbeatInterval)))
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
			continue
		case <-s.checkNow:
		}
		// A requested check: honour the rate limit counted from the last
		// check's start. (Since Go 1.23, Reset discards a pending expiry.)
		if wait := time.Until(start.Add(o.MinHeartbeatInterval)); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				return
			case <-timer.C:
			}
		}
	}
}

// check runs one hello on the monitoring connection (dialling it first if
// needed) and updates the server from the outcome. It returns the check's
// error; nothing is changed if ctx was cancelled (the topology is closing).
func (s *Server) check(ctx context.Context) error {
	o := &s.topo.opts
	s.emit(Event{Type: HeartbeatStarted})
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, o.HeartbeatTimeout)
	h, dialled, err := s.hello(cctx)
	cancel()
	d := time.Since(start)
	if ctx.Err() != nil {
		if err == nil && dialled {
			// Nothing else will close it if the loop stops now.
			s.closeMonitorConn()
		}
		return ctx.Err()
	}
	if err != nil {
		s.closeMonitorConn()
		if cctx.Err() == context.DeadlineExceeded && !isTimeout(err) {
			err = fmt.Errorf("%w (heartbeat timeout %v)", err, o.HeartbeatTimeout)
		}
		timeout := isTimeout(err) || cctx.Err() == context.DeadlineExceeded
		s.emit(Event{Type: HeartbeatFailed, Duration: d, Err: err})
		if prev := s.Description(); prev.State == Usable || prev.LastError == nil || prev.LastError.Error() != err.Error() {
			s.topo.log.Warn("server check failed",
				slog.String("topology", s.topo.name), slog.String("address", s.addr),
				slog.Duration("duration", d), slog.Bool("timeout", timeout), slog.Any("error", err))
		}
		if o.Pool.LoadBalanced {
			// No SDAM behind a load balancer: a failed check says nothing
			// about the backend the next connection will reach.
			return err
		}
		// SDAM: clear on network and command errors alike, and interrupt
		// in-use connections after a timeout: operations on them are most
		// likely stuck behind the same problem.
		s.markUnknown(err, true, timeout)
		return err
	}
	s.addRTTSample(d)
	s.emit(Event{Type: HeartbeatSucceeded, Duration: d})
	s.markUsable(h)
	return nil
}

// hello returns a hello reply from the server, dialling a monitoring
// connection if there is none (its handshake reply is the check's result).
func (s *Server) hello(ctx context.Context) (h *upstream.Hello, dialled bool, err error) {
	if s.mconn == nil {
		c, err := s.topo.opts.MonitorDialer.Dial(ctx, s.addr, monitorConnID)
		if err != nil {
			return nil, false, err
		}
		s.mconn = c
		h = c.Hello()
		if h == nil {
			return nil, true, errors.New("topology: monitoring connection has no hello reply")
		}
		return h, true, nil
	}
	reply, err := s.mconn.RoundTrip(ctx, "admin", helloCmd)
	if err != nil {
		return nil, false, err
	}
	h, err = parseHello(reply, s.mconn.Hello())
	return h, false, err
}

// monitorConnID is the connection ID given to the monitor dialer. Pools
// number their connections from 1, so 0 tells monitoring connections apart
// in the dialer's logs.
const monitorConnID = 0

// helloCmd is the check. The handshake already used hello, so the server
// supports it; the legacy isMaster is never needed.
var helloCmd = bsoncore.NewDocumentBuilder().AppendInt32("hello", 1).Build()

// helloBool reads a boolean field from the raw hello reply.
func helloBool(h *upstream.Hello, key string) bool {
	if h == nil || len(h.Raw) == 0 {
		return false
	}
	v, err := bsoncore.Document(h.Raw).LookupErr(key)
	if err != nil {
		return false
	}
	b, ok := v.BooleanOK()
	return ok && b
}

func (s *Server) closeMonitorConn() {
	if s.mconn != nil {
		_ = s.mconn.Close()
		s.mconn = nil
	}
}

// cancelCheck interrupts the monitor's check in progress, if any, after an
// application error said the server's connections are likely dead (SDAM).
// The polling monitor has nothing to cancel: its next check, requested at
// once, dials anew if the connection broke.
func (s *Server) cancelCheck() {}
