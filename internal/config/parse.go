package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"
)

// MaxFileSize bounds a configuration file. A real one is a few kilobytes;
// the bound stops Load from reading a wrong path (a log, a device) into
// memory.
const MaxFileSize = 4 << 20

// Table and key names.
const (
	tableGlobal    = "mongobouncer"
	tableDatabases = "databases"
)

// rawPool, rawGlobal and rawRoute mirror the file for go-toml's strict
// decoding, which reports unknown keys with their positions. Values are
// decoded as any so that a value of the wrong type does not stop decoding:
// the converters below report every such value with a message that says
// what to write instead, and decoding goes on to find the other problems.
type rawPool struct {
	PoolMode               any `toml:"pool_mode"`
	MaxPoolSize            any `toml:"max_pool_size"`
	MaxPoolSizeCeiling     any `toml:"max_pool_size_ceiling"`
	MinPoolSize            any `toml:"min_pool_size"`
	MaxIdleTime            any `toml:"max_idle_time"`
	MaxConnecting          any `toml:"max_connecting"`
	WaitQueueTimeout       any `toml:"wait_queue_timeout"`
	HeartbeatInterval      any `toml:"heartbeat_interval"`
	ConnectTimeout         any `toml:"connect_timeout"`
	ServerSelectionTimeout any `toml:"server_selection_timeout"`
	ClientIdleTimeout      any `toml:"client_idle_timeout"`
	MaxMessageSize         any `toml:"max_message_size"`
	AppName                any `toml:"app_name"`
	ReadPreference         any `toml:"read_preference"`
	ReadPreferenceTags     any `toml:"read_preference_tags"`
	MaxStaleness           any `toml:"max_staleness"`
	LocalThreshold         any `toml:"local_threshold"`
	MaxUserConnections     any `toml:"max_user_connections"`
	MaxDBConnections       any `toml:"max_db_connections"`
}

type rawGlobal struct {
	Listen                 any `toml:"listen"`
	AdminListen            any `toml:"admin_listen"`
	MaxClientConn          any `toml:"max_client_conn"`
	MaxUserClientConn      any `toml:"max_user_client_conn"`
	MaxPreLoginMessageSize any `toml:"max_prelogin_message_size"`
	LogLevel               any `toml:"log_level"`
	LogFormat              any `toml:"log_format"`
	ShutdownTimeout        any `toml:"shutdown_timeout"`
	ShutdownDelay          any `toml:"shutdown_delay"`
	HelloMaxAwait          any `toml:"hello_max_await"`
	UpstreamCommandTimeout any `toml:"upstream_command_timeout"`
	EventLoop              any `toml:"event_loop"`
	EventLoopThreads       any `toml:"event_loop_threads"`
	EventLoopIO            any `toml:"event_loop_io"`
	EventLoopSpin          any `toml:"event_loop_spin"`
	SoReuseport            any `toml:"so_reuseport"`
	AuthType               any `toml:"auth_type"`
	AuthFile               any `toml:"auth_file"`
	AuthUser               any `toml:"auth_user"`
	AuthUserServiceRoutes  any `toml:"auth_user_service_routes"`
	AuthMaxLookups         any `toml:"auth_max_lookups"`
	AdminUsers             any `toml:"admin_users"`
	AuthCacheTTL           any `toml:"auth_cache_ttl"`
	AuthLookupsPerPeer     any `toml:"auth_lookups_per_peer"`
	MaxSCRAMIterations     any `toml:"max_scram_iterations"`
	TLSMode                any `toml:"tls_mode"`
	TLSCertFile            any `toml:"tls_cert_file"`
	TLSKeyFile             any `toml:"tls_key_file"`
	TLSCAFile              any `toml:"tls_ca_file"`
	TLSHandshakeTimeout    any `toml:"tls_handshake_timeout"`
	TLSWatchInterval       any `toml:"tls_watch_interval"`
	UserPoolIdleTimeout    any `toml:"user_pool_idle_timeout"`
	ClientLoginTimeout     any `toml:"client_login_timeout"`
	rawPool
}

