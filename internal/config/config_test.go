package config

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// The package starts no goroutines; this keeps it that way.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestDefault(t *testing.T) {
	g := Default().Global
	want := Global{
		Listen: "127.0.0.1:27017", AdminListen: "", MaxClientConn: 10000, MaxPreLoginMessageSize: 64 * 1024,
		LogLevel: LogLevelInfo, LogFormat: LogFormatText, ShutdownTimeout: 30 * time.Second, HelloMaxAwait: time.Second,
		UpstreamCommandTimeout: 5 * time.Second,
		EventLoop:              true, EventLoopIO: EventLoopIOAuto, EventLoopSpin: 150 * time.Microsecond, AuthType: AuthNone,
		AuthMaxLookups: 16,
		TLSMode:        TLSModeDisable, TLSHandshakeTimeout: 10 * time.Second,
		UserPoolIdleTimeout: 10 * time.Minute,
		AuthCacheTTL:        30 * time.Second,
		AuthLookupsPerPeer:  4,
		MaxSCRAMIterations:  100_000,
		ClientLoginTimeout:  60 * time.Second,
		TLSWatchInterval:    30 * time.Second,
		Pool: Pool{
			PoolMode: PoolModeTransaction, MaxPoolSize: 100, MaxPoolSizeCeiling: 100, MinPoolSize: 0, MaxIdleTime: 0,
			MaxConnecting: 2, WaitQueueTimeout: 30 * time.Second, HeartbeatInterval: 10 * time.Second,
			ConnectTimeout: 10 * time.Second, ServerSelectionTimeout: 30 * time.Second,
			ClientIdleTimeout: 0, MaxMessageSize: 48_000_000, AppName: "mongobouncer",
			ReadPreference: ReadPrimary, LocalThreshold: 15 * time.Millisecond,
		},
	}
	if !reflect.DeepEqual(g, want) {
		t.Fatalf("Default().Global =\n%+v\nwant\n%+v", g, want)
	}
	if Default().Databases != nil {
		t.Fatal("Default has routes")
	}
}

// Default has no routes, and that is the only thing wrong with it.
func TestDefaultNeedsOnlyARoute(t *testing.T) {
	c := Default()
	ps := Problems(c.Validate())
	if len(ps) != 1 || !strings.Contains(ps[0].Msg, "no routes") || !errors.Is(ps[0], ErrInvalidValue) {
		t.Fatalf("Validate(Default()) = %v, want only the missing route", ps)
	}
	c.Databases = map[string]Route{CatchAll: {ConnectionString: "mongodb://localhost:27019/"}}
	if err := c.Validate(); err != nil {
		t.Fatalf("Default plus a route: %v", err)
	}
}

// A file that sets nothing but a route gets exactly the defaults.
func TestParseMinimalGetsDefaults(t *testing.T) {
	c, err := Parse([]byte("[databases.\"*\"]\nconnection_string = \"mongodb://localhost:27019/\"\n"), "min.toml")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c.Global, Default().Global) {
		t.Fatalf("Global = %+v, want defaults", c.Global)
	}
	if c.Path != "min.toml" {
		t.Fatalf("Path = %q", c.Path)
	}
	c, err = Parse([]byte("[mongobouncer]\nevent_loop = false\n[databases.\"*\"]\nconnection_string = \"mongodb://localhost:27019/\"\n"), "loop.toml")
	if err != nil || c.Global.EventLoop {
		t.Fatalf("event_loop = false: %v, EventLoop %v", err, c.Global.EventLoop)
	}
}

// The zero Config must be safe: Validate reports its invalid zero values
// (without file or line) rather than panicking, and Routes refuses it.
func TestZeroConfig(t *testing.T) {
	var c Config
	err := c.Validate()
	if err == nil {
		t.Fatal("zero Config validated")
	}
	for _, want := range []string{
		"listen = \"\": empty", "log_level = \"\": must be one of", "log_format = \"\": must be one of",
		"pool_mode = \"\": must be one of", "max_connecting = 0: must be at least 1",
		"heartbeat_interval = \"0s\": must be at least 500ms", "connect_timeout = \"0s\": must be more than 0",
		"server_selection_timeout = \"0s\"", "max_message_size = 0: must be from 16384",
		"no routes",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in:\n%v", want, err)
		}
	}
	for _, p := range Problems(err) {
		if p.File != "" || p.Line != 0 || strings.HasPrefix(p.Error(), ":") {
			t.Errorf("code-built config problem has a position: %q", p.Error())
		}
	}
	if rs, err := c.Routes(); err == nil || rs != nil {
		t.Fatalf("Routes on zero Config = %v, %v", rs, err)
	}
}

