package topology

import (
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/srv"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// Defaults for Options fields left at their zero value. They match the
// defaults drivers use for the equivalent connection-string options.
const (
	DefaultHeartbeatInterval      = 10 * time.Second
	DefaultMinHeartbeatInterval   = 500 * time.Millisecond
	DefaultHeartbeatTimeout       = 10 * time.Second
	DefaultServerSelectionTimeout = 30 * time.Second
	DefaultLocalThreshold         = 15 * time.Millisecond
)

// Selection policy names accepted in Options.Selection.
const (
	SelectLeastBusy  = "least-busy"
	SelectRoundRobin = "round-robin"
)

// Server monitoring modes accepted in Options.MonitoringMode, as in the
// serverMonitoringMode connection-string option.
const (
	MonitoringAuto   = "auto"
	MonitoringStream = "stream"
	MonitoringPoll   = "poll"
)

// Options configures a Topology.
type Options struct {
	// Hosts are the addresses from the route's connection string: a single
	// standalone (or replica-set member, or load balancer), or a list of
	// mongos routers. They are normalized as the dialer reads them: "host"
	// means "host:27017", host names are lowered, and a path is a Unix
	// socket. Server.Address returns the normalized form.
	Hosts []string

	// ReplicaSet is the replica set's name (the connection string's
	// replicaSet): the topology starts as ReplicaSetNoPrimary and only
	// members of that set are kept.
	ReplicaSet string

	// DirectConnection talks to exactly the one host (directConnection):
	// a Single topology, with no discovery.
	DirectConnection bool

	// SRV, when not nil, keeps a mongodb+srv:// host list current while
	// the deployment is a list of mongos routers (or not yet known): its
	// records are resolved again every Interval and hosts added or removed
	// (polling-srv-records-for-mongos-discovery). Hosts are its first
	// resolution. A replica set (ReplicaSet set) or a load balancer is
	// never polled: its members come from discovery.
	SRV *SRVPolling

	// Pool is the template for every server's pool. The topology replaces
	// OnBackgroundError (errors establishing connections in the background are
	// handled like application errors) and, when Logger is nil, gives the
	// pools its own Logger, so that CMAP log messages appear whenever that
	// logger's level allows Debug.
	Pool pool.Options

	// Dialer establishes pool connections.
	Dialer pool.Connector

	// UserDialer, when set, enables user pools (Server.UserPool, for
	// SCRAM pass-through): it returns the connector of one user's pool,
	// which logs in with a. Its connections are otherwise those of Dialer.
	UserDialer func(a upstream.Authenticator) pool.Connector

	// MaxUserConnections caps the connections of each user pool, per
	// server; 0 leaves only Pool.MaxPoolSize.
	MaxUserConnections int

	// MaxDBConnections caps, per server, the connections of the server's
	// main pool and all its user pools together (max_db_connections): a
	// pool.Share per server, whose waits and evictions are pool's. 0 means
	// no cap (the connections are still counted). Change it live with
	// Server.SetMaxDBConnections.
	MaxDBConnections int

	// UserPoolIdleTimeout closes a user pool that nobody has used for
	// that long and that holds no connection in use; 0 keeps user pools
	// until their server leaves.
	UserPoolIdleTimeout time.Duration

	// UserPoolMonitor, when set, gives each user pool its own
	// pool.Monitor (a Monitor tells pools apart by address only, so user
	// pools cannot share the main pool's). nil gives them none.
	UserPoolMonitor func() pool.Monitor

	// MonitorDialer establishes monitoring connections. They are separate from
	// the pool so that a check never waits behind application traffic. The
	// dialer should not authenticate: hello needs no credentials.
	MonitorDialer *upstream.Dialer

	// HeartbeatInterval is the time between two checks of a server.
	// Default 10s; it may not be below MinHeartbeatInterval.
	HeartbeatInterval time.Duration

	// MinHeartbeatInterval rate-limits checks requested out of turn (after an
	// error or a failed selection). Default 500ms, as in SDAM; tests lower it.
	MinHeartbeatInterval time.Duration

	// HeartbeatTimeout bounds connecting the monitoring connection and each
	// hello on it. Default 10s.
	HeartbeatTimeout time.Duration

	// MonitoringMode chooses the server monitoring protocol. "stream" uses
	// the streaming protocol with servers whose hello carries a
	// topologyVersion (MongoDB 4.4 and later): the server pushes its state
	// as it changes over an awaitable hello, and a second connection
	// measures RTT; other servers are polled. "poll" always polls: one
	// connection per server, one hello per HeartbeatInterval. "auto", the
	// default, is "stream": drivers poll in auto mode only on FaaS
	// platforms, where a proxy does not run. Behind a load balancer the
	// monitor always polls.
	MonitoringMode string

	// ServerSelectionTimeout bounds how long SelectServer and WaitHello wait
	// for a usable server. Default 30s.
	ServerSelectionTimeout time.Duration

	// LocalThreshold is the latency window: only servers whose RTT is within
	// this much of the fastest selectable server are candidates. Default
	// 15ms, as in the server-selection specification. A negative value
	// disables the window.
	LocalThreshold time.Duration

	// Selection chooses among several candidate servers: "least-busy" (the
	// default: fewest in-use, pending and waiting checkouts, ties broken by
	// rotation) or "round-robin".
	Selection string

	// OnEvent, if set, receives heartbeat and server-change events (for
	// metrics and tests). It runs on the monitor goroutine, or for
	// ServerChanged on whichever goroutine changed the server (a HandleError
	// caller), with that server's state lock held so that one server's
	// changes arrive in order. It must be fast and must not call
	// Server.HandleError.
	OnEvent func(Event)

	// Logger receives topology logs. Default slog.Default().
	Logger *slog.Logger
}

// SRVPolling says how to poll the SRV records of a mongodb+srv:// route.
type SRVPolling struct {
	// Host is the SRV host name of the connection string.
	Host string
	// Options are srvServiceName and srvMaxHosts.
	Options srv.Options
	// Resolver does the lookups; nil means net.DefaultResolver.
	Resolver srv.Resolver
	// Interval is the rescan interval; 0 means srv.DefaultRescanInterval.
	Interval time.Duration
}

// withDefaults returns a copy of o with zero fields defaulted, or an error
// naming the first invalid field.
func (o Options) withDefaults() (Options, error) {
	if len(o.Hosts) == 0 {
		return o, fmt.Errorf("topology: no hosts")
	}
	seen := make(map[string]bool, len(o.Hosts))
	hosts := make([]string, 0, len(o.Hosts))
	for _, h := range o.Hosts {
		h = strings.TrimSpace(h)
		if h == "" {
			return o, fmt.Errorf("topology: empty host")
		}
		// The dialer's own normalization ("host" gets port 27017, escaped
		// socket paths are unescaped), so that one server is not listed
		// twice under two spellings.
		network, addr := upstream.ParseAddress(h)
		if network == "tcp" {
			host, port, err := net.SplitHostPort(addr)
			if err != nil || host == "" || port == "" {
				return o, fmt.Errorf("topology: host %q is not host:port", h)
			}
			// Host names are case-insensitive; SDAM compares them lowered.
			addr = net.JoinHostPort(strings.ToLower(host), port)
		}
		h = addr
		if seen[h] {
			return o, fmt.Errorf("topology: host %q listed twice", h)
		}
		seen[h] = true
		hosts = append(hosts, h)
	}
	o.Hosts = hosts
	if o.Dialer == nil {
		return o, fmt.Errorf("topology: Dialer is required")
	}
	if o.MonitorDialer == nil {
		return o, fmt.Errorf("topology: MonitorDialer is required")
	}
	if o.MinHeartbeatInterval <= 0 {
		o.MinHeartbeatInterval = DefaultMinHeartbeatInterval
	}
	if o.HeartbeatInterval == 0 {
		o.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if o.HeartbeatInterval < o.MinHeartbeatInterval {
		return o, fmt.Errorf("topology: HeartbeatInterval %v is below the minimum %v", o.HeartbeatInterval, o.MinHeartbeatInterval)
	}
	if o.HeartbeatTimeout < 0 || o.ServerSelectionTimeout < 0 {
		return o, fmt.Errorf("topology: negative timeout")
	}
	if o.HeartbeatTimeout == 0 {
		o.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	if o.ServerSelectionTimeout == 0 {
		o.ServerSelectionTimeout = DefaultServerSelectionTimeout
	}
	if o.LocalThreshold == 0 {
		o.LocalThreshold = DefaultLocalThreshold
	}
	switch o.MonitoringMode {
	case "":
		o.MonitoringMode = MonitoringAuto
	case MonitoringAuto, MonitoringStream, MonitoringPoll:
	default:
		return o, fmt.Errorf("topology: unknown monitoring mode %q (want %q, %q or %q)", o.MonitoringMode, MonitoringAuto, MonitoringStream, MonitoringPoll)
	}
	switch o.Selection {
	case "":
		o.Selection = SelectLeastBusy
	case SelectLeastBusy, SelectRoundRobin:
	default:
		return o, fmt.Errorf("topology: unknown selection policy %q (want %q or %q)", o.Selection, SelectLeastBusy, SelectRoundRobin)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, nil
}
