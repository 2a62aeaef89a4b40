// The RTT monitor: while a server is monitored with the streaming protocol,
// its streamed replies are held back by the server and measure nothing, so a
// second dedicated connection runs a plain hello every HeartbeatInterval and
// feeds the server's RTT average (the latency window of selection). As the
// server monitoring specification requires, its failures publish no event
// and never change the server's state: the stream, or application traffic,
// finds a server that is really gone. It never runs while polling, where the
// checks themselves are the samples.

package topology

import (
	"context"
	"log/slog"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// rttConnID is the connection ID given to the monitor dialer for RTT
// connections (monitoring connections have 0, pooled ones 1 and up).
const rttConnID = -1

// rttMonitor is a running RTT goroutine.
type rttMonitor struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// startRTT starts the RTT goroutine unless it runs already. It stops with
// ctx or stopRTT.
func (m *monitor) startRTT(ctx context.Context) {
	if m.rtt != nil {
		return
	}
	rctx, cancel := context.WithCancel(ctx)
	r := &rttMonitor{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		m.runRTT(rctx)
	}()
	m.rtt = r
}

// stopRTT stops the RTT goroutine, if any, and waits for it: its dial and
// hello are bounded by HeartbeatTimeout and interrupted by the cancel.
func (m *monitor) stopRTT() {
	if m.rtt == nil {
		return
	}
	m.rtt.cancel()
	<-m.rtt.done
	m.rtt = nil
}

// runRTT measures one hello round trip at once and then every
// HeartbeatInterval, dialling its connection again after a failure. The
// dial itself is not a sample: it costs more round trips than a hello (TCP,
// TLS), and the monitor's handshakes are counted already.
func (m *monitor) runRTT(ctx context.Context) {
	s := m.s
	o := &s.topo.opts
	var c *upstream.Conn
	defer func() {
		if c != nil {
			_ = c.Close()
		}
	}()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cctx, cancel := context.WithTimeout(ctx, o.HeartbeatTimeout)
		var err error
		if c == nil {
			c, err = o.MonitorDialer.Dial(cctx, s.addr, rttConnID)
		}
		if err == nil {
			start := time.Now()
			if _, err = c.RoundTrip(cctx, "admin", helloCmd); err == nil {
				m.addRTT(time.Since(start))
			}
		}
		cancel()
		if err != nil {
			if c != nil {
				_ = c.Close()
				c = nil
			}
			if ctx.Err() != nil {
				return
			}
			s.topo.log.Debug("RTT measurement failed",
				slog.String("topology", s.topo.name), slog.String("address", s.addr), slog.Any("error", err))
		}
		t.Reset(o.HeartbeatInterval)
	}
}
