// Package config holds mongobouncer's configuration: plain data loaded from a
// TOML file (Load, Parse), checked by Validate, and resolved per route by
// Routes.
//
// A file has one [mongobouncer] table of global settings and one
// [databases.<name>] table per route; see docs/configuration.md for every
// key. Settings a route may override are the pool and limit keys gathered in
// Pool. For each route the value in force is found by this precedence,
// highest first:
//
//  1. the key in the route's own table ([databases.<name>]);
//  2. the matching option in the route's connection string
//     (maxPoolSize, minPoolSize, maxIdleTimeMS, maxConnecting,
//     waitQueueTimeoutMS, connectTimeoutMS, heartbeatFrequencyMS,
//     serverSelectionTimeoutMS, appName, readPreference,
//     readPreferenceTags, maxStalenessSeconds, localThresholdMS);
//  3. the key in [mongobouncer];
//  4. the built-in default (Default).
//
// Parse starts from Default and overlays the file, so levels 3 and 4 are
// both already in Config.Global. A Config built in code should start from
// Default too: the zero Config is safe to use and to validate, but
// Validate reports its zero values that are not valid settings (no routes,
// max_connecting 0, empty pool_mode, ...).
//
// The package does no I/O except reading the file in Load, and starts no
// goroutines.
package config