type rawRoute struct {
	ConnectionString any `toml:"connection_string"`
	Listen           any `toml:"listen"`
	PassThrough      any `toml:"pass_through"`
	rawPool
}

type rawFile struct {
	Mongobouncer rawGlobal           `toml:"mongobouncer"`
	Databases    map[string]rawRoute `toml:"databases"`
}

// Key names per table, for did-you-mean suggestions and for explaining keys
// that are valid elsewhere.
var (
	poolKeys = []string{
		"pool_mode", "max_pool_size", "max_pool_size_ceiling", "min_pool_size", "max_idle_time", "max_connecting",
		"wait_queue_timeout", "heartbeat_interval", "connect_timeout",
		"server_selection_timeout", "client_idle_timeout", "max_message_size", "app_name",
		"read_preference", "read_preference_tags", "max_staleness", "local_threshold",
		"max_user_connections", "max_db_connections",
	}
	globalOnlyKeys = []string{"listen", "admin_listen", "max_client_conn", "max_user_client_conn", "max_prelogin_message_size", "log_level", "log_format", "shutdown_timeout", "shutdown_delay", "hello_max_await", "upstream_command_timeout", "event_loop", "event_loop_threads", "event_loop_io", "event_loop_spin",
		"auth_type", "auth_file", "auth_user", "admin_users", "auth_user_service_routes", "auth_cache_ttl", "auth_lookups_per_peer", "auth_max_lookups", "max_scram_iterations",
		"tls_mode", "tls_cert_file", "tls_key_file", "tls_ca_file", "tls_handshake_timeout", "user_pool_idle_timeout",
		"client_login_timeout", "tls_watch_interval", "so_reuseport"}
	globalKeys   = append(slices.Clone(globalOnlyKeys), poolKeys...)
	routeKeys    = append([]string{"connection_string", "listen", "pass_through"}, poolKeys...)
	topLevelKeys = []string{tableGlobal, tableDatabases}
)

// Load reads and parses the configuration file at path. Problems name the
// file and line; see Parse.
func Load(path string) (Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return Config{}, &Error{File: path, Msg: "cannot read the configuration: " + err.Error(), Err: err}
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return Config{}, &Error{File: path, Msg: "cannot read the configuration: " + err.Error(), Err: err}
	}
	// Parse refuses a document over MaxFileSize; reading one byte more
	// than that is enough to tell.
	return Parse(data, path)
}

// Parse parses a TOML document over Default and validates the result.
// filename names the document in messages and becomes Config.Path; it may be
// "". Documents over MaxFileSize are refused. On failure it returns the zero Config and every problem found, joined
// (see Problems), each naming filename:line and what to write instead.
func Parse(data []byte, filename string) (Config, error) {
	if len(data) > MaxFileSize {
		return Config{}, &Error{File: filename, Msg: fmt.Sprintf("larger than %d bytes: is this the configuration file?", MaxFileSize), Err: ErrInvalidValue}
	}
	var raw rawFile
	var problems []*Error
	err := toml.NewDecoder(bytes.NewReader(data)).DisallowUnknownFields().Decode(&raw)
	var strict *toml.StrictMissingError
	var decodeErr *toml.DecodeError
	switch {
	case err == nil, errors.As(err, &strict):
	case errors.As(err, &decodeErr):
		return Config{}, joinProblems([]*Error{decodeProblem(filename, decodeErr)})
	default:
		return Config{}, &Error{File: filename, Msg: strings.TrimPrefix(err.Error(), "toml: "), Err: ErrSyntax}
	}

	cfg := Default()
	cfg.Path = filename
	cfg.src = indexDocument(filename, data)
	if strict != nil {
		// Unknown keys do not stop decoding: report them with the rest.
		for i := range strict.Errors {
			problems = append(problems, unknownKeyProblem(cfg.src, &strict.Errors[i]))
		}
	}
	d := converter{src: cfg.src, bad: make(map[string]bool)}
	d.global(&raw.Mongobouncer, &cfg.Global)
	if raw.Databases != nil {
		cfg.Databases = make(map[string]Route, len(raw.Databases))
		for name, r := range raw.Databases {
			cfg.Databases[name] = d.route(name, &r)
		}
	}
	problems = append(problems, d.problems...)
	for _, p := range Problems(cfg.Validate()) {
		// A value of the wrong type was left at its default: what Validate
		// says about the default would only confuse.
		if !d.bad[p.Key] {
			problems = append(problems, p)
		}
	}
	if len(problems) > 0 {
		return Config{}, joinProblems(problems)
	}
	return cfg, nil
}

