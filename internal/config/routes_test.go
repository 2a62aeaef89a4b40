package config

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestPrecedence checks, for every pool key, each combination of where it
// is set: route key > connection-string option > [mongobouncer] > default.
func TestPrecedence(t *testing.T) {
	type key struct {
		name   string
		global string // TOML value in [mongobouncer]
		option string // connection-string option, "" when there is none
		route  string // TOML value in the route
		get    func(Pool) any
		// expected values for default, global, option and route
		def, g, o, r any
		// base is always written in [mongobouncer], for keys that need
		// another setting to be valid at all.
		base string
	}
	keys := []key{
		{"pool_mode", `"session"`, "", `"statement"`, func(p Pool) any { return p.PoolMode },
			PoolModeTransaction, PoolModeSession, nil, PoolModeStatement, ""},
		{"max_pool_size", "40", "maxPoolSize=30", "20", func(p Pool) any { return p.MaxPoolSize }, 100, 40, 30, 20, ""},
		{"max_pool_size_ceiling", "40", "", "20", func(p Pool) any { return p.MaxPoolSizeCeiling }, 100, 40, nil, 20, ""},
		{"min_pool_size", "3", "minPoolSize=2", "1", func(p Pool) any { return p.MinPoolSize }, 0, 3, 2, 1, ""},
		{"max_idle_time", `"3m"`, "maxIdleTimeMS=120000", `"1m"`, func(p Pool) any { return p.MaxIdleTime },
			time.Duration(0), 3 * time.Minute, 2 * time.Minute, time.Minute, ""},
		{"max_connecting", "5", "maxConnecting=4", "3", func(p Pool) any { return p.MaxConnecting }, 2, 5, 4, 3, ""},
		{"wait_queue_timeout", `"3s"`, "waitQueueTimeoutMS=2000", `"1s"`, func(p Pool) any { return p.WaitQueueTimeout },
			30 * time.Second, 3 * time.Second, 2 * time.Second, time.Second, ""},
		{"heartbeat_interval", `"3s"`, "heartbeatFrequencyMS=2000", `"1s"`, func(p Pool) any { return p.HeartbeatInterval },
			10 * time.Second, 3 * time.Second, 2 * time.Second, time.Second, ""},
		{"connect_timeout", `"3s"`, "connectTimeoutMS=2000", `"1s"`, func(p Pool) any { return p.ConnectTimeout },
			10 * time.Second, 3 * time.Second, 2 * time.Second, time.Second, ""},
		{"server_selection_timeout", `"3s"`, "serverSelectionTimeoutMS=2000", `"1s"`, func(p Pool) any { return p.ServerSelectionTimeout },
			30 * time.Second, 3 * time.Second, 2 * time.Second, time.Second, ""},
		{"client_idle_timeout", `"3s"`, "", `"1s"`, func(p Pool) any { return p.ClientIdleTimeout },
			time.Duration(0), 3 * time.Second, nil, time.Second, ""},
		{"max_message_size", "3000000", "", "1000000", func(p Pool) any { return p.MaxMessageSize },
			48_000_000, 3_000_000, nil, 1_000_000, ""},
		{"app_name", `"g"`, "appName=o", `"r"`, func(p Pool) any { return p.AppName }, "mongobouncer", "g", "o", "r", ""},
		{"read_preference", `"secondary"`, "readPreference=nearest", `"primaryPreferred"`, func(p Pool) any { return p.ReadPreference },
			ReadPrimary, ReadSecondary, ReadNearest, ReadPrimaryPreferred, ""},
		{"read_preference_tags", `[{dc = "g"}]`, "readPreferenceTags=dc:o,rack:1&readPreferenceTags=", `[{dc = "r"}, {}]`,
			func(p Pool) any { return fmt.Sprint(p.ReadPreferenceTags) },
			"[]", "[map[dc:g]]", "[map[dc:o rack:1] map[]]", "[map[dc:r] map[]]", `read_preference = "nearest"`},
		{"max_staleness", `"3m"`, "maxStalenessSeconds=120", `"100s"`, func(p Pool) any { return p.MaxStaleness },
			time.Duration(0), 3 * time.Minute, 2 * time.Minute, 100 * time.Second, `read_preference = "secondary"`},
		{"local_threshold", `"30ms"`, "localThresholdMS=20", `"10ms"`, func(p Pool) any { return p.LocalThreshold },
			15 * time.Millisecond, 30 * time.Millisecond, 20 * time.Millisecond, 10 * time.Millisecond, ""},
		{"max_user_connections", "5", "", "3", func(p Pool) any { return p.MaxUserConnections }, 0, 5, nil, 3, ""},
		{"max_db_connections", "50", "", "20", func(p Pool) any { return p.MaxDBConnections }, 0, 50, nil, 20, ""},
	}
	if len(keys) != len(poolKeys) {
		t.Fatalf("test covers %d keys, there are %d", len(keys), len(poolKeys))
	}
	for _, k := range keys {
		for mask := range 8 {
			inGlobal, inOption, inRoute := mask&1 != 0, mask&2 != 0, mask&4 != 0
			if inOption && k.option == "" {
				continue
			}
			var doc strings.Builder
			fmt.Fprintf(&doc, "[mongobouncer]\n%s\n", k.base)
			if inGlobal {
				fmt.Fprintf(&doc, "%s = %s\n", k.name, k.global)
			}
			uri := "mongodb://h/"
			if inOption {
				uri += "?" + k.option
			}
			fmt.Fprintf(&doc, "[databases.\"*\"]\nconnection_string = %q\n", uri)
			if inRoute {
				fmt.Fprintf(&doc, "%s = %s\n", k.name, k.route)
			}
			want, origin := k.def, FromGlobal
			switch {
			case inRoute:
				want, origin = k.r, FromRoute
			case inOption:
				want, origin = k.o, FromConnString
			case inGlobal:
				want = k.g
			}
			name := fmt.Sprintf("%s/global=%v,option=%v,route=%v", k.name, inGlobal, inOption, inRoute)
			c, err := Parse([]byte(doc.String()), "p.toml")
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			rs, err := c.Routes()
			if err != nil || len(rs) != 1 {
				t.Errorf("%s: Routes: %v", name, err)
				continue
			}
			if got := k.get(rs[0].Pool); got != want {
				t.Errorf("%s: got %v, want %v", name, got, want)
			}
			if got := rs[0].Origins[k.name]; got != origin {
				t.Errorf("%s: origin %v, want %v", name, got, origin)
			}
		}
	}
}

