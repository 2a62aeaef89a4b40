package config

import (
	"slices"
	"strings"
	"time"
)

// Origin says which level of the precedence a route's setting came from.
type Origin int

// Origins, lowest precedence first.
const (
	// FromGlobal means [mongobouncer], or the built-in default when the
	// file does not set the key.
	FromGlobal Origin = iota
	// FromConnString means an option of the route's connection string.
	FromConnString
	// FromRoute means the route's own table.
	FromRoute
)

// String names the origin.
func (o Origin) String() string {
	switch o {
	case FromGlobal:
		return "global"
	case FromConnString:
		return "connection string"
	case FromRoute:
		return "route"
	}
	return "unknown"
}

// EffectiveRoute is a route with its settings resolved: what the pooler
// runs for one [databases.<name>] table.
type EffectiveRoute struct {
	// Name is the database the route serves, or CatchAll.
	Name string
	// Listen is the route's dedicated listener, or "".
	Listen string
	// Conn is the parsed connection string.
	Conn ConnString
	// Pool holds the settings in force, resolved by precedence: route key,
	// then connection-string option, then [mongobouncer], then default.
	Pool
	// Origins says, for each pool key (pool_mode, max_pool_size, ...),
	// which level its value came from.
	Origins map[string]Origin
	// PassThrough says the route logs in upstream as each client's own
	// user (SCRAM pass-through): pass_through, or by default auth_type =
	// "scram" with no credentials in the connection string.
	PassThrough bool
	// UserPoolIdleTimeout is user_pool_idle_timeout, from [mongobouncer]:
	// how long a pass-through route keeps a user's unused pool.
	UserPoolIdleTimeout time.Duration
}

// Routes validates c and resolves every route's settings. Routes come sorted
// by name with the catch-all last, so the order is stable across runs.
func (c Config) Routes() ([]EffectiveRoute, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	names := routeNames(c.Databases)
	out := make([]EffectiveRoute, 0, len(names))
	for _, name := range names {
		r := c.Databases[name]
		cs, err := r.ConnectionString.Parse()
		if err != nil {
			// Validate parsed it already; this cannot happen unless the
			// map changed underneath us.
			return nil, err
		}
		pool, origins := resolve(c.Global.Pool, cs, r.Overrides)
		out = append(out, EffectiveRoute{Name: name, Listen: r.Listen, Conn: cs, Pool: pool, Origins: origins,
			PassThrough: passThrough(c.Global.AuthType, cs, r.PassThrough), UserPoolIdleTimeout: c.Global.UserPoolIdleTimeout})
	}
	return out, nil
}

// passThrough resolves pass_through: the route's own value, else SCRAM
// client logins and a connection string without credentials.
func passThrough(t AuthType, cs ConnString, own *bool) bool {
	if own != nil {
		return *own
	}
	return t == AuthSCRAM && !cs.HasCredentials()
}

// routeNames returns the route names sorted, the catch-all last.
func routeNames(m map[string]Route) []string {
	names := make([]string, 0, len(m))
	for name := range m {
		names = append(names, name)
	}
	slices.SortFunc(names, func(a, b string) int {
		if (a == CatchAll) != (b == CatchAll) {
			if a == CatchAll {
				return 1
			}
			return -1
		}
		return strings.Compare(a, b)
	})
	return names
}

// pick sets *dst from v when v is set, recording where it came from.
func pick[T any](dst *T, v *T, key string, from Origin, origins map[string]Origin) {
	if v != nil {
		*dst = *v
		origins[key] = from
	}
}

// resolve applies the precedence to one route: it starts from the global
// values and lets the connection string, then the route, replace them.
func resolve(g Pool, cs ConnString, o Overrides) (Pool, map[string]Origin) {
	p := g
	origins := make(map[string]Origin, len(poolKeys))
	for _, k := range poolKeys {
		origins[k] = FromGlobal
	}

	var appName *string
	if cs.AppName != "" {
		appName = &cs.AppName
	}
	pick(&p.MaxPoolSize, cs.MaxPoolSize, "max_pool_size", FromConnString, origins)
	pick(&p.MinPoolSize, cs.MinPoolSize, "min_pool_size", FromConnString, origins)
	pick(&p.MaxIdleTime, cs.MaxIdleTime, "max_idle_time", FromConnString, origins)
	pick(&p.MaxConnecting, cs.MaxConnecting, "max_connecting", FromConnString, origins)
	pick(&p.WaitQueueTimeout, cs.WaitQueueTimeout, "wait_queue_timeout", FromConnString, origins)
	pick(&p.HeartbeatInterval, cs.HeartbeatInterval, "heartbeat_interval", FromConnString, origins)
	pick(&p.ConnectTimeout, cs.ConnectTimeout, "connect_timeout", FromConnString, origins)
	pick(&p.ServerSelectionTimeout, cs.ServerSelectionTimeout, "server_selection_timeout", FromConnString, origins)
	pick(&p.AppName, appName, "app_name", FromConnString, origins)
	var mode *ReadPreferenceMode
	if cs.ReadPreference != "" {
		mode = &cs.ReadPreference
	}
	var tags *[]map[string]string
	if cs.ReadPreferenceTags != nil {
		tags = &cs.ReadPreferenceTags
	}
	pick(&p.ReadPreference, mode, "read_preference", FromConnString, origins)
	pick(&p.ReadPreferenceTags, tags, "read_preference_tags", FromConnString, origins)
	pick(&p.MaxStaleness, cs.MaxStaleness, "max_staleness", FromConnString, origins)
	pick(&p.LocalThreshold, cs.LocalThreshold, "local_threshold", FromConnString, origins)

	pick(&p.PoolMode, o.PoolMode, "pool_mode", FromRoute, origins)
	pick(&p.MaxPoolSize, o.MaxPoolSize, "max_pool_size", FromRoute, origins)
	pick(&p.MaxPoolSizeCeiling, o.MaxPoolSizeCeiling, "max_pool_size_ceiling", FromRoute, origins)
	pick(&p.MinPoolSize, o.MinPoolSize, "min_pool_size", FromRoute, origins)
	pick(&p.MaxIdleTime, o.MaxIdleTime, "max_idle_time", FromRoute, origins)
	pick(&p.MaxConnecting, o.MaxConnecting, "max_connecting", FromRoute, origins)
	pick(&p.WaitQueueTimeout, o.WaitQueueTimeout, "wait_queue_timeout", FromRoute, origins)
	pick(&p.HeartbeatInterval, o.HeartbeatInterval, "heartbeat_interval", FromRoute, origins)
	pick(&p.ConnectTimeout, o.ConnectTimeout, "connect_timeout", FromRoute, origins)
	pick(&p.ServerSelectionTimeout, o.ServerSelectionTimeout, "server_selection_timeout", FromRoute, origins)
	pick(&p.ClientIdleTimeout, o.ClientIdleTimeout, "client_idle_timeout", FromRoute, origins)
	pick(&p.MaxMessageSize, o.MaxMessageSize, "max_message_size", FromRoute, origins)
	pick(&p.AppName, o.AppName, "app_name", FromRoute, origins)
	pick(&p.ReadPreference, o.ReadPreference, "read_preference", FromRoute, origins)
	pick(&p.ReadPreferenceTags, o.ReadPreferenceTags, "read_preference_tags", FromRoute, origins)
	pick(&p.MaxStaleness, o.MaxStaleness, "max_staleness", FromRoute, origins)
	pick(&p.LocalThreshold, o.LocalThreshold, "local_threshold", FromRoute, origins)
	pick(&p.MaxUserConnections, o.MaxUserConnections, "max_user_connections", FromRoute, origins)
	pick(&p.MaxDBConnections, o.MaxDBConnections, "max_db_connections", FromRoute, origins)
	return p, origins
}

