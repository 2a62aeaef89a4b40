package config

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Validate checks every setting and reports all problems at once, joined
// (see Problems). It works on any Config: one from Parse (problems then
// name file:line) or one built in code, which should start from Default.
func (c Config) Validate() error {
	v := validator{c: &c}
	v.global()
	v.routes()
	v.listeners()
	return joinProblems(v.problems)
}

// Warnings lists what the routes' connection strings warn about (see
// ConnString.Warnings), each naming the file and line of the
// connection_string, in route order, then what the client TLS keys warn
// about (ErrTLSWarning). The configuration is valid despite them: the
// application logs them when it starts and when it reloads. Strings that
// do not parse are Validate's business and are skipped here.
func (c Config) Warnings() []*Error {
	var out []*Error
	file := c.Path
	if c.src != nil {
		file = c.src.file
	}
	for _, name := range routeNames(c.Databases) {
		cs, err := c.Databases[name].ConnectionString.Parse()
		if err != nil {
			continue
		}
		path := []string{tableDatabases, name, "connection_string"}
		e, _ := c.src.lookup(path)
		warn := func(w string) {
			out = append(out, &Error{
				File: file, Line: e.pos.line, Column: e.pos.column, Key: dotted(path),
				Msg: describe(path, "") + ": " + w, Err: ErrConnStringWarning,
			})
		}
		for _, w := range cs.Warnings {
			warn(w)
		}
		if len(cs.AppOptions) > 0 {
			// Names only: the values are the application's business.
			names := make([]string, 0, len(cs.AppOptions))
			for k := range cs.AppOptions {
				names = append(names, uriOptions[k].name)
			}
			slices.Sort(names)
			what := "option " + names[0] + " is"
			if len(names) > 1 {
				what = "options " + strings.Join(names, ", ") + " are"
			}
			warn(what + " ignored: a driver applies them itself (in its commands, its retries or its sockets), " +
				"so each client's own settings hold through mongobouncer, which does not apply these to its upstream connections")
		}
	}
	return append(out, c.tlsWarnings(file)...)
}

// tlsWarnings warns about tls_mode = "allow" with tls_ca_file: the CA makes
// a client certificate required of TLS clients only, and plain clients,
// which present none, still connect. Whoever sets a CA usually means every
// client to need a certificate, which takes tls_mode = "require".
func (c Config) tlsWarnings(file string) []*Error {
	g := c.Global
	if g.TLSMode != TLSModeAllow || g.TLSCAFile == "" {
		return nil
	}
	path := []string{tableGlobal, "tls_mode"}
	e, _ := c.src.lookup(path)
	return []*Error{{
		File: file, Line: e.pos.line, Column: e.pos.column, Key: dotted(path),
		Msg: `tls_mode = "allow" with tls_ca_file: TLS clients must present a certificate signed by tls_ca_file, ` +
			`but plain clients connect without any certificate; set tls_mode = "require" to require certificates of every client`,
		Err: ErrTLSWarning,
	}}
}

// validator collects the problems of one Config.
type validator struct {
	c        *Config
	problems []*Error
}

// add records a problem about the key at path.
func (v *validator) add(path []string, category error, msg string) {
	e, _ := v.c.src.lookup(path)
	file := v.c.Path
	if v.c.src != nil {
		file = v.c.src.file
	}
	v.problems = append(v.problems, &Error{
		File: file, Line: e.pos.line, Column: e.pos.column,
		Key: dotted(path), Msg: msg, Err: category,
	})
}