import (
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// CatchAll is the route name that serves every database without a route of
// its own, including admin.
const CatchAll = "*"

// Bounds on max_message_size. The upper bound is the MongoDB server's
// maxMessageSizeBytes: no server sends or accepts a larger message, so a
// higher limit would only let clients make the pooler buffer more. The lower
// bound keeps the handshake and authentication exchanges (a hello request
// with up to 512 bytes of client metadata plus speculative authentication,
// and an upstream hello reply listing every replica-set member) well inside
// the limit; below it the pooler could not even greet a driver.
const (
	MinMaxMessageSize = 16 * 1024
	MaxMaxMessageSize = 48_000_000
	// FullDocumentMessageSize is the smallest max_message_size that still
	// carries a maximum-size (16 MiB) BSON document with the 16 KiB of
	// headroom servers allow in replies. Smaller values are accepted, but
	// clients and servers then cannot exchange the largest documents.
	FullDocumentMessageSize = 16*1024*1024 + 16*1024
)

// MinHeartbeatInterval is the smallest heartbeat_interval accepted: the
// server discovery and monitoring spec's minHeartbeatFrequencyMS. Checking a
// server more often only adds load.
const MinHeartbeatInterval = 500 * time.Millisecond

// DefaultHelloMaxAwait is hello_max_await's default. A mongos answers a
// streaming driver's hello at its maxAwaitTimeMS (10 s by default); one
// second bounds how long a driver with the plain URI behind a balancer
// takes a draining instance's 91 for the whole balancer's (measured: a
// 5.8-6.7 s stall of every operation with 10 s, docs/performance.md), for
// one small reply a second per monitoring connection.
const DefaultHelloMaxAwait = time.Second

// MinHelloMaxAwait and MaxHelloMaxAwait bound hello_max_await: the
// specification's minHeartbeatFrequencyMS, and the proxy's own cap.
const (
	MinHelloMaxAwait = 500 * time.Millisecond
	MaxHelloMaxAwait = time.Minute
)

// MaxShutdownDelay bounds shutdown_delay: a balancer's health check takes
// seconds to act, and a longer pause only holds the exit.
const MaxShutdownDelay = 5 * time.Minute

// DefaultTLSWatchInterval is tls_watch_interval's default: cert-manager
// renews well ahead of expiry, so half a minute is prompt, and reading a
// few small files that often costs nothing.
const DefaultTLSWatchInterval = 30 * time.Second

// DefaultAuthMaxLookups is auth_max_lookups' default (auth's
// DefaultMaxLookups), and MaxAuthMaxLookups its bound: each lookup running
// holds an upstream connection.
const (
	DefaultAuthMaxLookups = 16
	MaxAuthMaxLookups     = 1024
)

// DefaultMaxSCRAMIterations is max_scram_iterations' default (auth's and
// upstream's DefaultMaxIterations), and MaxMaxSCRAMIterations its bound:
// 10 million rounds hold a CPU for seconds per login.
const (
	DefaultMaxSCRAMIterations = 100_000
	MaxMaxSCRAMIterations     = 10_000_000
)

// MaxEventLoopThreads bounds event_loop_threads: each thread has its own
// epoll set and its own P, so more threads than CPUs only add switching.
const MaxEventLoopThreads = 256

// MaxEventLoopSpin bounds event_loop_spin: a spin longer than an upstream
// round trip on one host buys nothing and burns a core.
const MaxEventLoopSpin = time.Millisecond

// MaxAppNameBytes is the longest app_name accepted: the handshake spec caps
// client.application.name at 128 bytes and servers reject longer names.
const MaxAppNameBytes = 128

// PoolMode says when a client's upstream connection returns to the pool.
type PoolMode string

// Pool modes.
const (
	// PoolModeSession pins an upstream connection to a client for the
	// client's whole connection.
	PoolModeSession PoolMode = "session"
	// PoolModeTransaction returns the upstream connection after each
	// command outside a transaction, and after the commit or abort of a
	// transaction.
	PoolModeTransaction PoolMode = "transaction"
	// PoolModeStatement returns the upstream connection after every
	// command and its complete reply; a transaction keeps its server, not
	// a connection.
	PoolModeStatement PoolMode = "statement"
)

// Valid reports whether m is one of the defined pool modes.
func (m PoolMode) Valid() bool {
	switch m {
	case PoolModeSession, PoolModeTransaction, PoolModeStatement:
		return true
	}
	return false
}

// LogLevel is the lowest level of messages written to the log.
type LogLevel string

// Log levels.
const (
	LogLevelDebug LogLevel = "debug"
	LogLevelInfo  LogLevel = "info"
	LogLevelWarn  LogLevel = "warn"
	LogLevelError LogLevel = "error"
)

// Valid reports whether l is one of the defined log levels.
func (l LogLevel) Valid() bool {
	switch l {
	case LogLevelDebug, LogLevelInfo, LogLevelWarn, LogLevelError:
		return true
	}
	return false
}

// Level maps l to its slog level; an invalid level maps to slog.LevelInfo.
func (l LogLevel) Level() slog.Level {
	switch l {
	case LogLevelDebug:
		return slog.LevelDebug
	case LogLevelWarn:
		return slog.LevelWarn
	case LogLevelError:
		return slog.LevelError
	}
	return slog.LevelInfo
}

// LogFormat selects the log handler.
type LogFormat string

// Log formats.
const (
	// LogFormatText writes slog's key=value text lines.
	LogFormatText LogFormat = "text"
	// LogFormatJSON writes one JSON object per line.
	LogFormatJSON LogFormat = "json"
)

// Valid reports whether f is one of the defined log formats.
func (f LogFormat) Valid() bool {
	return f == LogFormatText || f == LogFormatJSON
}

// EventLoopIO is the event loop's I/O interface (event_loop_io).
type EventLoopIO string

// Event-loop I/O interfaces.
const (
	// EventLoopIOAuto uses io_uring where the kernel allows it, else epoll.
	EventLoopIOAuto EventLoopIO = "auto"
	// EventLoopIOEpoll uses epoll and read system calls.
	EventLoopIOEpoll EventLoopIO = "epoll"
	// EventLoopIOUring requires io_uring: startup fails where it is
	// unavailable.
	EventLoopIOUring EventLoopIO = "io_uring"
)

// Valid reports whether io is one of the defined interfaces; empty means
// auto.
func (io EventLoopIO) Valid() bool {
	return io == "" || io == EventLoopIOAuto || io == EventLoopIOEpoll || io == EventLoopIOUring
}

// AuthType says how clients log in to mongobouncer (auth_type).
type AuthType string

// Client authentication types.
const (
	// AuthNone lets every client in without logging in (the default).
	AuthNone AuthType = "none"
	// AuthSCRAM makes clients log in with SCRAM-SHA-256 or SCRAM-SHA-1 as
	// a user of the auth_file.
	AuthSCRAM AuthType = "scram"
	// AuthX509 logs clients in by their verified TLS client certificate.
	AuthX509 AuthType = "x509"
)

// Valid reports whether t is one of the defined types; empty means none.
func (t AuthType) Valid() bool {
	return t == "" || t == AuthNone || t == AuthSCRAM || t == AuthX509
}

// TLSMode says whether clients connect to mongobouncer with TLS (tls_mode).
type TLSMode string

// Client TLS modes.
const (
	// TLSModeDisable serves plain connections only (the default).
	TLSModeDisable TLSMode = "disable"
	// TLSModeAllow serves TLS and plain clients on the same listeners,
	// told apart by the first bytes they send.
	TLSModeAllow TLSMode = "allow"
	// TLSModeRequire serves TLS clients only; a plain client gets an error
	// reply and is disconnected.
	TLSModeRequire TLSMode = "require"
)

// Valid reports whether m is one of the defined modes; empty means
// disable.
func (m TLSMode) Valid() bool {
	return m == "" || m == TLSModeDisable || m == TLSModeAllow || m == TLSModeRequire
}

// Serves reports whether m serves TLS clients (allow or require); empty
// means disable.
func (m TLSMode) Serves() bool { return m == TLSModeAllow || m == TLSModeRequire }

// Pool holds the pool and limit settings. Global carries the values for
// every route; a Route may override each of them (see Overrides), and
// EffectiveRoute carries the values in force for one route.
type Pool struct {
	// PoolMode says when an upstream connection returns to the pool
	// (pool_mode).
	PoolMode PoolMode
	// MaxPoolSize caps the upstream connections per server, in use or
	// idle; 0 means no limit (max_pool_size, maxPoolSize). PoolSizeAuto
	// (max_pool_size = "auto") lets an adaptive limit decide how many may
	// be checked out at once, between MinPoolSize and MaxPoolSizeCeiling.
	MaxPoolSize int
	// MaxPoolSizeCeiling is the highest limit and the cap on connections
	// per server when MaxPoolSize is PoolSizeAuto; ignored otherwise
	// (max_pool_size_ceiling).
	MaxPoolSizeCeiling int
	// MinPoolSize is the number of upstream connections per server the
	// pool keeps open even when idle (min_pool_size, minPoolSize).
	MinPoolSize int
	// MaxIdleTime closes upstream connections idle for longer; 0 keeps
	// them (max_idle_time, maxIdleTimeMS).
	MaxIdleTime time.Duration
	// MaxConnecting caps the upstream connections being established at
	// once per server; at least 1 (max_connecting, maxConnecting).
	MaxConnecting int
	// WaitQueueTimeout bounds how long a client command waits for an
	// upstream connection before it fails; 0 waits until the client goes
	// away (wait_queue_timeout, waitQueueTimeoutMS).
	WaitQueueTimeout time.Duration
	// HeartbeatInterval is the time between checks of each upstream
	// server (heartbeat_interval, heartbeatFrequencyMS).
	HeartbeatInterval time.Duration
	// ConnectTimeout bounds establishing one upstream connection,
	// handshake and authentication included (connect_timeout,
	// connectTimeoutMS).
	ConnectTimeout time.Duration
	// ServerSelectionTimeout bounds the wait for a suitable upstream
	// server (server_selection_timeout, serverSelectionTimeoutMS).
	ServerSelectionTimeout time.Duration
	// ClientIdleTimeout closes client connections idle for longer; 0 keeps
	// them (client_idle_timeout).
	ClientIdleTimeout time.Duration
	// MaxMessageSize bounds every wire message in either direction, in
	// bytes; an upstream advertising a smaller maxMessageSizeBytes wins at
	// run time (max_message_size).
	MaxMessageSize int
	// AppName is the application name mongobouncer gives upstream servers
	// in its handshake (app_name, appName).
	AppName string
	// ReadPreference is the mode server selection uses for the route's
	// reads on a replica set (read_preference, readPreference).
	ReadPreference ReadPreferenceMode
	// ReadPreferenceTags are the tag sets that narrow the eligible
	// secondaries, tried in order; an empty set matches any server, nil
	// means none (read_preference_tags, readPreferenceTags).
	ReadPreferenceTags []map[string]string
	// MaxStaleness excludes secondaries estimated to lag the primary by
	// more; 0 means no maximum (max_staleness, maxStalenessSeconds).
	MaxStaleness time.Duration
	// LocalThreshold is the latency window: servers whose round-trip time
	// is within it of the fastest eligible one are all candidates
	// (local_threshold, localThresholdMS).
	LocalThreshold time.Duration
	// MaxUserConnections caps one user's upstream connections per server
	// on a pass-through route (max_user_connections); 0 leaves only
	// max_pool_size, which caps each user's pool as it caps the route's.
	MaxUserConnections int
	// MaxDBConnections caps, per upstream server, the route's connections
	// over its service pool and all its user pools together
	// (max_db_connections, as PgBouncer's); 0 means no cap. A user whose
	// request waits at the cap gets the slot of another user's idle
	// connection, which is closed.
	MaxDBConnections int
}

// PoolSizeAuto is the MaxPoolSize of max_pool_size = "auto". It cannot be
// written as a number: the parser refuses negative sizes.
const PoolSizeAuto = -1

// DefaultMaxPoolSizeCeiling is max_pool_size_ceiling's default.
const DefaultMaxPoolSizeCeiling = 100

// AutoPoolSize reports whether p's pool size is adaptive.
func (p Pool) AutoPoolSize() bool { return p.MaxPoolSize == PoolSizeAuto }

// Global is the [mongobouncer] table.
type Global struct {
	// Listen is the address clients connect to: host:port, or a unix
	// socket path (starting with / or ending in .sock).
	Listen string
	// AdminListen is the address of the admin HTTP listener; "" disables
	// it.
	AdminListen string
	// MaxClientConn caps the client connections across all listeners; 0
	// means no limit.
	MaxClientConn int
	// MaxUserClientConn caps the client connections logged in as one user
	// (auth.UserID), across all listeners; 0 means no limit
	// (max_user_client_conn, as PgBouncer's).
	MaxUserClientConn int
	// MaxPreLoginMessageSize bounds, with client authentication, each
	// message of a client that has not logged in, and the size a
	// compressed one declares (max_prelogin_message_size).
	MaxPreLoginMessageSize int
	// LogLevel is the lowest level logged.
	LogLevel LogLevel
	// LogFormat selects text or JSON logs.
	LogFormat LogFormat
	// EventLoop serves idle clients and plain requests on a few event-loop
	// threads instead of a goroutine per client (Linux; event_loop, on by
	// default).
	EventLoop bool
	// EventLoopThreads is the number of event-loop threads
	// (event_loop_threads); 0 means one per CPU that Go schedules on
	// (GOMAXPROCS at startup). The binary runs with one P more than this
	// (docs/performance.md).
	EventLoopThreads int
	// EventLoopIO chooses how the event loop waits and reads
	// (event_loop_io): io_uring where available (auto, the default and
	// the zero value), epoll, or io_uring required.
	EventLoopIO EventLoopIO
	// EventLoopSpin bounds how long an io_uring loop thread waits awake,
	// polling its ring, for the reply to its one request in flight, and
	// the average reply delay under which it does (event_loop_spin); 0
	// never spins.
	EventLoopSpin time.Duration
	// SoReuseport sets SO_REUSEPORT on every TCP listener (client and
	// admin; so_reuseport, Linux only), so that a new process can bind the
	// same addresses while the old one drains. Restart only.
	SoReuseport bool
	// ShutdownTimeout bounds how long shutdown waits for in-flight
	// commands before closing connections; 0 closes them at once.
	ShutdownTimeout time.Duration
	// HelloMaxAwait (hello_max_await) is the longest a client's awaitable
	// hello waits without a change before mongobouncer answers it (at
	// most its maxAwaitTimeMS): a streaming driver's heartbeat interval.
	HelloMaxAwait time.Duration
	// ShutdownDelay (shutdown_delay) is how long a graceful shutdown
	// serves as usual, with /readyz answering 503, before its drain
	// begins: a balancer that health-checks /readyz takes the instance out
	// first, so that no new connection reaches it while it drains (what a
	// preStop pause does in Kubernetes). 0 (the default) drains at once.
	ShutdownDelay time.Duration
	// UpstreamCommandTimeout bounds the commands mongobouncer sends
	// upstream on its own (upstream_command_timeout): the abortTransaction
	// for a client that disconnects inside a transaction, and the fence
	// after a request sent with moreToCome.
	UpstreamCommandTimeout time.Duration
	// AuthType says how clients log in (auth_type): none, scram or x509.
	AuthType AuthType
	// AuthFile is the users file (auth_file), relative to the
	// configuration file's directory unless absolute; see AuthFilePath.
	// It is read again on reload.
	AuthFile string
	// AuthUser ("user@db", auth_user) is who mongobouncer logs in upstream
	// as to look up users missing from the auth_file; its password must be
	// in the auth_file. "" looks nobody up.
	AuthUser string
	// AuthUserServiceRoutes (auth_user_service_routes) allows auth_user
	// with routes that log in upstream as a service user, where every
	// user the lookup finds acts with the service user's rights; without
	// it validation refuses the combination.
	AuthUserServiceRoutes bool
	// AuthMaxLookups (auth_max_lookups) bounds the auth_user lookups
	// running at once, each an upstream connection and login.
	AuthMaxLookups int
	// AdminUsers ("user@db", admin_users) may run the admin commands once
	// clients log in.
	AdminUsers []string
	// AuthCacheTTL keeps the credentials an auth_user lookup found this
	// long (auth_cache_ttl): how long a password changed or a user
	// dropped upstream keeps working at most, when no failed login looks
	// the user up again first. Users found missing are kept at most as
	// long (30s). Reloadable.
	AuthCacheTTL time.Duration
	// AuthLookupsPerPeer bounds the auth_user lookups one client address
	// starts at once (auth_lookups_per_peer). Reloadable.
	AuthLookupsPerPeer int
	// MaxSCRAMIterations (max_scram_iterations) bounds the SCRAM
	// iteration count of the credentials mongobouncer accepts (auth_file,
	// auth_user lookups) and that an upstream may ask of it when it logs
	// in: each login derives keys that many rounds. Read at start.
	MaxSCRAMIterations int
	// TLSMode says whether clients connect with TLS (tls_mode).
	TLSMode TLSMode
	// TLSCertFile and TLSKeyFile are the PEM certificate (chain) and
	// private key mongobouncer presents to TLS clients (tls_cert_file,
	// tls_key_file); required unless TLSMode is disable.
	TLSCertFile string
	TLSKeyFile  string
	// TLSCAFile, when set, makes client certificates required: they must
	// be signed by a CA in this PEM file (tls_ca_file).
	TLSCAFile string
	// UserPoolIdleTimeout closes a pass-through route's pool of one user
	// on one server once unused that long (user_pool_idle_timeout); 0
	// keeps user pools until their server leaves.
	UserPoolIdleTimeout time.Duration
	// TLSHandshakeTimeout bounds a client's TLS handshake, and how long
	// mongobouncer waits for a new client's first bytes to tell TLS from
	// plain (tls_handshake_timeout); 0 means 10s.
	TLSHandshakeTimeout time.Duration
	// TLSWatchInterval is how often the client TLS files (tls_cert_file,
	// tls_key_file, tls_ca_file) and the routes' upstream TLS files are
	// read to find a certificate rotated on disk (tls_watch_interval); 0
	// turns the watch off. Reloadable.
	TLSWatchInterval time.Duration
	// ClientLoginTimeout closes a client that sends no whole first
	// message that long after connecting, or (with client authentication)
	// has not logged in and stays silent that long, or leaves a SASL
	// conversation or a message unfinished that long
	// (client_login_timeout); 0 turns it off. Reloadable.
	ClientLoginTimeout time.Duration
	// Pool holds the defaults for every route.
	Pool
}

// Overrides are a route's own values for the settings in Pool. A nil field
// means the route inherits the value (see the package documentation for the
// precedence).
type Overrides struct {
	PoolMode               *PoolMode            // pool_mode
	MaxPoolSize            *int                 // max_pool_size (PoolSizeAuto for "auto")
	MaxPoolSizeCeiling     *int                 // max_pool_size_ceiling
	MinPoolSize            *int                 // min_pool_size
	MaxIdleTime            *time.Duration       // max_idle_time
	MaxConnecting          *int                 // max_connecting
	WaitQueueTimeout       *time.Duration       // wait_queue_timeout
	HeartbeatInterval      *time.Duration       // heartbeat_interval
	ConnectTimeout         *time.Duration       // connect_timeout
	ServerSelectionTimeout *time.Duration       // server_selection_timeout
	ClientIdleTimeout      *time.Duration       // client_idle_timeout
	MaxMessageSize         *int                 // max_message_size
	AppName                *string              // app_name
	ReadPreference         *ReadPreferenceMode  // read_preference
	ReadPreferenceTags     *[]map[string]string // read_preference_tags
	MaxStaleness           *time.Duration       // max_staleness
	LocalThreshold         *time.Duration       // local_threshold
	MaxUserConnections     *int                 // max_user_connections
	MaxDBConnections       *int                 // max_db_connections
}

// Route is one [databases.<name>] table: where commands for a database go.
type Route struct {
	// ConnectionString names the upstream deployment. It is a URI so that
	// printing a Route never shows the password.
	ConnectionString URI
	// Listen, when not "", is a listener dedicated to this route: every
	// client connecting there is served by this route, whatever database
	// its commands name.
	Listen string
	// PassThrough (pass_through) says whether the route logs in upstream
	// as each client's own user (SCRAM pass-through). nil means the
	// default: yes when auth_type = "scram" and the connection string has
	// no credentials. false forwards such a route's requests
	// unauthenticated (an upstream without authentication).
	PassThrough *bool
	// Overrides are the route's own pool and limit settings.
	Overrides
}

// Config is a whole configuration.
type Config struct {
	// Global is the [mongobouncer] table.
	Global Global
	// Databases maps a database name, or CatchAll, to its route.
	Databases map[string]Route
	// Path is the file the configuration came from, or "".
	Path string

	// src locates keys in the file Parse read, so that problems found
	// later by Validate still name file:line. Nil for a Config built in
	// code.
	src *source
}

// Default returns the built-in defaults. It has no routes, so it does not
// validate until at least one is added.
//
// WaitQueueTimeout defaults to 30s although CMAP's default is to wait
// forever: a pooler's clients are other programs' drivers, and a command
// stuck behind an exhausted pool should fail with a clear error on the same
// scale as a driver's own server selection timeout (30s), long enough to
// ride out a replica-set election, rather than hang until the client's
// socket timeout (often none).
func Default() Config {
	return Config{Global: Global{
		Listen:                 "127.0.0.1:27017",
		AdminListen:            "",
		MaxClientConn:          10000,
		MaxPreLoginMessageSize: 64 * 1024,
		LogLevel:               LogLevelInfo,
		LogFormat:              LogFormatText,
		ShutdownTimeout:        30 * time.Second,
		HelloMaxAwait:          DefaultHelloMaxAwait,
		UpstreamCommandTimeout: 5 * time.Second,
		EventLoop:              true,
		EventLoopIO:            EventLoopIOAuto,
		EventLoopSpin:          150 * time.Microsecond,
		AuthType:               AuthNone,
		AuthMaxLookups:         DefaultAuthMaxLookups,
		TLSMode:                TLSModeDisable,
		TLSHandshakeTimeout:    10 * time.Second,
		TLSWatchInterval:       DefaultTLSWatchInterval,
		UserPoolIdleTimeout:    10 * time.Minute,
		AuthCacheTTL:           30 * time.Second,
		AuthLookupsPerPeer:     4,
		MaxSCRAMIterations:     DefaultMaxSCRAMIterations,
		ClientLoginTimeout:     60 * time.Second,
		Pool: Pool{
			PoolMode:               PoolModeTransaction,
			MaxPoolSize:            100,
			MaxPoolSizeCeiling:     DefaultMaxPoolSizeCeiling,
			MinPoolSize:            0,
			MaxIdleTime:            0,
			MaxConnecting:          2,
			WaitQueueTimeout:       30 * time.Second,
			HeartbeatInterval:      10 * time.Second,
			ConnectTimeout:         10 * time.Second,
			ServerSelectionTimeout: 30 * time.Second,
			ClientIdleTimeout:      0,
			MaxMessageSize:         MaxMaxMessageSize,
			AppName:                "mongobouncer",
			ReadPreference:         ReadPrimary,
			LocalThreshold:         DefaultLocalThreshold,
		},
	}}
}

// AuthFilePath returns the auth_file's path: AuthFile as written when it
// is absolute or when the configuration came from no file, else relative
// to the configuration file's directory. "" when there is none.
func (c Config) AuthFilePath() string {
	f := c.Global.AuthFile
	if f == "" || filepath.IsAbs(f) || c.Path == "" {
		return f
	}
	return filepath.Join(filepath.Dir(c.Path), f)
}

// SplitUser splits "user@db" at its last @ (user names may hold one, and a
// database named here cannot), the rule of the auth_file's users
// (auth.ParseUserID); ok is false when either part is empty. The two parts
// are the user; the string is not: "a@b@c" is never user "a" on "b@c".
func SplitUser(s string) (user, db string, ok bool) {
	i := strings.LastIndexByte(s, '@')
	if i <= 0 || i == len(s)-1 {
		return "", "", false
	}
	return s[:i], s[i+1:], true
}

// URI is a connection string as written in the configuration. Its String,
// GoString and LogValue methods hide the password and other secrets, so a
// Config can be printed or logged whole; convert it with string(u) to get
// the secret text.
type URI string

// String returns the connection string with secrets masked.
func (u URI) String() string { return redactURI(string(u)) }

// GoString returns the connection string with secrets masked, quoted, so
// that %#v does not print secrets either.
func (u URI) GoString() string { return strconv.Quote(u.String()) }

// LogValue returns the connection string with secrets masked.
func (u URI) LogValue() slog.Value { return slog.StringValue(u.String()) }

// Parse parses the connection string; see ParseConnString.
func (u URI) Parse() (ConnString, error) { return ParseConnString(string(u)) }

// Listener networks returned by SplitListen.
const (
	NetworkTCP  = "tcp"
	NetworkUnix = "unix"
)

// maxUnixPath is the longest unix socket path Linux accepts: sun_path holds
// 108 bytes including the terminating NUL.
const maxUnixPath = 107

// SplitListen turns a listen address from the configuration into the
// network and address net.Listen expects. An address that starts with / or
// ends in .sock is a unix socket path; anything else must be host:port with
// a numeric port (0 picks a free port; an empty host listens on every
// interface; IPv6 hosts go in brackets). Errors wrap ErrInvalidValue.
func SplitListen(addr string) (network, address string, err error) {
	network, reason := splitListen(addr)
	if reason != "" {
		return "", "", fmt.Errorf("%w: listen address: %s", ErrInvalidValue, reason)
	}
	return network, addr, nil
}

// splitListen returns the network of addr, or why addr is not valid.
func splitListen(addr string) (network, reason string) {
	if addr == "" {
		return "", "empty"
	}
	if strings.ContainsFunc(addr, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return "", "contains control characters"
	}
	if strings.HasPrefix(addr, "/") || strings.HasSuffix(addr, ".sock") {
		if len(addr) > maxUnixPath {
			return "", fmt.Sprintf("the unix socket path is %d bytes, the limit is %d", len(addr), maxUnixPath)
		}
		return NetworkUnix, ""
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", "use host:port (IPv6 as [::1]:27017) or a unix socket path ending in .sock"
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return "", fmt.Sprintf("the port must be a number from 0 to 65535, as in %s", net.JoinHostPort(host, "27017"))
	}
	if strings.ContainsAny(host, " \t[]/") {
		return "", fmt.Sprintf("%q is not a host name or IP address", host)
	}
	if strings.Contains(host, ":") && net.ParseIP(stripZone(host)) == nil {
		return "", fmt.Sprintf("%q is not an IPv6 address", host)
	}
	return NetworkTCP, ""
}

// stripZone drops an IPv6 zone (%eth0) so the address itself can be parsed.
func stripZone(host string) string {
	if i := strings.IndexByte(host, '%'); i >= 0 {
		return host[:i]
	}
	return host
}
