package config

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestAuthKeys(t *testing.T) {
	doc := "[mongobouncer]\nauth_type = \"scram\"\nauth_file = \"users.txt\"\nauth_user = \"mb@x@admin\"\nadmin_users = [\"ops@admin\"]\n" + route
	cfg, err := Parse([]byte(doc), "/etc/mb/mb.toml")
	if err != nil {
		t.Fatal(err)
	}
	g := cfg.Global
	if g.AuthType != AuthSCRAM || g.AuthUser != "mb@x@admin" || len(g.AdminUsers) != 1 || g.AdminUsers[0] != "ops@admin" {
		t.Fatalf("%+v", g)
	}
	if got := cfg.AuthFilePath(); got != filepath.Join("/etc/mb", "users.txt") {
		t.Fatal(got)
	}
	if u, db, ok := SplitUser(g.AuthUser); !ok || u != "mb@x" || db != "admin" {
		t.Fatal(u, db, ok)
	}
	if d, err := Parse([]byte(route), "t.toml"); err != nil || d.Global.AuthType != AuthNone {
		t.Fatal(err, d.Global.AuthType)
	}
	doc = "[mongobouncer]\nauth_cache_ttl = \"5s\"\nauth_lookups_per_peer = 2\nauth_max_lookups = 32\n" + route
	if d, err := Parse([]byte(doc), "t.toml"); err != nil || d.Global.AuthCacheTTL != 5*time.Second || d.Global.AuthLookupsPerPeer != 2 || d.Global.AuthMaxLookups != 32 {
		t.Fatal(err, d.Global.AuthCacheTTL, d.Global.AuthLookupsPerPeer, d.Global.AuthMaxLookups)
	}
}

func TestAuthKeyErrors(t *testing.T) {
	cases := []struct{ doc, want string }{
		{"[mongobouncer]\nauth_type = \"md5\"\n", `t.toml:2: auth_type = "md5": must be one of none, scram, x509`},
		{"[mongobouncer]\n\nauth_type = \"scram\"\n", `t.toml:3: auth_type = "scram" needs an auth_file`},
		{"[mongobouncer]\nauth_type = \"scram\"\nauth_file = \"u\"\nauth_user = \"nobody\"\n", `t.toml:4: auth_user = "nobody": write user@db`},
		{"[mongobouncer]\nauth_user = \"a@admin\"\n", `t.toml:2: auth_user looks users up for auth_type = "scram" only`},
		{"[mongobouncer]\nadmin_users = [\"ops\"]\n", `t.toml:2: admin_users: "ops" is not user@db`},
		{"[mongobouncer]\nadmin_users = \"ops@admin\"\n", `t.toml:2: admin_users = "ops@admin": must be an array of strings`},
		{"[mongobouncer]\nadmin_users = [1]\n", `t.toml:2: admin_users = [...]: must be an array of strings in quotes, as in ["ops@admin"]: an element is`},
		{"[mongobouncer]\nauth_file = 3\n", `t.toml:2: auth_file = 3: must be a string`},
		{"[mongobouncer]\nauth_type = \"x509\"\n", `t.toml:2: auth_type = "x509" logs clients in by their verified TLS certificates`},
		{"[mongobouncer]\nauth_cache_ttl = \"0s\"\n", `t.toml:2: auth_cache_ttl = "0s": must be above 0`},
		{"[mongobouncer]\nauth_cache_ttl = \"48h\"\n", `t.toml:2: auth_cache_ttl = "48h0m0s": must be above 0 and at most "24h"`},
		{"[mongobouncer]\nauth_lookups_per_peer = 0\n", `t.toml:2: auth_lookups_per_peer = 0: must be between 1 and 1024`},
		{"[mongobouncer]\nauth_max_lookups = 2000\n", `t.toml:2: auth_max_lookups = 2000: must be 1 to 1024`},
	}
	for _, c := range cases {
		_, err := Parse([]byte(c.doc+route), "t.toml")
		if err == nil || !strings.HasPrefix(err.Error(), c.want) || !errors.Is(err, ErrInvalidValue) {
			t.Errorf("%q:\n got %v\nwant %s", c.doc, err, c.want)
		}
	}
}