// connStringOption names the connection-string option for a pool key, or ""
// when a connection string cannot set it.
func connStringOption(key string) string {
	switch key {
	case "max_pool_size":
		return "maxPoolSize"
	case "min_pool_size":
		return "minPoolSize"
	case "max_idle_time":
		return "maxIdleTimeMS"
	case "max_connecting":
		return "maxConnecting"
	case "wait_queue_timeout":
		return "waitQueueTimeoutMS"
	case "heartbeat_interval":
		return "heartbeatFrequencyMS"
	case "connect_timeout":
		return "connectTimeoutMS"
	case "server_selection_timeout":
		return "serverSelectionTimeoutMS"
	case "app_name":
		return "appName"
	case "read_preference":
		return "readPreference"
	case "read_preference_tags":
		return "readPreferenceTags"
	case "max_staleness":
		return "maxStalenessSeconds"
	case "local_threshold":
		return "localThresholdMS"
	}
	return ""
}

// poolValue returns the value of a pool key as TOML would write it.
func poolValue(p Pool, key string) string {
	switch key {
	case "pool_mode":
		return quote(string(p.PoolMode))
	case "max_pool_size":
		if p.AutoPoolSize() {
			return quote("auto")
		}
		return itoa(p.MaxPoolSize)
	case "max_pool_size_ceiling":
		return itoa(p.MaxPoolSizeCeiling)
	case "min_pool_size":
		return itoa(p.MinPoolSize)
	case "max_idle_time":
		return quote(p.MaxIdleTime.String())
	case "max_connecting":
		return itoa(p.MaxConnecting)
	case "wait_queue_timeout":
		return quote(p.WaitQueueTimeout.String())
	case "heartbeat_interval":
		return quote(p.HeartbeatInterval.String())
	case "connect_timeout":
		return quote(p.ConnectTimeout.String())
	case "server_selection_timeout":
		return quote(p.ServerSelectionTimeout.String())
	case "client_idle_timeout":
		return quote(p.ClientIdleTimeout.String())
	case "max_message_size":
		return itoa(p.MaxMessageSize)
	case "app_name":
		return quote(p.AppName)
	case "read_preference":
		return quote(string(p.ReadPreference))
	case "read_preference_tags":
		return tagsTOML(p.ReadPreferenceTags)
	case "max_staleness":
		return quote(p.MaxStaleness.String())
	case "local_threshold":
		return quote(p.LocalThreshold.String())
	case "max_user_connections":
		return itoa(p.MaxUserConnections)
	case "max_db_connections":
		return itoa(p.MaxDBConnections)
	}
	return ""
}

// optionValue returns the value of a pool key as its connection-string
// option would write it.
func optionValue(p Pool, key string) string {
	var d time.Duration
	switch key {
	case "max_idle_time":
		d = p.MaxIdleTime
	case "wait_queue_timeout":
		d = p.WaitQueueTimeout
	case "heartbeat_interval":
		d = p.HeartbeatInterval
	case "connect_timeout":
		d = p.ConnectTimeout
	case "server_selection_timeout":
		d = p.ServerSelectionTimeout
	case "local_threshold":
		d = p.LocalThreshold
	case "max_staleness":
		return itoa(int(p.MaxStaleness / time.Second))
	case "app_name":
		return p.AppName
	case "read_preference":
		return string(p.ReadPreference)
	case "read_preference_tags":
		return strings.TrimPrefix(tagsOption(p.ReadPreferenceTags), "readPreferenceTags=")
	default:
		return poolValue(p, key)
	}
	return itoa(int(d / time.Millisecond))
}