// decodeProblem turns a go-toml error that stopped decoding (bad syntax, a
// key defined twice, a table where a value belongs) into a Problem.
func decodeProblem(file string, de *toml.DecodeError) *Error {
	line, col := de.Position()
	key := []string(de.Key())
	msg := strings.TrimPrefix(de.Error(), "toml: ")
	category := ErrSyntax
	// Every scalar decodes into any, so "cannot decode" can only mean a
	// value where one of the tables belongs. go-toml's message names Go
	// types; say it in the file's terms.
	if strings.Contains(msg, "cannot decode") {
		category = ErrInvalidValue
		switch {
		case len(key) == 1 && key[0] == tableGlobal:
			msg = "mongobouncer must be a table: write [mongobouncer] and put the global keys under it"
		case len(key) == 1 && key[0] == tableDatabases:
			msg = `databases must hold one table per route, as in [databases."*"] with connection_string = "mongodb://host:27017/"`
		case len(key) == 2 && key[0] == tableDatabases:
			msg = fmt.Sprintf("%s must be a route table, as in %s with connection_string = \"mongodb://host:27017/\"",
				dotted(key), tableName(key))
			if slices.Contains(routeKeys, key[1]) {
				msg = fmt.Sprintf("%s belongs in a route table such as [databases.\"*\"], not directly in [databases]", key[1])
			}
		default:
			msg = fmt.Sprintf("%s has the wrong type: %s", dotted(key), msg)
		}
	}
	return &Error{File: file, Line: line, Column: col, Key: dotted(key), Msg: msg, Err: category}
}

// unknownKeyProblem explains a key go-toml's strict mode found no place for,
// with a suggestion when the key looks like a known one.
func unknownKeyProblem(src *source, de *toml.DecodeError) *Error {
	line, col := de.Position()
	key := src.fullPath(line, col, de.Key())
	p := &Error{File: src.file, Line: line, Column: col, Key: dotted(key), Err: ErrUnknownKey}
	// Find the first part of the path the schema does not know, and the
	// keys that were possible there.
	var at int
	var candidates []string
	switch {
	case len(key) == 0:
		p.Msg = "unknown key"
		return p
	case key[0] == tableGlobal:
		at, candidates = 1, globalKeys
	case key[0] == tableDatabases && len(key) >= 3:
		at, candidates = 2, routeKeys
	default:
		at, candidates = 0, topLevelKeys
	}
	if at >= len(key) {
		at = len(key) - 1
	}
	name, table := key[at], key[:at]
	where := "at the top level"
	if len(table) > 0 {
		where = "in " + tableName(table)
	}
	p.Msg = fmt.Sprintf("unknown key %q %s", name, where)
	switch {
	case at == 0 && len(key) == 1 && slices.Contains(globalKeys, name):
		p.Msg += fmt.Sprintf("; %s belongs in [mongobouncer]: put that table header above it", name)
	case at == 0 && len(key) == 1 && name == "connection_string":
		p.Msg += `; connection_string belongs in a route table such as [databases."*"]`
	case at == 2 && slices.Contains(globalOnlyKeys, name):
		p.Msg += fmt.Sprintf("; %s is global: set it in [mongobouncer]", name)
	case at == 1 && name == "connection_string":
		p.Msg += `; connection_string belongs in a route table such as [databases."*"]`
	default:
		if s := suggest(name, candidates); s != "" {
			p.Msg += fmt.Sprintf("; did you mean %q?", s)
		} else {
			p.Msg += "; remove it (known keys: " + strings.Join(candidates, ", ") + ")"
		}
	}
	return p
}