func (v *validator) global() {
	g := &v.c.Global
	at := func(key string) []string { return []string{tableGlobal, key} }
	if reason := listenReason(g.Listen); reason != "" {
		v.add(at("listen"), ErrInvalidValue, fmt.Sprintf("listen = %s: %s", quote(g.Listen), reason))
	}
	if g.AdminListen != "" {
		if reason := listenReason(g.AdminListen); reason != "" {
			v.add(at("admin_listen"), ErrInvalidValue, fmt.Sprintf("admin_listen = %s: %s", quote(g.AdminListen), reason))
		}
	}
	if g.EventLoopThreads < 0 || g.EventLoopThreads > MaxEventLoopThreads {
		v.add(at("event_loop_threads"), ErrInvalidValue, fmt.Sprintf("event_loop_threads = %d: must be 0 (one per CPU) to %d", g.EventLoopThreads, MaxEventLoopThreads))
	}
	if !g.EventLoopIO.Valid() {
		v.add(at("event_loop_io"), ErrInvalidValue, enumMsg("event_loop_io", string(g.EventLoopIO), "auto", "epoll", "io_uring"))
	}
	if g.EventLoopSpin < 0 || g.EventLoopSpin > MaxEventLoopSpin {
		v.add(at("event_loop_spin"), ErrInvalidValue, fmt.Sprintf("event_loop_spin = %s: must be 0 (never spin) to %s", quote(g.EventLoopSpin.String()), MaxEventLoopSpin))
	}
	if g.SoReuseport && runtime.GOOS != "linux" {
		// Elsewhere SO_REUSEPORT means something else (macOS: the last
		// socket bound takes every connection; FreeBSD: no balancing
		// without SO_REUSEPORT_LB), and no upgrade procedure is tested.
		v.add(at("so_reuseport"), ErrInvalidValue, "so_reuseport = true: supported on Linux only")
	}
	if g.MaxClientConn < 0 {
		v.add(at("max_client_conn"), ErrInvalidValue, fmt.Sprintf("max_client_conn = %d: must be 0 (no limit) or more", g.MaxClientConn))
	}
	if g.MaxUserClientConn < 0 {
		v.add(at("max_user_client_conn"), ErrInvalidValue, fmt.Sprintf("max_user_client_conn = %d: must be 0 (no limit) or more", g.MaxUserClientConn))
	}
	if g.MaxPreLoginMessageSize < MinMaxMessageSize || g.MaxPreLoginMessageSize > MaxMaxMessageSize {
		v.add(at("max_prelogin_message_size"), ErrInvalidValue, fmt.Sprintf("max_prelogin_message_size = %d: must be from %d to %d bytes", g.MaxPreLoginMessageSize, MinMaxMessageSize, MaxMaxMessageSize))
	}
	if !g.LogLevel.Valid() {
		v.add(at("log_level"), ErrInvalidValue, enumMsg("log_level", string(g.LogLevel), "debug", "info", "warn", "error"))
	}
	if !g.LogFormat.Valid() {
		v.add(at("log_format"), ErrInvalidValue, enumMsg("log_format", string(g.LogFormat), "text", "json"))
	}
	if g.UpstreamCommandTimeout <= 0 {
		v.add(at("upstream_command_timeout"), ErrInvalidValue, fmt.Sprintf("upstream_command_timeout = %s: must be positive", quote(g.UpstreamCommandTimeout.String())))
	}
	if g.ShutdownTimeout < 0 {
		v.add(at("shutdown_timeout"), ErrInvalidValue, fmt.Sprintf("shutdown_timeout = %s: must not be negative", quote(g.ShutdownTimeout.String())))
	}
	if g.HelloMaxAwait < MinHelloMaxAwait || g.HelloMaxAwait > MaxHelloMaxAwait {
		v.add(at("hello_max_await"), ErrInvalidValue, fmt.Sprintf("hello_max_await = %s: must be %s to %s", quote(g.HelloMaxAwait.String()), MinHelloMaxAwait, MaxHelloMaxAwait))
	}
	if g.ShutdownDelay < 0 || g.ShutdownDelay > MaxShutdownDelay {
		v.add(at("shutdown_delay"), ErrInvalidValue, fmt.Sprintf("shutdown_delay = %s: must be 0s to %s", quote(g.ShutdownDelay.String()), MaxShutdownDelay))
	}
	v.auth()
	v.clientTLS()
	show := func(key string) string { return key + " = " + poolValue(g.Pool, key) }
	for _, is := range poolIssues(g.Pool) {
		v.add(at(is.keys[0]), is.category(), is.msg(show))
	}
}

