package config

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const route = "[databases.\"*\"]\nconnection_string = \"mongodb://localhost:27019/\"\n"

// Each case is a document with exactly one problem: the message must start
// with file:line and say what to do.
func TestParseErrors(t *testing.T) {
	cases := []struct {
		name string
		doc  string
		want string // the whole message starts with this
		cat  error
	}{
		{"unknown global key", "[mongobouncer]\nlisten = \"127.0.0.1:27017\"\nmax_pool = 3\n" + route,
			`t.toml:3: unknown key "max_pool" in [mongobouncer]; did you mean "max_pool_size"?`, ErrUnknownKey},
		{"unknown route key", route + "[databases.orders]\nconnection_string = \"mongodb://h/\"\nmax_pool = 4\n",
			`t.toml:5: unknown key "max_pool" in [databases.orders]; did you mean "max_pool_size"?`, ErrUnknownKey},
		{"unknown key without suggestion", "[mongobouncer]\nbananas = 1\n" + route,
			`t.toml:2: unknown key "bananas" in [mongobouncer]; remove it (known keys: listen,`, ErrUnknownKey},
		{"upstream_command_timeout zero", "[mongobouncer]\nupstream_command_timeout = \"0s\"\n" + route,
			`t.toml:2: upstream_command_timeout = "0s": must be positive`, ErrInvalidValue},
		{"upstream_command_timeout in route", route + "upstream_command_timeout = \"1s\"\n",
			`t.toml:3: unknown key "upstream_command_timeout" in [databases."*"]; upstream_command_timeout is global`, ErrUnknownKey},
		{"global-only key in route", route + "log_level = \"debug\"\n",
			`t.toml:3: unknown key "log_level" in [databases."*"]; log_level is global: set it in [mongobouncer]`, ErrUnknownKey},
		{"route key in global", "[mongobouncer]\nconnection_string = \"mongodb://h/\"\n" + route,
			`t.toml:2: unknown key "connection_string" in [mongobouncer]; connection_string belongs in a route table`, ErrUnknownKey},
		{"unknown table", route + "[database.x]\ny = 1\n",
			`t.toml:3: unknown key "database" at the top level; did you mean "databases"?`, ErrUnknownKey},
		{"global key above its table", "listen = \"127.0.0.1:1\"\n" + route,
			`t.toml:1: unknown key "listen" at the top level; listen belongs in [mongobouncer]: put that table header above it`, ErrUnknownKey},
		{"route key at the top", "connection_string = \"mongodb://h/\"\n" + route,
			`t.toml:1: unknown key "connection_string" at the top level; connection_string belongs in a route table`, ErrUnknownKey},
		{"misspelt top table", "[mongobouncr]\nlisten = \"a:1\"\n" + route,
			`t.toml:1: unknown key "mongobouncr" at the top level; did you mean "mongobouncer"?`, ErrUnknownKey},
		{"pool_mode enum", "[mongobouncer]\n\n\n\n\n\npool_mode = \"sessions\"\n" + route,
			`t.toml:7: pool_mode = "sessions": must be one of session, transaction, statement`, ErrInvalidValue},
		{"route pool_mode enum", route + "pool_mode = \"batch\"\n",
			`t.toml:3: pool_mode = "batch" in [databases."*"]: must be one of session, transaction, statement`, ErrInvalidValue},
		{"log_level enum", "[mongobouncer]\nlog_level = \"verbose\"\n" + route,
			`t.toml:2: log_level = "verbose": must be one of debug, info, warn, error`, ErrInvalidValue},
		{"log_format enum", "[mongobouncer]\nlog_format = \"JSON\"\n" + route,
			`t.toml:2: log_format = "JSON": must be one of text, json (did you mean "json"?)`, ErrInvalidValue},
		{"integer duration", "[mongobouncer]\nconnect_timeout = 30\n" + route,
			`t.toml:2: connect_timeout = 30: durations are strings with a unit: write "30s" for seconds`, ErrInvalidValue},
		{"float duration", route + "max_idle_time = 1.5\n",
			`t.toml:3: max_idle_time = 1.5 in [databases."*"]: durations are strings with a unit`, ErrInvalidValue},
		{"bad duration string", "[mongobouncer]\nshutdown_timeout = \"30 seconds\"\n" + route,
			`t.toml:2: shutdown_timeout = "30 seconds": not a duration: write a number with a unit`, ErrInvalidValue},
		{"quoted boolean", "[mongobouncer]\nevent_loop = \"yes\"\n" + route,
			`t.toml:2: event_loop = "yes": must be true or false without quotes`, ErrInvalidValue},
		{"number as boolean", "[mongobouncer]\nevent_loop = 1\n" + route,
			`t.toml:2: event_loop = 1: must be true or false`, ErrInvalidValue},
		{"duration without unit", "[mongobouncer]\nwait_queue_timeout = \"30\"\n" + route,
			`t.toml:2: wait_queue_timeout = "30": not a duration`, ErrInvalidValue},
		{"boolean duration", "[mongobouncer]\nclient_idle_timeout = true\n" + route,
			`t.toml:2: client_idle_timeout = true: must be a duration string with a unit, as in "30s", not a boolean`, ErrInvalidValue},
		{"negative duration", "[mongobouncer]\nmax_idle_time = \"-5s\"\n" + route,
			`t.toml:2: max_idle_time = "-5s": must not be negative`, ErrInvalidValue},
		{"quoted integer", "[mongobouncer]\nmax_pool_size = \"20\"\n" + route,
			`t.toml:2: max_pool_size = "20": must be a number without quotes`, ErrInvalidValue},
		{"float integer", "[mongobouncer]\nmax_connecting = 2.5\n" + route,
			`t.toml:2: max_connecting = 2.5: must be a whole number`, ErrInvalidValue},
		{"huge integer", "[mongobouncer]\nmax_client_conn = 99999999999\n" + route,
			`t.toml:2: max_client_conn = 99999999999: out of range`, ErrInvalidValue},
		{"array for string", "[mongobouncer]\nlisten = [\"a:1\"]\n" + route,
			`t.toml:2: listen = [...]: must be a string in quotes, not an array`, ErrInvalidValue},
		{"multi-line value", "[mongobouncer]\nmax_pool_size = \"\"\"\n1\n2\"\"\"\n" + route,
			"t.toml:2: max_pool_size = \"\"\"...: must be a number without quotes", ErrInvalidValue},
		{"control characters in listen", "[mongobouncer]\nlisten = \"\"\"\n1\n2\"\"\"\n" + route,
			`t.toml:2: listen = "1\n2": contains control characters`, ErrInvalidValue},
		{"date for string", "[mongobouncer]\napp_name = 1979-05-27\n" + route,
			`t.toml:2: app_name = 1979-05-27: must be a string in quotes, not a date or time`, ErrInvalidValue},
		{"negative pool size", route + "max_pool_size = -1\n",
			`t.toml:3: max_pool_size = -1 in [databases."*"]: must be 0 (no limit) or more`, ErrInvalidValue},
		{"negative min pool size", "[mongobouncer]\nmin_pool_size = -1\n" + route,
			`t.toml:2: min_pool_size = -1: must be 0 or more`, ErrInvalidValue},
		{"negative max_client_conn", "[mongobouncer]\nmax_client_conn = -1\n" + route,
			`t.toml:2: max_client_conn = -1: must be 0 (no limit) or more`, ErrInvalidValue},
		{"small max_prelogin_message_size", "[mongobouncer]\nmax_prelogin_message_size = 1000\n" + route,
			`t.toml:2: max_prelogin_message_size = 1000: must be from 16384 to 48000000 bytes`, ErrInvalidValue},
		{"max_prelogin_message_size in a route", route + "max_prelogin_message_size = 65536\n",
			`t.toml:3: unknown key "max_prelogin_message_size" in [databases."*"]; max_prelogin_message_size is global: set it in [mongobouncer]`, ErrUnknownKey},
		{"negative event_loop_threads", "[mongobouncer]\nevent_loop_threads = -1\n" + route,
			`t.toml:2: event_loop_threads = -1: must be 0 (one per CPU) to 256`, ErrInvalidValue},
		{"unknown event_loop_io", "[mongobouncer]\nevent_loop_io = \"iouring\"\n" + route,
			`t.toml:2: event_loop_io = "iouring": must be one of auto, epoll, io_uring (did you mean "io_uring"?)`, ErrInvalidValue},
		{"event_loop_spin too long", "[mongobouncer]\nevent_loop_spin = \"2ms\"\n" + route,
			`t.toml:2: event_loop_spin = "2ms": must be 0 (never spin) to 1ms`, ErrInvalidValue},
		{"event_loop_spin in a route", route + "event_loop_spin = \"100us\"\n",
			`t.toml:3: unknown key "event_loop_spin" in [databases."*"]; event_loop_spin is global: set it in [mongobouncer]`, ErrUnknownKey},
		{"event_loop_io in a route", route + "event_loop_io = \"epoll\"\n",
			`t.toml:3: unknown key "event_loop_io" in [databases."*"]; event_loop_io is global: set it in [mongobouncer]`, ErrUnknownKey},
		{"event_loop_threads in a route", route + "event_loop_threads = 2\n",
			`t.toml:3: unknown key "event_loop_threads" in [databases."*"]; event_loop_threads is global: set it in [mongobouncer]`, ErrUnknownKey},
		{"min over max", "[mongobouncer]\nmax_pool_size = 5\nmin_pool_size = 6\n" + route,
			`t.toml:3: min_pool_size = 6 is greater than max_pool_size = 5: lower min_pool_size or raise max_pool_size`, ErrInvalidValue},
		{"min over unlimited is fine, max_connecting 0 is not", "[mongobouncer]\nmax_pool_size = 0\nmin_pool_size = 6\nmax_connecting = 0\n" + route,
			`t.toml:4: max_connecting = 0: must be at least 1`, ErrInvalidValue},
		{"heartbeat too fast", "[mongobouncer]\nheartbeat_interval = \"100ms\"\n" + route,
			`t.toml:2: heartbeat_interval = "100ms": must be at least 500ms`, ErrInvalidValue},
		{"zero connect timeout", "[mongobouncer]\nconnect_timeout = \"0s\"\n" + route,
			`t.toml:2: connect_timeout = "0s": must be more than 0`, ErrInvalidValue},
		{"zero selection timeout", route + "server_selection_timeout = \"0s\"\n",
			`t.toml:3: server_selection_timeout = "0s" in [databases."*"]: must be more than 0`, ErrInvalidValue},
		{"message size too small", "[mongobouncer]\nmax_message_size = 1024\n" + route,
			`t.toml:2: max_message_size = 1024: must be from 16384 to 48000000 bytes`, ErrInvalidValue},
		{"message size too large", route + "max_message_size = 48000001\n",
			`t.toml:3: max_message_size = 48000001 in [databases."*"]: must be from 16384 to 48000000 bytes`, ErrInvalidValue},
		{"app name too long", "[mongobouncer]\napp_name = \"" + strings.Repeat("a", 129) + "\"\n" + route,
			`t.toml:2: app_name = "` + strings.Repeat("a", 129) + `": 129 bytes long: the handshake allows at most 128`, ErrInvalidValue},
		{"bad listen", "[mongobouncer]\nlisten = \"127.0.0.1\"\n" + route,
			`t.toml:2: listen = "127.0.0.1": use host:port`, ErrInvalidValue},
		{"bad port", "[mongobouncer]\nlisten = \"127.0.0.1:99999\"\n" + route,
			`t.toml:2: listen = "127.0.0.1:99999": the port must be a number from 0 to 65535`, ErrInvalidValue},
		{"empty listen", "[mongobouncer]\nlisten = \"\"\n" + route,
			`t.toml:2: listen = "": empty`, ErrInvalidValue},
		{"bad admin listen", "[mongobouncer]\nadmin_listen = \"nowhere\"\n" + route,
			`t.toml:2: admin_listen = "nowhere": use host:port`, ErrInvalidValue},
		{"bad route listen", route + "listen = \"x:y\"\n",
			`t.toml:3: listen = "x:y" in [databases."*"]: the port must be a number`, ErrInvalidValue},
		{"duplicate listen", "[mongobouncer]\nlisten = \"127.0.0.1:6000\"\n" + route + "listen = \"0.0.0.0:6000\"\n",
			`t.toml:5: listen = "0.0.0.0:6000" in [databases."*"]: already taken by listen in [mongobouncer]`, ErrInvalidValue},
		{"admin on the client port", "[mongobouncer]\nlisten = \"127.0.0.1:6000\"\nadmin_listen = \"127.0.0.1:6000\"\n" + route,
			`t.toml:3: admin_listen = "127.0.0.1:6000": already taken by listen in [mongobouncer]`, ErrInvalidValue},
		{"no routes", "[mongobouncer]\nlisten = \"127.0.0.1:6000\"\n",
			`t.toml: no routes: add a [databases."*"] table`, ErrInvalidValue},
		{"empty databases table", "[databases]\n",
			`t.toml:1: no routes`, ErrInvalidValue},
		{"bad route name", "[databases.\"a.b\"]\nconnection_string = \"mongodb://h/\"\n",
			`t.toml:1: route name "a.b": database names cannot contain`, ErrInvalidValue},
		{"empty route name", "[databases.\"\"]\nconnection_string = \"mongodb://h/\"\n",
			`t.toml:1: route name "": empty`, ErrInvalidValue},
		{"long route name", "[databases." + strings.Repeat("d", 64) + "]\nconnection_string = \"mongodb://h/\"\n",
			`t.toml:1: route name "` + strings.Repeat("d", 64) + `": 64 bytes long`, ErrInvalidValue},
		{"case-only duplicate", route + "[databases.Orders]\nconnection_string = \"mongodb://h/\"\n[databases.orders]\nconnection_string = \"mongodb://h/\"\n",
			`t.toml:5: routes [databases.Orders] and [databases.orders] differ only in case`, ErrInvalidValue},
		{"missing connection string", route + "[databases.orders]\nmax_pool_size = 3\n",
			`t.toml:3: [databases.orders] has no connection_string: add connection_string = "mongodb://host:27017/"`, ErrInvalidValue},
		{"bad connection string", "[databases.orders]\n\nconnection_string = \"postgres://h/\"\n",
			`t.toml:3: connection_string in [databases.orders]: must start with mongodb://`, ErrConnString},
		{"unsupported option", "[databases.orders]\nconnection_string = \"mongodb://u:pw@h/?proxyHost=p\"\n",
			`t.toml:2: connection_string in [databases.orders]: option proxyHost is not supported`, ErrConnString},
		{"srv with port", "[databases.orders]\nconnection_string = \"mongodb+srv://u:pw@cluster0.example.net:27017/\"\n",
			`t.toml:2: connection_string in [databases.orders]: mongodb+srv:// takes a host name without a port`, ErrConnString},
		{"read_preference", "[mongobouncer]\nread_preference = \"secundary\"\n" + route,
			`t.toml:2: read_preference = "secundary": must be one of primary, primaryPreferred, secondary, secondaryPreferred, nearest (did you mean "secondary"?)`, ErrInvalidValue},
		{"tags with primary", route + "read_preference_tags = [{dc = \"east\"}]\n",
			`t.toml:3: read_preference_tags = [{dc = "east"}] in [databases."*"] with read_preference = "primary" (from [mongobouncer]): tags select secondaries`, ErrInvalidValue},
		{"tags not strings", route + "read_preference = \"nearest\"\nread_preference_tags = [{rack = 1}]\n",
			`t.toml:4: read_preference_tags = [...] in [databases."*"]: must be an array of tables of strings, as in [{dc = "east"}, {}]: tag rack is an integer; quote it`, ErrInvalidValue},
		{"tags not an array", "[mongobouncer]\nread_preference_tags = {dc = \"east\"}\n" + route,
			`t.toml:2: read_preference_tags: must be an array of tables of strings, as in [{dc = "east"}, {}], not a table`, ErrInvalidValue},
		{"max staleness with primary", "[mongobouncer]\nmax_staleness = \"120s\"\n" + route,
			`t.toml:2: max_staleness = "2m0s" with read_preference = "primary": max staleness applies to secondaries`, ErrInvalidValue},
		{"max staleness too small", "[mongobouncer]\nread_preference = \"nearest\"\n" + route + "max_staleness = \"30s\"\n",
			`t.toml:5: max_staleness = "30s" in [databases."*"]: must be at least 90s`, ErrInvalidValue},
		{"max staleness below heartbeat", "[mongobouncer]\nread_preference = \"nearest\"\nheartbeat_interval = \"100s\"\n" + route + "max_staleness = \"100s\"\n",
			`t.toml:6: max_staleness = "1m40s" in [databases."*"] is less than heartbeat_interval = "1m40s" (from [mongobouncer]) plus the 10s idle write period`, ErrInvalidValue},
		{"max staleness from the string", "[mongobouncer]\nread_preference = \"nearest\"\n[databases.a]\nconnection_string = \"mongodb://h/?maxStalenessSeconds=90&heartbeatFrequencyMS=90000\"\n",
			`t.toml:4: maxStalenessSeconds=90 in the connection_string of [databases.a] is less than heartbeatFrequencyMS=90000`, ErrInvalidValue},
		{"max staleness from the string, no mode", "[databases.a]\nconnection_string = \"mongodb://h/?maxStalenessSeconds=120\"\n",
			`t.toml:2: maxStalenessSeconds=120 in the connection_string of [databases.a] with read_preference = "primary" (from [mongobouncer]): max staleness applies to secondaries`, ErrInvalidValue},
		{"negative local_threshold", "[mongobouncer]\nlocal_threshold = \"-1ms\"\n" + route,
			`t.toml:2: local_threshold = "-1ms": must not be negative`, ErrInvalidValue},
		{"connection string option out of range", "[databases.orders]\nconnection_string = \"mongodb://h/?heartbeatFrequencyMS=10\"\n",
			`t.toml:2: heartbeatFrequencyMS=10 in the connection_string of [databases.orders]: must be at least 500ms`, ErrInvalidValue},
		{"connection string min over route max", "[databases.orders]\nconnection_string = \"mongodb://h/?minPoolSize=10\"\nmax_pool_size = 5\n",
			`t.toml:2: minPoolSize=10 in the connection_string of [databases.orders] is greater than max_pool_size = 5 in [databases.orders]`, ErrInvalidValue},
		{"connection string as a table", "[databases.orders]\nconnection_string = { host = \"h\" }\n",
			`t.toml:2: connection_string in [databases.orders]: must be a string in quotes, not a table`, ErrInvalidValue},
		{"route as a value", "[databases]\norders = \"mongodb://h/\"\n",
			`t.toml:2: databases.orders must be a route table, as in [databases.orders]`, ErrInvalidValue},
		{"route key directly in databases", "[databases]\nconnection_string = \"mongodb://h/\"\n",
			`t.toml:2: connection_string belongs in a route table such as [databases."*"], not directly in [databases]`, ErrInvalidValue},
		{"databases as a value", "databases = 5\n",
			`t.toml:1: databases must hold one table per route`, ErrInvalidValue},
		{"mongobouncer as a value", "mongobouncer = \"x\"\n" + route,
			`t.toml:1: mongobouncer must be a table`, ErrInvalidValue},
		{"syntax error", "[mongobouncer]\npool_mode = \"session\n" + route,
			`t.toml:2: `, ErrSyntax},
		{"duplicate key", "[mongobouncer]\npool_mode = \"session\"\npool_mode = \"statement\"\n" + route,
			`t.toml:3: key pool_mode is already defined`, ErrSyntax},
		{"inline route, dotted keys", "databases.orders = { connection_string = \"mongodb://h/\", max_pool = 1 }\n",
			`t.toml:1: unknown key "max_pool" in [databases.orders]; did you mean "max_pool_size"?`, ErrUnknownKey},
		{"dotted key value error", "databases.orders.connection_string = \"mongodb://h/\"\n\ndatabases.orders.min_pool_size = -4\n",
			`t.toml:3: min_pool_size = -4 in [databases.orders]: must be 0 or more`, ErrInvalidValue},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := Parse([]byte(c.doc), "t.toml")
			if err == nil {
				t.Fatalf("no error for:\n%s", c.doc)
			}
			ps := Problems(err)
			if len(ps) != 1 {
				t.Fatalf("want 1 problem, got %d:\n%v", len(ps), err)
			}
			if !strings.HasPrefix(err.Error(), c.want) {
				t.Errorf("error:\n  %s\nwant prefix:\n  %s", err, c.want)
			}
			if !errors.Is(err, c.cat) {
				t.Errorf("errors.Is(err, %v) = false for %v", c.cat, err)
			}
			var pe *Error
			if !errors.As(err, &pe) || pe.File != "t.toml" {
				t.Errorf("errors.As: %#v", pe)
			}
			if cfg.Databases != nil || cfg.Path != "" {
				t.Errorf("a failed Parse returned a config: %+v", cfg)
			}
		})
	}
}

