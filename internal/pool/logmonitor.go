package pool

import (
	"context"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"
)

// Log message texts and reason strings of the spec's "Connection Pool Logging".
var (
	logMessages = [...]string{
		PoolCreated:               "Connection pool created",
		PoolReady:                 "Connection pool ready",
		PoolCleared:               "Connection pool cleared",
		PoolClosed:                "Connection pool closed",
		ConnectionCreated:         "Connection created",
		ConnectionReady:           "Connection ready",
		ConnectionClosed:          "Connection closed",
		ConnectionCheckOutStarted: "Connection checkout started",
		ConnectionCheckOutFailed:  "Connection checkout failed",
		ConnectionCheckedOut:      "Connection checked out",
		ConnectionCheckedIn:       "Connection checked in",
	}
	closedReasons = map[Reason]string{
		ReasonStale:      "Connection became stale because the pool was cleared",
		ReasonIdle:       "Connection has been available but unused for longer than the configured max idle time",
		ReasonError:      "An error occurred while using the connection",
		ReasonPoolClosed: "Connection pool was closed",
	}
	checkOutFailedReasons = map[Reason]string{
		ReasonTimeout:         "Wait queue timeout elapsed without a connection becoming available",
		ReasonConnectionError: "An error occurred while trying to establish a new connection",
		ReasonPoolClosed:      "Connection pool was closed",
	}
)

// defaultPort is the port the spec says to log when the address has none.
const defaultPort = 27017

type logMonitor struct {
	l *slog.Logger
}

// NewLogMonitor returns a Monitor that logs every event as the CMAP spec's "Connection
// Pool Logging" message, at Debug level, with the spec's message texts and keys
// (serverHost, serverPort, driverConnectionId, durationMS, reason, error, serviceId and
// the pool options), plus component=connection (the spec's log component). When the
// logger has Debug disabled an event costs one Enabled call.
//
// Like every Monitor it runs under the pool's lock: give it a handler that does not
// block for long.
func NewLogMonitor(l *slog.Logger) Monitor {
	if l == nil {
		return nil
	}
	return logMonitor{l: l.With(slog.String("component", "connection"))}
}

// HandleEvent logs e.
func (m logMonitor) HandleEvent(e Event) {
	ctx := context.Background()
	if !m.l.Enabled(ctx, slog.LevelDebug) || int(e.Type) >= len(logMessages) || logMessages[e.Type] == "" {
		return
	}
	attrs := make([]slog.Attr, 0, 10)
	host, port, hasPort := splitAddress(e.Address)
	attrs = append(attrs, slog.String("serverHost", host))
	if hasPort {
		attrs = append(attrs, slog.Int("serverPort", port))
	}
	switch e.Type {
	case PoolCreated:
		if o := e.Options; o != nil {
			attrs = append(attrs,
				slog.Int64("maxIdleTimeMS", o.MaxIdleTime.Milliseconds()),
				slog.Int("minPoolSize", o.MinPoolSize),
				slog.Int("maxPoolSize", o.MaxPoolSize),
				slog.Int("maxConnecting", o.MaxConnecting),
				slog.Int64("waitQueueTimeoutMS", o.WaitQueueTimeout.Milliseconds()))
		}
	case PoolCleared:
		if e.HasServiceID {
			attrs = append(attrs, slog.String("serviceId", e.ServiceID.Hex()))
		}
	case ConnectionCreated, ConnectionCheckedIn:
		attrs = append(attrs, slog.Int64("driverConnectionId", e.ConnectionID))
	case ConnectionReady, ConnectionCheckedOut:
		attrs = append(attrs, slog.Int64("driverConnectionId", e.ConnectionID), durationMS(e.Duration))
	case ConnectionClosed:
		attrs = append(attrs, slog.Int64("driverConnectionId", e.ConnectionID), slog.String("reason", closedReasons[e.Reason]))
		if e.Reason == ReasonError && e.Err != nil {
			attrs = append(attrs, slog.String("error", e.Err.Error()))
		}
	case ConnectionCheckOutFailed:
		attrs = append(attrs, slog.String("reason", checkOutFailedReasons[e.Reason]))
		if e.Reason == ReasonConnectionError && e.Err != nil {
			attrs = append(attrs, slog.String("error", e.Err.Error()))
		}
		attrs = append(attrs, durationMS(e.Duration))
	}
	m.l.LogAttrs(ctx, slog.LevelDebug, logMessages[e.Type], attrs...)
}

// durationMS converts a duration to the spec's durationMS (a float, in milliseconds).
func durationMS(d time.Duration) slog.Attr {
	return slog.Float64("durationMS", float64(d)/float64(time.Millisecond))
}

// splitAddress splits a pool address into the spec's serverHost and serverPort. A
// Unix domain socket path has no port; a host without a port gets the default port.
func splitAddress(addr string) (host string, port int, hasPort bool) {
	if strings.HasPrefix(addr, "/") || strings.HasSuffix(addr, ".sock") {
		return addr, 0, false
	}
	h, ps, err := net.SplitHostPort(addr)
	if err != nil {
		return strings.Trim(addr, "[]"), defaultPort, true
	}
	n, err := strconv.Atoi(ps)
	if err != nil {
		return h, 0, false
	}
	return h, n, true
}