// auth checks the client authentication keys. Whether auth_user's
// password is in the auth_file is checked where the file is read (the
// application), since this package reads no file but the configuration.
func (v *validator) auth() {
	g := &v.c.Global
	at := func(key string) []string { return []string{tableGlobal, key} }
	if !g.AuthType.Valid() {
		v.add(at("auth_type"), ErrInvalidValue, enumMsg("auth_type", string(g.AuthType), "none", "scram", "x509"))
		return
	}
	if g.AuthType == AuthX509 && (g.TLSCAFile == "" || g.TLSMode == TLSModeDisable || g.TLSMode == "") {
		v.add(at("auth_type"), ErrInvalidValue, `auth_type = "x509" logs clients in by their verified TLS certificates: set tls_mode = "require" and tls_ca_file (the CA that signs the client certificates)`)
	}
	if g.AuthType == AuthSCRAM && g.AuthFile == "" {
		v.add(at("auth_type"), ErrInvalidValue, `auth_type = "scram" needs an auth_file: add auth_file = "users.txt" (lines of "user@db" "secret"; see mongobouncer hash-password)`)
	}
	if g.AuthUser != "" {
		if _, _, ok := SplitUser(g.AuthUser); !ok {
			v.add(at("auth_user"), ErrInvalidValue, fmt.Sprintf("auth_user = %s: write user@db, db being the user's authentication database", quote(g.AuthUser)))
		} else if g.AuthType != AuthSCRAM {
			v.add(at("auth_user"), ErrInvalidValue, `auth_user looks users up for auth_type = "scram" only: set auth_type = "scram" or remove auth_user`)
		}
	}
	if g.AuthMaxLookups < 1 || g.AuthMaxLookups > MaxAuthMaxLookups {
		v.add(at("auth_max_lookups"), ErrInvalidValue, fmt.Sprintf("auth_max_lookups = %d: must be 1 to %d (default %d)", g.AuthMaxLookups, MaxAuthMaxLookups, DefaultAuthMaxLookups))
	}
	for _, u := range g.AdminUsers {
		if _, _, ok := SplitUser(u); !ok {
			v.add(at("admin_users"), ErrInvalidValue, fmt.Sprintf("admin_users: %s is not user@db", quote(u)))
		}
	}
	if g.AuthCacheTTL <= 0 || g.AuthCacheTTL > 24*time.Hour {
		v.add(at("auth_cache_ttl"), ErrInvalidValue, fmt.Sprintf(`auth_cache_ttl = %s: must be above 0 and at most "24h" (how long a password changed upstream keeps working at most)`, quote(g.AuthCacheTTL.String())))
	}
	if g.MaxSCRAMIterations < 4096 || g.MaxSCRAMIterations > MaxMaxSCRAMIterations {
		v.add(at("max_scram_iterations"), ErrInvalidValue, fmt.Sprintf("max_scram_iterations = %d: must be 4096 (the smallest count drivers accept) to %d (default %d)", g.MaxSCRAMIterations, MaxMaxSCRAMIterations, DefaultMaxSCRAMIterations))
	}
	if g.AuthLookupsPerPeer < 1 || g.AuthLookupsPerPeer > 1024 {
		v.add(at("auth_lookups_per_peer"), ErrInvalidValue, fmt.Sprintf("auth_lookups_per_peer = %d: must be between 1 and 1024", g.AuthLookupsPerPeer))
	}
	if g.UserPoolIdleTimeout < 0 {
		v.add(at("user_pool_idle_timeout"), ErrInvalidValue, fmt.Sprintf(`user_pool_idle_timeout = %s: must not be negative ("0s" keeps user pools)`, quote(g.UserPoolIdleTimeout.String())))
	}
	if g.ClientLoginTimeout < 0 {
		v.add(at("client_login_timeout"), ErrInvalidValue, fmt.Sprintf(`client_login_timeout = %s: must not be negative ("0s" turns it off)`, quote(g.ClientLoginTimeout.String())))
	}
}