// converter turns the raw decoded values into typed ones, recording a
// problem for each value of the wrong type.
type converter struct {
	src      *source
	problems []*Error
	// bad holds the dotted keys that had a wrong type.
	bad map[string]bool
}

func (d *converter) fail(path []string, format string, args ...any) {
	e, _ := d.src.lookup(path)
	key := dotted(path)
	d.bad[key] = true
	d.problems = append(d.problems, &Error{
		File: d.src.file, Line: e.pos.line, Column: e.pos.column, Key: key,
		Msg: describe(path, truncate(e.raw)) + ": " + fmt.Sprintf(format, args...),
		Err: ErrInvalidValue,
	})
}

func (d *converter) str(path []string, v any, dst *string) bool {
	switch x := v.(type) {
	case nil:
		return false
	case string:
		*dst = x
		return true
	}
	d.fail(path, "must be a string in quotes, not %s", kindOf(v))
	return false
}

// strings reads an array of strings, as admin_users.
func (d *converter) strings(path []string, v any, dst *[]string) bool {
	if v == nil {
		return false
	}
	const want = `must be an array of strings in quotes, as in ["ops@admin"]`
	list, ok := v.([]any)
	if !ok {
		d.fail(path, "%s, not %s", want, kindOf(v))
		return false
	}
	out := make([]string, 0, len(list))
	for _, item := range list {
		s, ok := item.(string)
		if !ok {
			d.fail(path, "%s: an element is %s", want, kindOf(item))
			return false
		}
		out = append(out, s)
	}
	*dst = out
	return true
}

func (d *converter) boolean(path []string, v any, dst *bool) bool {
	switch x := v.(type) {
	case nil:
		return false
	case bool:
		*dst = x
		return true
	case string:
		d.fail(path, "must be true or false without quotes")
		return false
	}
	d.fail(path, "must be true or false, not %s", kindOf(v))
	return false
}

func (d *converter) integer(path []string, v any, dst *int) bool {
	switch x := v.(type) {
	case nil:
		return false
	case int64:
		if x < math.MinInt32 || x > math.MaxInt32 {
			d.fail(path, "out of range")
			return false
		}
		*dst = int(x)
		return true
	case float64:
		d.fail(path, "must be a whole number")
		return false
	case string:
		d.fail(path, "must be a number without quotes")
		return false
	}
	d.fail(path, "must be a whole number, not %s", kindOf(v))
	return false
}

// poolSize converts max_pool_size: a whole number of 0 or more, or "auto"
// (PoolSizeAuto).
func (d *converter) poolSize(path []string, v any, dst *int) bool {
	switch x := v.(type) {
	case string:
		if x == "auto" {
			*dst = PoolSizeAuto
			return true
		}
		d.fail(path, `must be a number without quotes, or "auto"`)
		return false
	case int64:
		if x < 0 {
			d.fail(path, `must be 0 (no limit) or more, or "auto"`)
			return false
		}
	}
	return d.integer(path, v, dst)
}

func (d *converter) duration(path []string, v any, dst *time.Duration) bool {
	switch x := v.(type) {
	case nil:
		return false
	case string:
		dur, err := time.ParseDuration(x)
		if err != nil {
			d.fail(path, `not a duration: write a number with a unit (ns, us, ms, s, m, h), as in "500ms", "30s" or "1m30s"`)
			return false
		}
		*dst = dur
		return true
	case int64, float64:
		d.fail(path, `durations are strings with a unit: write "%vs" for seconds or "%vms" for milliseconds`, x, x)
		return false
	}
	d.fail(path, `must be a duration string with a unit, as in "30s", not %s`, kindOf(v))
	return false
}