// The brief's example: the route's max_pool_size beats maxPoolSize in its
// connection string, and other routes are untouched by it.
func TestRoutesIndependent(t *testing.T) {
	c, err := Parse([]byte(`
[mongobouncer]
min_pool_size = 1
[databases.orders]
connection_string = "mongodb://10.0.0.1:27017,10.0.0.2:27017/?maxPoolSize=50&minPoolSize=2"
listen = "127.0.0.1:27018"
pool_mode = "statement"
max_pool_size = 20
[databases.users]
connection_string = "mongodb://10.0.0.3/?maxPoolSize=50"
[databases."*"]
connection_string = "mongodb://127.0.0.1:27019/"
`), "r.toml")
	if err != nil {
		t.Fatal(err)
	}
	rs, err := c.Routes()
	if err != nil {
		t.Fatal(err)
	}
	got := make([]string, len(rs))
	for i, r := range rs {
		got[i] = fmt.Sprintf("%s:%s:%d:%d:%s:%q", r.Name, r.PoolMode, r.MaxPoolSize, r.MinPoolSize, r.Conn.Hosts, r.Listen)
	}
	want := []string{
		`orders:statement:20:2:[10.0.0.1:27017 10.0.0.2:27017]:"127.0.0.1:27018"`,
		`users:transaction:50:1:[10.0.0.3:27017]:""`,
		`*:transaction:100:1:[127.0.0.1:27019]:""`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("routes:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// Overrides are per route: a route's pointer never leaks into another.
	*c.Databases["orders"].MaxPoolSize = 7
	rs2, _ := c.Routes()
	if rs2[0].MaxPoolSize != 7 || rs2[1].MaxPoolSize != 50 || rs2[2].MaxPoolSize != 100 {
		t.Fatalf("after changing orders: %d %d %d", rs2[0].MaxPoolSize, rs2[1].MaxPoolSize, rs2[2].MaxPoolSize)
	}
}

func TestOriginString(t *testing.T) {
	for o, want := range map[Origin]string{FromGlobal: "global", FromConnString: "connection string", FromRoute: "route", 9: "unknown"} {
		if o.String() != want {
			t.Errorf("%d: %q", int(o), o.String())
		}
	}
}

// pass_through: by default on for SCRAM logins and a route without
// credentials, off for a route with a service user or without client
// logins, and what the route says when it says so.
func TestPassThroughResolved(t *testing.T) {
	for _, tc := range []struct {
		auth, uri, own string
		want           bool
	}{
		{`"scram"`, "mongodb://h/", "", true},
		{`"scram"`, "mongodb://svc:pw@h/", "", false},
		{`"scram"`, "mongodb://h/?authMechanism=MONGODB-X509&tls=true", "", false},
		{`"scram"`, "mongodb://h/", "false", false},
		{`"scram"`, "mongodb://h/", "true", true},
		{`"none"`, "mongodb://h/", "", false},
	} {
		doc := fmt.Sprintf("[mongobouncer]\nauth_type = %s\nauth_file = \"u.txt\"\n[databases.\"*\"]\nconnection_string = %q\n", tc.auth, tc.uri)
		if tc.auth == `"none"` {
			doc = fmt.Sprintf("[databases.\"*\"]\nconnection_string = %q\n", tc.uri)
		}
		if tc.own != "" {
			doc += "pass_through = " + tc.own + "\n"
		}
		c, err := Parse([]byte(doc), "p.toml")
		if err != nil {
			t.Fatalf("%s: %v", doc, err)
		}
		rs, err := c.Routes()
		if err != nil {
			t.Fatalf("%s: %v", doc, err)
		}
		if rs[0].PassThrough != tc.want {
			t.Errorf("%s: pass-through %v, want %v", doc, rs[0].PassThrough, tc.want)
		}
	}
}

func TestPassThroughRefusedWhereItCannotWork(t *testing.T) {
	for doc, want := range map[string]string{
		"[databases.\"*\"]\nconnection_string = \"mongodb://h/\"\npass_through = true\n":                                                                      `set auth_type = "scram"`,
		"[mongobouncer]\nauth_type = \"scram\"\nauth_file = \"u.txt\"\n[databases.\"*\"]\nconnection_string = \"mongodb://svc:pw@h/\"\npass_through = true\n": "has credentials",
		"[mongobouncer]\nuser_pool_idle_timeout = \"-1s\"\n[databases.\"*\"]\nconnection_string = \"mongodb://h/\"\n":                                         "must not be negative",
		"[databases.\"*\"]\nconnection_string = \"mongodb://h/\"\nmax_user_connections = -1\n":                                                                "max_user_connections",
		"[databases.\"*\"]\nconnection_string = \"mongodb://h/\"\nmax_db_connections = -1\n":                                                                  "max_db_connections",
		"[mongobouncer]\nmax_user_client_conn = -1\n[databases.\"*\"]\nconnection_string = \"mongodb://h/\"\n":                                                "max_user_client_conn",
	} {
		_, err := Parse([]byte(doc), "p.toml")
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "p.toml:") {
			t.Errorf("%s: error %v, want one naming the line and saying %q", doc, err, want)
		}
	}
}

// max_pool_size = "auto" is a route or global value; a number keeps its
// meaning, and the ceiling bounds the adaptive limit.
func TestMaxPoolSizeAuto(t *testing.T) {
	c, err := Parse([]byte(`[mongobouncer]
max_pool_size = "auto"
max_pool_size_ceiling = 40
min_pool_size = 2
[databases.a]
connection_string = "mongodb://h/"
[databases.b]
connection_string = "mongodb://h/"
max_pool_size = 10
`), "t.toml")
	if err != nil {
		t.Fatal(err)
	}
	routes, err := c.Routes()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Pool{}
	for _, r := range routes {
		got[r.Name] = r.Pool
	}
	if a := got["a"]; !a.AutoPoolSize() || a.MaxPoolSizeCeiling != 40 || poolValue(a, "max_pool_size") != `"auto"` {
		t.Fatalf("route a: %+v, want auto with ceiling 40", a)
	}
	if b := got["b"]; b.AutoPoolSize() || b.MaxPoolSize != 10 {
		t.Fatalf("route b: %+v, want a fixed 10", b)
	}
	for _, bad := range []struct{ doc, want string }{
		{"max_pool_size = \"big\"", `must be a number without quotes, or "auto"`},
		{"max_pool_size = -1", `must be 0 (no limit) or more, or "auto"`},
		{"max_pool_size = \"auto\"\nmax_pool_size_ceiling = 0", "max_pool_size_ceiling = 0: must be at least 1"},
		{"max_pool_size = \"auto\"\nmax_pool_size_ceiling = 4\nmin_pool_size = 5", "is greater than"},
		{"max_pool_size = \"auto\"\npool_mode = \"session\"", `"auto" needs pool_mode transaction or statement`},
	} {
		_, err := Parse([]byte("[mongobouncer]\n"+bad.doc+"\n[databases.a]\nconnection_string = \"mongodb://h/\"\n"), "t.toml")
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: error %v, want %q", bad.doc, err, bad.want)
		}
	}
}