// passThrough checks a route's pass_through against the client logins and
// its connection string: pass-through logs in as the client's SCRAM user,
// so it needs SCRAM logins and no service user of its own.
func (v *validator) passThrough(name string, r Route, cs ConnString) {
	v.authUserServiceRoute(name, r, cs)
	if r.PassThrough == nil || !*r.PassThrough {
		return
	}
	at := []string{tableDatabases, name, "pass_through"}
	switch {
	case v.c.Global.AuthType != AuthSCRAM:
		v.add(at, ErrInvalidValue, `pass_through = true logs in upstream as each client's SCRAM user: set auth_type = "scram" in [mongobouncer], or remove pass_through`)
	case cs.HasCredentials():
		v.add(at, ErrInvalidValue, `pass_through = true, but the connection_string has credentials (a service user): remove them to log in as each client's user, or remove pass_through to log in as the service user`)
	}
}

// authUserServiceRoute refuses auth_user with a route that logs in
// upstream as its service user, unless auth_user_service_routes opts in:
// auth_user makes every user of every database upstream a mongobouncer
// user, and on such a route each of them acts with the service user's
// rights, not its own.
func (v *validator) authUserServiceRoute(name string, r Route, cs ConnString) {
	g := &v.c.Global
	if g.AuthUser == "" || g.AuthType != AuthSCRAM || g.AuthUserServiceRoutes ||
		!cs.HasCredentials() || passThrough(g.AuthType, cs, r.PassThrough) {
		return
	}
	v.add([]string{tableDatabases, name, "connection_string"}, ErrInvalidValue, fmt.Sprintf(
		"%s logs in upstream as a service user (its connection_string has credentials), and auth_user lets every user "+
			"the upstream has log in to mongobouncer: on this route each of them would act with the service user's rights, "+
			"not its own. Remove the credentials (pass-through: each client acts as itself upstream), or, if every upstream "+
			"user may act as the service user, set auth_user_service_routes = true in [mongobouncer]",
		tableName([]string{tableDatabases, name})))
}

// clientTLS checks the tls_* keys: a mode that serves TLS needs a
// certificate and its key, and files given with TLS disabled are refused,
// since whoever wrote them expects clients to be able to use TLS.
func (v *validator) clientTLS() {
	g := &v.c.Global
	at := func(key string) []string { return []string{tableGlobal, key} }
	if !g.TLSMode.Valid() {
		v.add(at("tls_mode"), ErrInvalidValue, enumMsg("tls_mode", string(g.TLSMode), "disable", "allow", "require"))
		return
	}
	files := []struct{ key, val string }{{"tls_cert_file", g.TLSCertFile}, {"tls_key_file", g.TLSKeyFile}, {"tls_ca_file", g.TLSCAFile}}
	if g.TLSMode == TLSModeDisable || g.TLSMode == "" {
		for _, f := range files {
			if f.val != "" {
				v.add(at(f.key), ErrInvalidValue, fmt.Sprintf(`%s is set but tls_mode = "disable": set tls_mode = "require" (or "allow") to serve TLS, or remove %s`, f.key, f.key))
			}
		}
	} else {
		for _, f := range files[:2] {
			if f.val == "" {
				v.add(at("tls_mode"), ErrInvalidValue, fmt.Sprintf("tls_mode = %s needs %s: the PEM file of the server's %s", quote(string(g.TLSMode)), f.key,
					map[string]string{"tls_cert_file": "certificate", "tls_key_file": "private key"}[f.key]))
			}
		}
	}
	if g.TLSHandshakeTimeout < 0 {
		v.add(at("tls_handshake_timeout"), ErrInvalidValue, fmt.Sprintf(`tls_handshake_timeout = %s: must not be negative, as in "10s"`, quote(g.TLSHandshakeTimeout.String())))
	}
	if g.TLSWatchInterval < 0 {
		v.add(at("tls_watch_interval"), ErrInvalidValue, fmt.Sprintf(`tls_watch_interval = %s: must not be negative, as in "30s" ("0s" turns the watch off)`, quote(g.TLSWatchInterval.String())))
	}
}