// tags reads read_preference_tags: an array of tables of strings, each
// table one tag set, as in [{dc = "east", rack = "1"}, {dc = "east"}, {}].
func (d *converter) tags(path []string, v any, dst *[]map[string]string) bool {
	if v == nil {
		return false
	}
	const want = `must be an array of tables of strings, as in [{dc = "east"}, {}]`
	list, ok := v.([]any)
	if !ok {
		d.fail(path, "%s, not %s", want, kindOf(v))
		return false
	}
	sets := make([]map[string]string, 0, len(list))
	for _, item := range list {
		table, ok := item.(map[string]any)
		if !ok {
			d.fail(path, "%s: an element is %s", want, kindOf(item))
			return false
		}
		set := make(map[string]string, len(table))
		for k, tv := range table {
			sv, ok := tv.(string)
			if !ok {
				d.fail(path, "%s: tag %s is %s; quote it", want, dotted([]string{k}), kindOf(tv))
				return false
			}
			set[k] = sv
		}
		sets = append(sets, set)
	}
	*dst = sets
	return true
}

func optInt(d *converter, path []string, v any) *int {
	var n int
	if d.integer(path, v, &n) {
		return &n
	}
	return nil
}

func optDuration(d *converter, path []string, v any) *time.Duration {
	var t time.Duration
	if d.duration(path, v, &t) {
		return &t
	}
	return nil
}

