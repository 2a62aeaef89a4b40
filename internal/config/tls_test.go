package config

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// The client TLS keys: parsed into Global, and each inconsistent
// combination refused with file:line and what to write.
func TestClientTLSKeys(t *testing.T) {
	doc := "[mongobouncer]\ntls_mode = \"require\"\ntls_cert_file = \"/etc/mb/cert.pem\"\ntls_key_file = \"/etc/mb/key.pem\"\n" +
		"tls_ca_file = \"/etc/mb/ca.pem\"\ntls_handshake_timeout = \"3s\"\n" + route
	cfg, err := Parse([]byte(doc), "t.toml")
	if err != nil {
		t.Fatal(err)
	}
	g := cfg.Global
	if g.TLSMode != TLSModeRequire || g.TLSCertFile != "/etc/mb/cert.pem" || g.TLSKeyFile != "/etc/mb/key.pem" ||
		g.TLSCAFile != "/etc/mb/ca.pem" || g.TLSHandshakeTimeout != 3*time.Second {
		t.Fatalf("parsed %+v", g)
	}

	cases := []struct{ name, doc, want string }{
		{"require without files", "[mongobouncer]\ntls_mode = \"require\"\n" + route,
			`t.toml:2: tls_mode = "require" needs tls_cert_file`},
		{"allow without key", "[mongobouncer]\ntls_mode = \"allow\"\ntls_cert_file = \"c.pem\"\n" + route,
			`t.toml:2: tls_mode = "allow" needs tls_key_file`},
		{"files with tls disabled", "[mongobouncer]\n\ntls_cert_file = \"c.pem\"\n" + route,
			`t.toml:3: tls_cert_file is set but tls_mode = "disable"`},
		{"ca file with tls disabled", "[mongobouncer]\ntls_mode = \"disable\"\ntls_ca_file = \"ca.pem\"\n" + route,
			`t.toml:3: tls_ca_file is set but tls_mode = "disable"`},
		{"bad mode", "[mongobouncer]\ntls_mode = \"required\"\n" + route,
			`t.toml:2: tls_mode = "required": must be one of disable, allow, require (did you mean "require"?)`},
		{"negative timeout", "[mongobouncer]\ntls_handshake_timeout = \"-1s\"\n" + route,
			`t.toml:2: tls_handshake_timeout = "-1s": must not be negative`},
		{"in a route", route + "tls_mode = \"require\"\n",
			`t.toml:3: unknown key "tls_mode" in [databases."*"]; tls_mode is global`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.doc), "t.toml")
			if err == nil || !strings.HasPrefix(err.Error(), c.want) {
				t.Fatalf("got %v\nwant prefix %s", err, c.want)
			}
			if !errors.Is(err, ErrInvalidValue) && !errors.Is(err, ErrUnknownKey) {
				t.Fatalf("%v: not a categorised error", err)
			}
		})
	}
}
