// Package admin is mongobouncer's operator interface: the admin commands
// answered on the virtual "mongobouncer" database over the wire, and the
// admin HTTP listener (/metrics, /healthz, /readyz, /admin/..., /status).
// It reads and steers the running pooler only through Controller.
package admin

import (
	"net"
	"time"
)

// Controller is what the running pooler (internal/app) offers the admin
// interface. Snapshots are plain data, safe to keep and marshal. Methods
// are safe for concurrent use.
type Controller interface {
	// Pools describes every pool: one per route and upstream server (each
	// replica-set member), with the server's role and round-trip time.
	Pools() []PoolInfo
	// Clients describes every connected client.
	Clients() []ClientInfo
	// Servers describes every upstream connection of every pool.
	Servers() []ServerConnInfo
	// Stats returns totals since start.
	Stats() StatsInfo
	// Config returns the effective configuration with secrets redacted,
	// as nested maps/slices of strings, numbers and bools.
	Config() map[string]any
	// Ready reports whether every route can serve a primary read now (a
	// server that takes writes, with a ready pool), and if not, why (one
	// line per route that is not). Lines returned with true are warnings
	// that do not fail readiness; /readyz prints them after "ok".
	Ready() (bool, []string)

	// Pause stops handing out upstream connections for route ("" = every
	// route); requests wait until Resume, in-flight ones finish.
	Pause(route string) error
	// Resume undoes Pause for route ("" = every route).
	Resume(route string) error
	// Reconnect clears the pools of route ("" = every route) gracefully:
	// in-use connections finish their request and are then closed, and new
	// requests get new connections.
	Reconnect(route string) error
	// Reload re-reads the configuration file and applies it; on error the
	// running configuration stays.
	Reload() error
	// Shutdown starts a graceful shutdown and returns at once.
	Shutdown()
}

// PoolInfo is one pool: SHOW POOLS.
type PoolInfo struct {
	Route  string `json:"route" bson:"route"`
	Server string `json:"server" bson:"server"`
	// User is the user ("name@db") of a pass-through route's user pool,
	// "" for the server's own pool.
	User        string `json:"user,omitempty" bson:"user,omitempty"`
	Mode        string `json:"mode" bson:"mode"`     // session | transaction | statement
	State       string `json:"state" bson:"state"`   // paused | ready | closed (CMAP state)
	Paused      bool   `json:"paused" bson:"paused"` // paused by the pause admin command
	Usable      bool   `json:"usable" bson:"usable"` // the server's monitor state
	Generation  uint64 `json:"generation" bson:"generation"`
	Total       int    `json:"total" bson:"total"`
	Available   int    `json:"available" bson:"available"`
	InUse       int    `json:"inUse" bson:"inUse"`
	Pending     int    `json:"pending" bson:"pending"`
	Waiters     int    `json:"waiters" bson:"waiters"`
	MaxPoolSize int    `json:"maxPoolSize" bson:"maxPoolSize"`
	MinPoolSize int    `json:"minPoolSize" bson:"minPoolSize"`
	// Limit is the adaptive limit on connections checked out at once
	// (max_pool_size = "auto"; MaxPoolSize is then its ceiling), 0 for a
	// fixed-size pool.
	Limit int `json:"limit,omitempty" bson:"limit,omitempty"`
	// Checkouts and CheckoutWait total the successful checkouts and their
	// wait since the pool's series began: the difference of two readings
	// gives the mean checkout latency over the time between them.
	Checkouts    uint64        `json:"checkouts" bson:"checkouts"`
	CheckoutWait time.Duration `json:"checkoutWaitNs" bson:"checkoutWaitNs"`
	// Role is what the server is now, one of the Role constants: its
	// type from the last hello, or RoleUnknown while it is unreachable.
	// It changes on a failover.
	Role string `json:"role" bson:"role"`
	// RTTMs is the moving average of the monitor's hello round trips, in
	// milliseconds; 0 before the first.
	RTTMs float64 `json:"rttMs" bson:"rttMs"`
	// LastError is why the server is unknown ("" when it is not), with
	// secrets removed and its length bounded.
	LastError string `json:"lastError" bson:"lastError"`
	// MaxDBConnections is the route's max_db_connections (0: no cap), and
	// DBConnections the connections counted against it on this server,
	// over the server's pool and every user pool of the route (the same
	// on each row of the server). DBWaits counts the times a pool waited
	// for it, DBEvictions the idle connections closed to make room.
	MaxDBConnections int    `json:"maxDbConnections" bson:"maxDbConnections"`
	DBConnections    int    `json:"dbConnections" bson:"dbConnections"`
	DBWaits          uint64 `json:"dbWaits" bson:"dbWaits"`
	DBEvictions      uint64 `json:"dbEvictions" bson:"dbEvictions"`
}