func (d *converter) global(r *rawGlobal, g *Global) {
	at := func(key string) []string { return []string{tableGlobal, key} }
	d.str(at("listen"), r.Listen, &g.Listen)
	d.str(at("admin_listen"), r.AdminListen, &g.AdminListen)
	d.integer(at("max_client_conn"), r.MaxClientConn, &g.MaxClientConn)
	d.integer(at("max_user_client_conn"), r.MaxUserClientConn, &g.MaxUserClientConn)
	d.integer(at("max_prelogin_message_size"), r.MaxPreLoginMessageSize, &g.MaxPreLoginMessageSize)
	var s string
	if d.str(at("log_level"), r.LogLevel, &s) {
		g.LogLevel = LogLevel(s)
	}
	if d.str(at("log_format"), r.LogFormat, &s) {
		g.LogFormat = LogFormat(s)
	}
	d.duration(at("shutdown_timeout"), r.ShutdownTimeout, &g.ShutdownTimeout)
	d.duration(at("shutdown_delay"), r.ShutdownDelay, &g.ShutdownDelay)
	d.duration(at("hello_max_await"), r.HelloMaxAwait, &g.HelloMaxAwait)
	d.duration(at("upstream_command_timeout"), r.UpstreamCommandTimeout, &g.UpstreamCommandTimeout)
	d.boolean(at("event_loop"), r.EventLoop, &g.EventLoop)
	d.integer(at("event_loop_threads"), r.EventLoopThreads, &g.EventLoopThreads)
	if d.str(at("event_loop_io"), r.EventLoopIO, &s) {
		g.EventLoopIO = EventLoopIO(s)
	}
	d.duration(at("event_loop_spin"), r.EventLoopSpin, &g.EventLoopSpin)
	d.boolean(at("so_reuseport"), r.SoReuseport, &g.SoReuseport)
	if d.str(at("auth_type"), r.AuthType, &s) {
		g.AuthType = AuthType(s)
	}
	d.str(at("auth_file"), r.AuthFile, &g.AuthFile)
	d.str(at("auth_user"), r.AuthUser, &g.AuthUser)
	d.boolean(at("auth_user_service_routes"), r.AuthUserServiceRoutes, &g.AuthUserServiceRoutes)
	d.integer(at("auth_max_lookups"), r.AuthMaxLookups, &g.AuthMaxLookups)
	d.strings(at("admin_users"), r.AdminUsers, &g.AdminUsers)
	d.duration(at("auth_cache_ttl"), r.AuthCacheTTL, &g.AuthCacheTTL)
	d.integer(at("auth_lookups_per_peer"), r.AuthLookupsPerPeer, &g.AuthLookupsPerPeer)
	d.integer(at("max_scram_iterations"), r.MaxSCRAMIterations, &g.MaxSCRAMIterations)
	if d.str(at("tls_mode"), r.TLSMode, &s) {
		g.TLSMode = TLSMode(s)
	}
	d.str(at("tls_cert_file"), r.TLSCertFile, &g.TLSCertFile)
	d.str(at("tls_key_file"), r.TLSKeyFile, &g.TLSKeyFile)
	d.str(at("tls_ca_file"), r.TLSCAFile, &g.TLSCAFile)
	d.duration(at("tls_handshake_timeout"), r.TLSHandshakeTimeout, &g.TLSHandshakeTimeout)
	d.duration(at("tls_watch_interval"), r.TLSWatchInterval, &g.TLSWatchInterval)
	d.duration(at("user_pool_idle_timeout"), r.UserPoolIdleTimeout, &g.UserPoolIdleTimeout)
	d.duration(at("client_login_timeout"), r.ClientLoginTimeout, &g.ClientLoginTimeout)

	p, rp := &g.Pool, &r.rawPool
	if d.str(at("pool_mode"), rp.PoolMode, &s) {
		p.PoolMode = PoolMode(s)
	}
	d.poolSize(at("max_pool_size"), rp.MaxPoolSize, &p.MaxPoolSize)
	d.integer(at("max_pool_size_ceiling"), rp.MaxPoolSizeCeiling, &p.MaxPoolSizeCeiling)
	d.integer(at("min_pool_size"), rp.MinPoolSize, &p.MinPoolSize)
	d.duration(at("max_idle_time"), rp.MaxIdleTime, &p.MaxIdleTime)
	d.integer(at("max_connecting"), rp.MaxConnecting, &p.MaxConnecting)
	d.duration(at("wait_queue_timeout"), rp.WaitQueueTimeout, &p.WaitQueueTimeout)
	d.duration(at("heartbeat_interval"), rp.HeartbeatInterval, &p.HeartbeatInterval)
	d.duration(at("connect_timeout"), rp.ConnectTimeout, &p.ConnectTimeout)
	d.duration(at("server_selection_timeout"), rp.ServerSelectionTimeout, &p.ServerSelectionTimeout)
	d.duration(at("client_idle_timeout"), rp.ClientIdleTimeout, &p.ClientIdleTimeout)
	d.integer(at("max_message_size"), rp.MaxMessageSize, &p.MaxMessageSize)
	d.str(at("app_name"), rp.AppName, &p.AppName)
	if d.str(at("read_preference"), rp.ReadPreference, &s) {
		p.ReadPreference = ReadPreferenceMode(s)
	}
	d.tags(at("read_preference_tags"), rp.ReadPreferenceTags, &p.ReadPreferenceTags)
	d.duration(at("max_staleness"), rp.MaxStaleness, &p.MaxStaleness)
	d.duration(at("local_threshold"), rp.LocalThreshold, &p.LocalThreshold)
	d.integer(at("max_user_connections"), rp.MaxUserConnections, &p.MaxUserConnections)
	d.integer(at("max_db_connections"), rp.MaxDBConnections, &p.MaxDBConnections)
}