// listenReason says why addr cannot be listened on, or returns "".
func listenReason(addr string) string {
	if addr == "" {
		return `empty: give an address such as "127.0.0.1:27017"`
	}
	_, reason := splitListen(addr)
	return reason
}

// enumMsg explains a value outside a fixed set, suggesting the closest.
func enumMsg(key, got string, allowed ...string) string {
	msg := fmt.Sprintf("%s = %s: must be one of %s", key, quote(got), strings.Join(allowed, ", "))
	if s := suggest(got, allowed); s != "" {
		msg += fmt.Sprintf(" (did you mean %q?)", s)
	}
	return msg
}

func (v *validator) routes() {
	if len(v.c.Databases) == 0 {
		v.add([]string{tableDatabases}, ErrInvalidValue,
			`no routes: add a [databases."*"] table with a connection_string for every database, or [databases.<name>] for one`)
		return
	}
	seen := make(map[string]string) // lowercased name -> name
	for _, name := range routeNames(v.c.Databases) {
		r := v.c.Databases[name]
		table := []string{tableDatabases, name}
		at := func(key string) []string { return []string{tableDatabases, name, key} }

		if reason := routeNameReason(name); reason != "" {
			v.add(table, ErrInvalidValue, fmt.Sprintf("route name %q: %s", name, reason))
		} else if other, dup := seen[strings.ToLower(name)]; dup {
			v.add(table, ErrInvalidValue, fmt.Sprintf("routes %s and %s differ only in case, which MongoDB does not allow for database names: keep one",
				tableName([]string{tableDatabases, other}), tableName(table)))
		}
		seen[strings.ToLower(name)] = name

		var cs ConnString
		if r.ConnectionString == "" {
			v.add(at("connection_string"), ErrInvalidValue, fmt.Sprintf(`%s has no connection_string: add connection_string = "mongodb://host:27017/"`, tableName(table)))
		} else {
			var err error
			if cs, err = r.ConnectionString.Parse(); err != nil {
				// The problem wraps the parse error itself, so errors.Is
				// finds ErrConnString.
				reason := strings.TrimPrefix(err.Error(), ErrConnString.Error()+": ")
				v.add(at("connection_string"), err, describe(at("connection_string"), "")+": "+reason)
				cs = ConnString{}
			}
		}

		if r.Listen != "" {
			if reason := listenReason(r.Listen); reason != "" {
				v.add(at("listen"), ErrInvalidValue, fmt.Sprintf("%s: %s", describe(at("listen"), quote(r.Listen)), reason))
			}
		}

		v.passThrough(name, r, cs)
		pool, origins := resolve(v.c.Global.Pool, cs, r.Overrides)
		show := func(key string) string {
			switch origins[key] {
			case FromRoute:
				return describe(at(key), poolValue(pool, key))
			case FromConnString:
				return fmt.Sprintf("%s=%s in the connection_string of %s", connStringOption(key), optionValue(pool, key), tableName(table))
			}
			return fmt.Sprintf("%s = %s (from [mongobouncer])", key, poolValue(pool, key))
		}
		for _, is := range poolIssues(pool) {
			// Report where the route can fix it; a problem made only of
			// global values was reported once for [mongobouncer].
			for _, k := range is.keys {
				switch origins[k] {
				case FromRoute:
					v.add(at(k), is.category(), is.msg(show))
				case FromConnString:
					v.add(at("connection_string"), is.category(), is.msg(show))
				default:
					continue
				}
				break
			}
		}
	}
}