// TestMaxUserClientConn: a global key (as PgBouncer's), 0 by default.
func TestMaxUserClientConn(t *testing.T) {
	for doc, want := range map[string]int{
		"[databases.\"*\"]\nconnection_string = \"mongodb://h/\"\n":                                           0,
		"[mongobouncer]\nmax_user_client_conn = 7\n[databases.\"*\"]\nconnection_string = \"mongodb://h/\"\n": 7,
	} {
		cfg, err := Parse([]byte(doc), "p.toml")
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Global.MaxUserClientConn != want {
			t.Errorf("%s: max_user_client_conn %d, want %d", doc, cfg.Global.MaxUserClientConn, want)
		}
	}
	if _, err := Parse([]byte("[databases.\"*\"]\nconnection_string = \"mongodb://h/\"\nmax_user_client_conn = 3\n"), "p.toml"); err == nil {
		t.Error("max_user_client_conn accepted in a route")
	}
}

// shutdown_delay: global only, 0s by default, 0s to MaxShutdownDelay.
func TestShutdownDelay(t *testing.T) {
	const route = "[databases.\"*\"]\nconnection_string = \"mongodb://h/\"\n"
	cfg, err := Parse([]byte(route), "d.toml")
	if err != nil || cfg.Global.ShutdownDelay != 0 {
		t.Fatalf("default: %v, %v; want 0s", cfg.Global.ShutdownDelay, err)
	}
	cfg, err = Parse([]byte("[mongobouncer]\nshutdown_delay = \"2s\"\n"+route), "d.toml")
	if err != nil || cfg.Global.ShutdownDelay != 2*time.Second {
		t.Fatalf("2s: %v, %v", cfg.Global.ShutdownDelay, err)
	}
	for doc, want := range map[string]string{
		"[mongobouncer]\nshutdown_delay = \"-1s\"\n" + route: "shutdown_delay = \"-1s\": must be 0s to 5m0s",
		"[mongobouncer]\nshutdown_delay = \"6m\"\n" + route:  "shutdown_delay = \"6m0s\": must be 0s to 5m0s",
		route + "shutdown_delay = \"1s\"\n":                  "shutdown_delay",
	} {
		if _, err := Parse([]byte(doc), "d.toml"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", doc, err, want)
		}
	}
}

// hello_max_await: 1s by default, 500ms to 1m.
func TestHelloMaxAwait(t *testing.T) {
	const route = "[databases.\"*\"]\nconnection_string = \"mongodb://h/\"\n"
	cfg, err := Parse([]byte(route), "h.toml")
	if err != nil || cfg.Global.HelloMaxAwait != time.Second {
		t.Fatalf("default: %v, %v; want 1s", cfg.Global.HelloMaxAwait, err)
	}
	for doc, want := range map[string]string{
		"[mongobouncer]\nhello_max_await = \"100ms\"\n" + route: "hello_max_await = \"100ms\": must be 500ms to 1m0s",
		"[mongobouncer]\nhello_max_await = \"2m\"\n" + route:    "hello_max_await = \"2m0s\": must be 500ms to 1m0s",
	} {
		if _, err := Parse([]byte(doc), "h.toml"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", doc, err, want)
		}
	}
}