func (d *converter) route(name string, r *rawRoute) Route {
	at := func(key string) []string { return []string{tableDatabases, name, key} }
	var rt Route
	var s string
	if d.str(at("connection_string"), r.ConnectionString, &s) {
		rt.ConnectionString = URI(s)
	}
	d.str(at("listen"), r.Listen, &rt.Listen)
	var pass bool
	if d.boolean(at("pass_through"), r.PassThrough, &pass) {
		rt.PassThrough = &pass
	}

	o, rp := &rt.Overrides, &r.rawPool
	if d.str(at("pool_mode"), rp.PoolMode, &s) {
		o.PoolMode = new(PoolMode(s))
	}
	var size int
	if d.poolSize(at("max_pool_size"), rp.MaxPoolSize, &size) {
		o.MaxPoolSize = &size
	}
	o.MaxPoolSizeCeiling = optInt(d, at("max_pool_size_ceiling"), rp.MaxPoolSizeCeiling)
	o.MinPoolSize = optInt(d, at("min_pool_size"), rp.MinPoolSize)
	o.MaxIdleTime = optDuration(d, at("max_idle_time"), rp.MaxIdleTime)
	o.MaxConnecting = optInt(d, at("max_connecting"), rp.MaxConnecting)
	o.WaitQueueTimeout = optDuration(d, at("wait_queue_timeout"), rp.WaitQueueTimeout)
	o.HeartbeatInterval = optDuration(d, at("heartbeat_interval"), rp.HeartbeatInterval)
	o.ConnectTimeout = optDuration(d, at("connect_timeout"), rp.ConnectTimeout)
	o.ServerSelectionTimeout = optDuration(d, at("server_selection_timeout"), rp.ServerSelectionTimeout)
	o.ClientIdleTimeout = optDuration(d, at("client_idle_timeout"), rp.ClientIdleTimeout)
	o.MaxMessageSize = optInt(d, at("max_message_size"), rp.MaxMessageSize)
	if d.str(at("app_name"), rp.AppName, &s) {
		o.AppName = new(s)
	}
	if d.str(at("read_preference"), rp.ReadPreference, &s) {
		o.ReadPreference = new(ReadPreferenceMode(s))
	}
	var tags []map[string]string
	if d.tags(at("read_preference_tags"), rp.ReadPreferenceTags, &tags) {
		o.ReadPreferenceTags = &tags
	}
	o.MaxStaleness = optDuration(d, at("max_staleness"), rp.MaxStaleness)
	o.LocalThreshold = optDuration(d, at("local_threshold"), rp.LocalThreshold)
	o.MaxUserConnections = optInt(d, at("max_user_connections"), rp.MaxUserConnections)
	o.MaxDBConnections = optInt(d, at("max_db_connections"), rp.MaxDBConnections)
	return rt
}

// kindOf names the TOML type of a decoded value.
func kindOf(v any) string {
	switch v.(type) {
	case string:
		return "a string"
	case int64:
		return "an integer"
	case float64:
		return "a float"
	case bool:
		return "a boolean"
	case []any:
		return "an array"
	case map[string]any:
		return "a table"
	}
	return "a date or time"
}

// truncate shortens a value quoted in a message and keeps it on one line.
func truncate(s string) string {
	const max = 60
	if i := strings.IndexAny(s, "\r\n"); i >= 0 {
		s = s[:i] + "..."
	}
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}

// describe names a key and its value as a message starts:
// `pool_mode = "sessions"` for a global key, and
// `max_pool_size = -1 in [databases.orders]` for a route key. value may be
// "". The value of connection_string is never shown: it holds a password.
func describe(path []string, value string) string {
	if len(path) == 0 {
		return ""
	}
	key, table := path[len(path)-1], path[:len(path)-1]
	s := key
	if value != "" && key != "connection_string" {
		s += " = " + value
	}
	if len(table) > 0 && !(len(table) == 1 && table[0] == tableGlobal) {
		s += " in " + tableName(table)
	}
	return s
}

// tableName formats a table header, as in [databases."*"].
func tableName(parts []string) string { return "[" + dotted(parts) + "]" }

// dotted formats a key path the way TOML writes it, quoting parts that are
// not bare keys.
func dotted(parts []string) string {
	quoted := make([]string, len(parts))
	for i, p := range parts {
		quoted[i] = p
		if !isBareKey(p) {
			quoted[i] = fmt.Sprintf("%q", p)
		}
	}
	return strings.Join(quoted, ".")
}

func isBareKey(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