// routeNameReason says why name cannot name a route, or returns "". Names
// follow MongoDB's rules for database names on Linux.
func routeNameReason(name string) string {
	switch {
	case name == CatchAll:
		return ""
	case name == "":
		return `empty: use a database name, or "*" for every database`
	case len(name) >= 64:
		return fmt.Sprintf("%d bytes long: database names are shorter than 64 bytes", len(name))
	case strings.ContainsAny(name, "/\\. \"$\x00"):
		return `database names cannot contain / \ . space " $ or NUL`
	}
	return ""
}

// poolIssue is one problem with a set of pool values. keys are the keys
// involved, the one to fix first; msg renders the message given how to show
// each key with its value.
type poolIssue struct {
	keys []string
	msg  func(show func(key string) string) string
	// cause is the error of the package that owns the rule broken (sdam's
	// *ReadPrefError), or nil; errors.Is sees it beside ErrInvalidValue.
	cause error
}

// category is what the issue's *Error unwraps to: ErrInvalidValue, and
// the cause when there is one.
func (is poolIssue) category() error {
	if is.cause == nil {
		return ErrInvalidValue
	}
	return errors.Join(ErrInvalidValue, is.cause)
}

// poolIssues checks pool values, alone and together.
func poolIssues(p Pool) []poolIssue {
	var out []poolIssue
	one := func(key, problem string) {
		out = append(out, poolIssue{keys: []string{key}, msg: func(show func(string) string) string {
			return show(key) + ": " + problem
		}})
	}
	if !p.PoolMode.Valid() {
		problem := "must be one of session, transaction, statement"
		if s := suggest(string(p.PoolMode), []string{"session", "transaction", "statement"}); s != "" {
			problem += fmt.Sprintf(" (did you mean %q?)", s)
		}
		one("pool_mode", problem)
	}
	if p.MaxPoolSize < 0 && !p.AutoPoolSize() {
		one("max_pool_size", `must be 0 (no limit) or more, or "auto"`)
	}
	if p.MaxPoolSizeCeiling < 1 {
		one("max_pool_size_ceiling", "must be at least 1 (100 is the default)")
	}
	if p.AutoPoolSize() && p.MinPoolSize > p.MaxPoolSizeCeiling && p.MaxPoolSizeCeiling >= 1 {
		out = append(out, poolIssue{keys: []string{"min_pool_size", "max_pool_size_ceiling"}, msg: func(show func(string) string) string {
			return show("min_pool_size") + " is greater than " + show("max_pool_size_ceiling") +
				`: with max_pool_size = "auto" the limit moves between them`
		}})
	}
	if p.AutoPoolSize() && p.PoolMode == PoolModeSession {
		// The limiter learns from how long a connection is held; in session
		// mode that is a client's whole session, not an operation.
		one("max_pool_size", `"auto" needs pool_mode transaction or statement: in session mode a connection is held for a whole client session, which says nothing about the server's latency`)
	}
	if p.MinPoolSize < 0 {
		one("min_pool_size", "must be 0 or more")
	}
	if p.MaxPoolSize > 0 && p.MinPoolSize > p.MaxPoolSize {
		out = append(out, poolIssue{keys: []string{"min_pool_size", "max_pool_size"}, msg: func(show func(string) string) string {
			return show("min_pool_size") + " is greater than " + show("max_pool_size") +
				": lower min_pool_size or raise max_pool_size (0 means no limit)"
		}})
	}
	if p.MaxUserConnections < 0 {
		one("max_user_connections", "must be 0 (only max_pool_size) or more")
	}
	if p.MaxDBConnections < 0 {
		one("max_db_connections", "must be 0 (no cap) or more")
	}
	if p.MaxConnecting < 1 {
		one("max_connecting", "must be at least 1 (2 is the usual value)")
	}
	if p.MaxIdleTime < 0 {
		one("max_idle_time", `must not be negative ("0s" keeps idle connections)`)
	}
	if p.WaitQueueTimeout < 0 {
		one("wait_queue_timeout", `must not be negative ("0s" waits as long as the client does)`)
	}
	if p.HeartbeatInterval < MinHeartbeatInterval {
		one("heartbeat_interval", "must be at least 500ms")
	}
	if p.ConnectTimeout <= 0 {
		one("connect_timeout", `must be more than 0, as in "10s"`)
	}
	if p.ServerSelectionTimeout <= 0 {
		one("server_selection_timeout", `must be more than 0, as in "30s"`)
	}
	if p.ClientIdleTimeout < 0 {
		one("client_idle_timeout", `must not be negative ("0s" keeps idle clients)`)
	}
	if p.MaxMessageSize < MinMaxMessageSize || p.MaxMessageSize > MaxMaxMessageSize {
		one("max_message_size", fmt.Sprintf("must be from %d to %d bytes (MongoDB's maxMessageSizeBytes)", MinMaxMessageSize, MaxMaxMessageSize))
	}
	if len(p.AppName) > MaxAppNameBytes {
		one("app_name", fmt.Sprintf("%d bytes long: the handshake allows at most %d", len(p.AppName), MaxAppNameBytes))
	}
	return append(out, readPrefIssues(p)...)
}