// All problems come at once, in file order, each with its own line.
func TestParseReportsAllProblems(t *testing.T) {
	doc := `[mongobouncer]
pool_mode = "sessions"
max_pool = 3
connect_timeout = 30
log_level = "loud"

[databases.orders]
connection_string = "mongodb://h/?tls=maybe"
max_pool_size = -2
log_format = "json"

[databases."*"]
connection_string = "mongodb+srv://cluster.example.net:1/"
`
	_, err := Parse([]byte(doc), "mongobouncer.toml")
	ps := Problems(err)
	wantLines := []int{2, 3, 4, 5, 8, 9, 10, 13}
	if len(ps) != len(wantLines) {
		t.Fatalf("got %d problems, want %d:\n%v", len(ps), len(wantLines), err)
	}
	for i, p := range ps {
		if p.Line != wantLines[i] || p.Column != 1 {
			t.Errorf("problem %d at %d:%d, want line %d col 1: %v", i, p.Line, p.Column, wantLines[i], p)
		}
		if !strings.HasPrefix(p.Error(), "mongobouncer.toml:") {
			t.Errorf("problem without file: %v", p)
		}
	}
	if !errors.Is(err, ErrUnknownKey) || !errors.Is(err, ErrInvalidValue) || !errors.Is(err, ErrConnString) {
		t.Errorf("categories not all reachable with errors.Is: %v", err)
	}
	// The bad connect_timeout stays at its default, and Validate has
	// nothing more to say about it.
	if strings.Count(err.Error(), "connect_timeout") != 1 {
		t.Errorf("connect_timeout reported more than once:\n%v", err)
	}
}