func TestValidateCodeBuilt(t *testing.T) {
	c := Default()
	c.Global.MaxPoolSize = 10
	c.Databases = map[string]Route{
		"orders": {ConnectionString: "mongodb://h1/", Overrides: Overrides{MinPoolSize: new(20)}},
		CatchAll: {ConnectionString: "mongodb://h2/?heartbeatFrequencyMS=100"},
	}
	err := c.Validate()
	want := []string{
		`min_pool_size = 20 in [databases.orders] is greater than max_pool_size = 10 (from [mongobouncer])`,
		`heartbeatFrequencyMS=100 in the connection_string of [databases."*"]: must be at least 500ms`,
	}
	ps := Problems(err)
	if len(ps) != len(want) {
		t.Fatalf("got %d problems, want %d:\n%v", len(ps), len(want), err)
	}
	for i, w := range want {
		if !strings.HasPrefix(ps[i].Error(), w) {
			t.Errorf("problem %d = %q, want prefix %q", i, ps[i].Error(), w)
		}
	}
	if ps[0].Key != "databases.orders.min_pool_size" || ps[1].Key != `databases."*".connection_string` {
		t.Errorf("keys = %q, %q", ps[0].Key, ps[1].Key)
	}
	// Path alone (no source) still names the file.
	c.Path = "built.toml"
	if e := Problems(c.Validate())[0].Error(); !strings.HasPrefix(e, "built.toml: ") {
		t.Errorf("with Path set: %q", e)
	}
}

func examplePath(t *testing.T) string {
	t.Helper()
	p := filepath.Join("..", "..", "examples", "mongobouncer.toml")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("example file: %v", err)
	}
	return p
}

// Connection-string warnings reach the caller with the file and line of the
// connection_string, and without its secrets.
func TestConfigWarnings(t *testing.T) {
	doc := "[databases.a]\nconnection_string = \"mongodb://u:Hunter2Zz@h/?maxConnecting=0&journal=maybe\"\n" +
		"\n[databases.b]\nconnection_string = \"mongodb://h/?authMechanismProperties=A:Hunter2Zz,B&authSource=x\"\n" +
		"[databases.c]\nconnection_string = \"mongodb://h/\"\n" +
		"[databases.d]\nconnection_string = \"mongodb://h/?w=majority&retryWrites=true&socketTimeoutMS=0\"\n"
	c, err := Parse([]byte(doc), "w.toml")
	if err != nil {
		t.Fatal(err)
	}
	ws := c.Warnings()
	want := []string{
		`w.toml:2: connection_string in [databases.a]: maxConnecting="0" ignored: must be a whole number from 1 to 2147483647`,
		`w.toml:2: connection_string in [databases.a]: journal="maybe" ignored: must be true or false`,
		`w.toml:5: connection_string in [databases.b]: authMechanismProperties ignored: must be comma-separated KEY:value pairs`,
		`w.toml:9: connection_string in [databases.d]: options retryWrites, socketTimeoutMS, w are ignored: a driver applies them itself`,
	}
	if len(ws) != len(want) {
		t.Fatalf("got %d warnings, want %d: %v", len(ws), len(want), ws)
	}
	for i, w := range want {
		if !strings.HasPrefix(ws[i].Error(), w) || !errors.Is(ws[i], ErrConnStringWarning) || strings.Contains(ws[i].Error(), "Hunter2Zz") {
			t.Errorf("warning %d = %q, want prefix %q", i, ws[i], w)
		}
	}
	rs, err := c.Routes()
	if err != nil || rs[0].MaxConnecting != Default().Global.MaxConnecting {
		t.Errorf("the ignored maxConnecting changed the route: %v %+v", err, rs)
	}
}

// The shipped example must load and mean what its comments say.
func TestExampleFile(t *testing.T) {
	c, err := Load(examplePath(t))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c.Global, Default().Global) {
		t.Errorf("the example's [mongobouncer] should show the defaults; got %+v", c.Global)
	}
	rs, err := c.Routes()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range rs {
		names = append(names, r.Name)
	}
	if got := strings.Join(names, ","); got != "orders,reporting,*" {
		t.Fatalf("routes = %s", got)
	}
	orders, reporting, all := rs[0], rs[1], rs[2]
	if orders.PoolMode != PoolModeStatement || orders.MaxPoolSize != 20 || orders.WaitQueueTimeout != 5*time.Second ||
		orders.Listen != "127.0.0.1:27018" || orders.Origins["max_pool_size"] != FromRoute {
		t.Errorf("orders = %+v", orders)
	}
	if orders.Conn.Username != "orders_svc" || orders.Conn.Password != "change@me" || orders.Conn.ReplicaSet != "rs-orders" ||
		orders.Conn.AuthSource != "orders" || len(orders.Conn.Hosts) != 2 {
		t.Errorf("orders connection = %#v (user %q)", orders.Conn, orders.Conn.Username)
	}
	if reporting.MinPoolSize != 5 || reporting.WaitQueueTimeout != time.Minute ||
		reporting.Origins["wait_queue_timeout"] != FromConnString || !reporting.Conn.TLS ||
		reporting.Conn.Hosts[1] != (Host{NetworkTCP, "[fd00::12]:27017"}) {
		t.Errorf("reporting = %+v", reporting)
	}
	if reporting.ReadPreference != ReadSecondaryPreferred || reporting.MaxStaleness != 2*time.Minute ||
		!reflect.DeepEqual(reporting.ReadPreferenceTags, []map[string]string{{"dc": "east"}, {}}) ||
		reporting.ServerSelectionTimeout != 10*time.Second || reporting.LocalThreshold != 15*time.Millisecond ||
		orders.ReadPreference != ReadPrimary || orders.ServerSelectionTimeout != 30*time.Second {
		t.Errorf("read preference: reporting %+v, orders %+v", reporting.Pool, orders.Pool)
	}
	if w := c.Warnings(); len(w) != 0 {
		t.Errorf("the example warns: %v", w)
	}
	if all.Conn.Hosts[0] != (Host{NetworkUnix, "/tmp/mongodb-27019.sock"}) || all.AppName != "mongobouncer-main" ||
		all.PoolMode != PoolModeTransaction {
		t.Errorf("catch-all = %+v", all)
	}
	// Printing the whole config must not show the password.
	for _, format := range []string{"%v", "%+v", "%#v", "%s"} {
		if s := fmt.Sprintf(format, c); strings.Contains(s, "change%40me") || strings.Contains(s, "change@me") {
			t.Errorf("%s of Config shows the password: %s", format, s)
		}
		if s := fmt.Sprintf(format, rs); strings.Contains(s, "change%40me") || strings.Contains(s, "change@me") {
			t.Errorf("%s of routes shows the password: %s", format, s)
		}
	}
	var buf strings.Builder
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("cfg", "uri", c.Databases["orders"].ConnectionString, "conn", orders.Conn)
	if strings.Contains(buf.String(), "change") {
		t.Errorf("slog shows the password: %s", buf.String())
	}
}