// listeners checks that no two listeners take the same address.
func (v *validator) listeners() {
	type listener struct {
		path []string
		addr string
	}
	var ls []listener
	if g := v.c.Global; g.Listen != "" {
		ls = append(ls, listener{[]string{tableGlobal, "listen"}, g.Listen})
	}
	if g := v.c.Global; g.AdminListen != "" {
		ls = append(ls, listener{[]string{tableGlobal, "admin_listen"}, g.AdminListen})
	}
	for _, name := range routeNames(v.c.Databases) {
		if l := v.c.Databases[name].Listen; l != "" {
			ls = append(ls, listener{[]string{tableDatabases, name, "listen"}, l})
		}
	}
	for i, b := range ls {
		for _, a := range ls[:i] {
			if listenConflict(a.addr, b.addr) {
				v.add(b.path, ErrInvalidValue, fmt.Sprintf("%s: already taken by %s in %s; give each listener its own address",
					describe(b.path, quote(b.addr)), a.path[len(a.path)-1], tableName(a.path[:len(a.path)-1])))
				break
			}
		}
	}
}

// listenConflict reports whether listening on a would stop b from binding.
// TCP addresses clash on the same port when the hosts are the same or one
// of them is a wildcard; port 0 never clashes, since each listener gets its
// own free port.
func listenConflict(a, b string) bool {
	na, ra := splitListen(a)
	nb, rb := splitListen(b)
	if ra != "" || rb != "" || na != nb {
		return false
	}
	if na == NetworkUnix {
		return filepath.Clean(a) == filepath.Clean(b)
	}
	ha, pa, _ := net.SplitHostPort(a)
	hb, pb, _ := net.SplitHostPort(b)
	x, _ := strconv.Atoi(pa)
	y, _ := strconv.Atoi(pb)
	if x != y || x == 0 {
		return false
	}
	wildcard := func(h string) bool { return h == "" || h == "0.0.0.0" || h == "::" }
	if wildcard(ha) || wildcard(hb) {
		return true
	}
	if ia, ib := net.ParseIP(stripZone(ha)), net.ParseIP(stripZone(hb)); ia != nil && ib != nil {
		return ia.Equal(ib)
	}
	return strings.EqualFold(ha, hb)
}

// quote writes a string value as TOML would.
func quote(s string) string { return strconv.Quote(s) }

func itoa(n int) string { return strconv.Itoa(n) }