// TestAuthUserOnServiceUserRoutes: auth_user with a route that logs in
// upstream as its service user makes every upstream user act with the
// service user's rights; validation refuses it unless
// auth_user_service_routes opts in. Pass-through routes, and routes
// without credentials, need no opt-in.
func TestAuthUserOnServiceUserRoutes(t *testing.T) {
	const head = "[mongobouncer]\nauth_type = \"scram\"\nauth_file = \"u\"\nauth_user = \"mb@admin\"\n"
	svc := "[databases.\"*\"]\nconnection_string = \"mongodb://svc:pw@h:27017/\"\n"
	_, err := Parse([]byte(head+svc), "t.toml")
	if err == nil || !errors.Is(err, ErrInvalidValue) || !strings.Contains(err.Error(), "t.toml:6:") ||
		!strings.Contains(err.Error(), "the service user's rights") || !strings.Contains(err.Error(), "auth_user_service_routes = true") {
		t.Fatalf("auth_user with a service-user route: %v", err)
	}
	if strings.Contains(err.Error(), "svc:pw") {
		t.Fatalf("the error shows the connection string's password: %v", err)
	}
	for _, doc := range []string{
		head + "auth_user_service_routes = true\n" + svc,                                               // opted in
		head + "[databases.\"*\"]\nconnection_string = \"mongodb://h:27017/\"\n",                       // pass-through
		head + "[databases.\"*\"]\nconnection_string = \"mongodb://h:27017/\"\npass_through = false\n", // no credentials
		"[mongobouncer]\nauth_type = \"scram\"\nauth_file = \"u\"\n" + svc,                             // no auth_user
	} {
		cfg, err := Parse([]byte(doc), "t.toml")
		if err != nil {
			t.Fatalf("%q: %v", doc, err)
		}
		if strings.Contains(doc, "auth_user_service_routes") != cfg.Global.AuthUserServiceRoutes {
			t.Fatalf("%q: AuthUserServiceRoutes = %v", doc, cfg.Global.AuthUserServiceRoutes)
		}
	}
	// One error per service-user route, each at its own table.
	_, err = Parse([]byte(head+svc+"[databases.b]\nconnection_string = \"mongodb://svc2:pw@h:27017/\"\n"), "t.toml")
	if err == nil || strings.Count(err.Error(), "the service user's rights") != 2 {
		t.Fatalf("two service-user routes: %v", err)
	}
}

// TestAuthMaxLookups: auth_max_lookups defaults to 16 and is bounded.
func TestAuthMaxLookups(t *testing.T) {
	cfg, err := Parse([]byte("[mongobouncer]\nauth_max_lookups = 64\n"+route), "t.toml")
	if err != nil || cfg.Global.AuthMaxLookups != 64 {
		t.Fatalf("%v %d", err, cfg.Global.AuthMaxLookups)
	}
	if cfg, err := Parse([]byte(route), "t.toml"); err != nil || cfg.Global.AuthMaxLookups != DefaultAuthMaxLookups {
		t.Fatalf("default: %v %d", err, cfg.Global.AuthMaxLookups)
	}
	for _, v := range []string{"0", "-1", "1025", "\"8\""} {
		if _, err := Parse([]byte("[mongobouncer]\nauth_max_lookups = "+v+"\n"+route), "t.toml"); err == nil || !strings.Contains(err.Error(), "auth_max_lookups") {
			t.Errorf("auth_max_lookups = %s: %v", v, err)
		}
	}
}

// TestMaxSCRAMIterations: max_scram_iterations defaults to 100000 and is
// bounded by what drivers accept and by seconds per login.
func TestMaxSCRAMIterations(t *testing.T) {
	if cfg, err := Parse([]byte(route), "t.toml"); err != nil || cfg.Global.MaxSCRAMIterations != DefaultMaxSCRAMIterations {
		t.Fatalf("default: %v %d", err, cfg.Global.MaxSCRAMIterations)
	}
	if cfg, err := Parse([]byte("[mongobouncer]\nmax_scram_iterations = 300000\n"+route), "t.toml"); err != nil || cfg.Global.MaxSCRAMIterations != 300000 {
		t.Fatalf("300000: %v %d", err, cfg.Global.MaxSCRAMIterations)
	}
	for _, n := range []string{"4095", "10000001"} {
		if _, err := Parse([]byte("[mongobouncer]\nmax_scram_iterations = "+n+"\n"+route), "t.toml"); err == nil || !strings.Contains(err.Error(), "max_scram_iterations = "+n) {
			t.Errorf("%s: %v", n, err)
		}
	}
}