// Server roles as showPools, showServers and the status page name them:
// the SDAM server type in lower case, with "other" and "ghost" for RSOther
// and RSGhost, and RoleUnknown for a server that is not reachable now,
// whatever it was before.
const (
	RolePrimary      = "primary"
	RoleSecondary    = "secondary"
	RoleArbiter      = "arbiter"
	RoleMongos       = "mongos"
	RoleStandalone   = "standalone"
	RoleLoadBalancer = "loadbalancer"
	RoleOther        = "other"
	RoleGhost        = "ghost"
	RoleUnknown      = "unknown"
)

// ClientState is where a client is: idle (no request), waiting (for an
// upstream connection), active (a request in flight), pinned (holding an
// upstream connection between requests).
type ClientState string

// Client states.
const (
	ClientIdle    ClientState = "idle"
	ClientWaiting ClientState = "waiting"
	ClientActive  ClientState = "active"
	ClientPinned  ClientState = "pinned"
)

// ClientInfo is one client: SHOW CLIENTS.
type ClientInfo struct {
	ID           int64       `json:"id" bson:"id"`
	Addr         string      `json:"addr" bson:"addr"`
	AppName      string      `json:"appName" bson:"appName"`
	User         string      `json:"user,omitempty" bson:"user,omitempty"`
	Listener     string      `json:"listener" bson:"listener"`
	ConnectedAt  time.Time   `json:"connectedAt" bson:"connectedAt"`
	State        ClientState `json:"state" bson:"state"`
	PinnedServer string      `json:"pinnedServer,omitempty" bson:"pinnedServer,omitempty"`
	Requests     uint64      `json:"requests" bson:"requests"`
	// LoadBalanced marks a client whose handshake said loadBalanced: true
	// (absent otherwise).
	LoadBalanced bool `json:"loadBalanced,omitempty" bson:"loadBalanced,omitempty"`
}

// ServerConnInfo is one upstream connection: SHOW SERVERS.
type ServerConnInfo struct {
	Route      string    `json:"route" bson:"route"`
	Server     string    `json:"server" bson:"server"`
	ID         int64     `json:"id" bson:"id"`
	State      string    `json:"state" bson:"state"` // pending | available | in use
	Generation uint64    `json:"generation" bson:"generation"`
	CreatedAt  time.Time `json:"createdAt" bson:"createdAt"`
	LastUsed   time.Time `json:"lastUsed" bson:"lastUsed"`
	// Role is the server's role now (see PoolInfo.Role), so that the
	// connections to the primary can be told from the others.
	Role string `json:"role" bson:"role"`
}

// StatsInfo are totals since start: SHOW STATS. Rates are computed by the
// admin package from two snapshots.
type StatsInfo struct {
	Uptime         time.Duration `json:"uptimeNs" bson:"uptimeNs"`
	ClientsCurrent int           `json:"clientsCurrent" bson:"clientsCurrent"`
	ClientsTotal   uint64        `json:"clientsTotal" bson:"clientsTotal"`
	Operations     uint64        `json:"operations" bson:"operations"`
	Errors         uint64        `json:"errors" bson:"errors"`
	BytesIn        uint64        `json:"bytesIn" bson:"bytesIn"`
	BytesOut       uint64        `json:"bytesOut" bson:"bytesOut"`
	WaitAvg        time.Duration `json:"waitAvgNs" bson:"waitAvgNs"`
	WaitP99        time.Duration `json:"waitP99Ns" bson:"waitP99Ns"`
	QueryAvg       time.Duration `json:"queryAvgNs" bson:"queryAvgNs"`
	QueryP99       time.Duration `json:"queryP99Ns" bson:"queryP99Ns"`
	// DBWaits and DBEvictions total, over every route and server, the
	// waits for max_db_connections and the idle connections closed to
	// make room; UserClientRefused counts logins refused by
	// max_user_client_conn.
	DBWaits           uint64 `json:"dbWaits" bson:"dbWaits"`
	DBEvictions       uint64 `json:"dbEvictions" bson:"dbEvictions"`
	UserClientRefused uint64 `json:"userClientRefused" bson:"userClientRefused"`
}

// IsAdminPeer reports whether a peer may run admin commands over the wire:
// loopback TCP peers and unix-socket peers (client auth comes later).
func IsAdminPeer(a net.Addr) bool {
	switch a := a.(type) {
	case *net.UnixAddr:
		return true
	case *net.TCPAddr:
		return a.IP.IsLoopback()
	}
	return false
}