// Problems found by Validate after Parse still know their line: the
// position index travels with the Config.
func TestValidateAfterParseKeepsPositions(t *testing.T) {
	c, err := Parse([]byte("[mongobouncer]\nmax_pool_size = 10\n\n"+route), "p.toml")
	if err != nil {
		t.Fatal(err)
	}
	c.Global.MaxPoolSize = -2
	err = c.Validate()
	if !strings.HasPrefix(err.Error(), "p.toml:2: max_pool_size = -2: must be 0 (no limit) or more") {
		t.Fatalf("got %v", err)
	}
	if _, err := c.Routes(); err == nil || !strings.HasPrefix(err.Error(), "p.toml:2:") {
		t.Fatalf("Routes: %v", err)
	}
}

// The connection string never appears in a message, even when it is the
// thing that is wrong.
func TestParseErrorsHideConnectionString(t *testing.T) {
	docs := []string{
		"[databases.a]\nconnection_string = \"mongodb://user:hunter2@h:0/\"\n",
		"[databases.a]\nconnection_string = \"mongodb://user:hunter2@h/?proxyHost=x\"\n",
		"[databases.a]\nconnection_string = \"mongodb://user:hunter2@h/?tlsCertificateKeyFilePassword=hunter2%zz\"\n",
		"[databases.a]\nconnection_string = \"mongodb+srv://user:hunter2@h:1/\"\n",
		"[databases.a]\nconnection_string = \"mysql://user:hunter2@h/\"\n",
		"[databases.a]\nconnection_string = \"mongodb://user:hunter2@h/\"\nbogus = 1\nmax_pool_size = -1\n",
		"[databases.a]\nconnection_string = \"mongodb://user:hunter2@h/\"\nconnection_string = \"mongodb://user:hunter2@h/\"\n",
	}
	for _, doc := range docs {
		_, err := Parse([]byte(doc), "s.toml")
		if err == nil {
			t.Fatalf("no error for %q", doc)
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("secret in error: %v", err)
		}
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.toml")
	if err := os.WriteFile(good, []byte(route), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(good)
	if err != nil || c.Path != good || len(c.Databases) != 1 {
		t.Fatalf("Load = %+v, %v", c, err)
	}

	bad := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(bad, []byte("[mongobouncer]\nmax_pool = 1\n"+route), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(bad); err == nil || !strings.HasPrefix(err.Error(), bad+":2: unknown key") {
		t.Fatalf("Load(bad) = %v", err)
	}

	_, err = Load(filepath.Join(dir, "missing.toml"))
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "missing.toml: cannot read") {
		t.Fatalf("Load(missing) = %v", err)
	}

	big := filepath.Join(dir, "big.toml")
	data := []byte(route + "#" + strings.Repeat("x", MaxFileSize) + "\n")
	if err := os.WriteFile(big, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("Load(big) = %v", err)
	}

	if _, err := Load(dir); err == nil {
		t.Fatal("Load(directory) succeeded")
	}
}

// Parse without a file name still gives lines.
func TestParseNoFilename(t *testing.T) {
	_, err := Parse([]byte("[mongobouncer]\nmax_pool = 1\n"+route), "")
	if err == nil || !strings.HasPrefix(err.Error(), "line 2: unknown key") {
		t.Fatalf("got %v", err)
	}
}

// upstream_command_timeout is read, and defaults to 5s.
func TestUpstreamCommandTimeout(t *testing.T) {
	c, err := Parse([]byte(route), "t.toml")
	if err != nil || c.Global.UpstreamCommandTimeout != 5*time.Second {
		t.Fatalf("default: %v, %v", c.Global.UpstreamCommandTimeout, err)
	}
	c, err = Parse([]byte("[mongobouncer]\nupstream_command_timeout = \"750ms\"\n"+route), "t.toml")
	if err != nil || c.Global.UpstreamCommandTimeout != 750*time.Millisecond {
		t.Fatalf("set: %v, %v", c.Global.UpstreamCommandTimeout, err)
	}
}