func TestSplitListen(t *testing.T) {
	ok := []struct{ in, network string }{
		{"127.0.0.1:27017", NetworkTCP},
		{":27017", NetworkTCP},
		{"[::1]:27017", NetworkTCP},
		{"[fe80::1%eth0]:0", NetworkTCP},
		{"localhost:0", NetworkTCP},
		{"/run/mongobouncer/mongobouncer.sock", NetworkUnix},
		{"/tmp/mb", NetworkUnix},
		{"mb.sock", NetworkUnix},
	}
	for _, c := range ok {
		n, a, err := SplitListen(c.in)
		if err != nil || n != c.network || a != c.in {
			t.Errorf("SplitListen(%q) = %q, %q, %v", c.in, n, a, err)
		}
	}
	for _, in := range []string{"", "127.0.0.1", "127.0.0.1:", "127.0.0.1:65536", "127.0.0.1:http", "::1:27017",
		"[::1", "[zz::]:1", "a b:1", "host:1\n", "/" + strings.Repeat("x", 107)} {
		if _, _, err := SplitListen(in); err == nil || !errors.Is(err, ErrInvalidValue) {
			t.Errorf("SplitListen(%q) err = %v", in, err)
		}
	}
}

func TestListenConflict(t *testing.T) {
	cases := []struct {
		a, b string
		want bool
	}{
		{"127.0.0.1:27017", "127.0.0.1:27017", true},
		{"127.0.0.1:27017", "127.0.0.1:27018", false},
		{"0.0.0.0:27017", "127.0.0.1:27017", true},
		{":27017", "[::1]:27017", true},
		{"[::]:27017", "10.0.0.1:27017", true},
		{"[::1]:27017", "[0:0::1]:27017", true},
		{"LOCALHOST:1", "localhost:1", true},
		{"127.0.0.1:0", "127.0.0.1:0", false},
		{"127.0.0.1:27017", "127.0.0.1:027017", true},
		{"/tmp/a.sock", "/tmp//a.sock", true},
		{"/tmp/a.sock", "/tmp/b.sock", false},
		{"/tmp/27017.sock", "127.0.0.1:27017", false},
	}
	for _, c := range cases {
		if got := listenConflict(c.a, c.b); got != c.want {
			t.Errorf("listenConflict(%q, %q) = %v", c.a, c.b, got)
		}
	}
}

func TestLogLevel(t *testing.T) {
	for l, want := range map[LogLevel]slog.Level{
		LogLevelDebug: slog.LevelDebug, LogLevelInfo: slog.LevelInfo,
		LogLevelWarn: slog.LevelWarn, LogLevelError: slog.LevelError,
	} {
		if !l.Valid() || l.Level() != want {
			t.Errorf("%q: Valid %v Level %v", l, l.Valid(), l.Level())
		}
	}
	if LogLevel("verbose").Valid() || LogFormat("xml").Valid() || PoolMode("sessions").Valid() {
		t.Error("invalid enum accepted")
	}
}

func TestSuggest(t *testing.T) {
	keys := append(globalKeys, routeKeys...)
	cases := map[string]string{
		"max_pool":           "max_pool_size",
		"maxPoolSize":        "max_pool_size",
		"max-pool-size":      "max_pool_size",
		"pool_mod":           "pool_mode",
		"conection_string":   "connection_string",
		"log_levl":           "log_level",
		"shutdown_timout":    "shutdown_timeout",
		"totally_unrelated":  "",
		"x":                  "",
		"heartbeat_interval": "heartbeat_interval",
	}
	for in, want := range cases {
		if got := suggest(in, keys); got != want {
			t.Errorf("suggest(%q) = %q, want %q", in, got, want)
		}
	}
}
