package config

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// client_login_timeout: 60s by default, "0s" turns it off, negative is
// refused with the line, and it is global only.
func TestClientLoginTimeoutKey(t *testing.T) {
	cfg, err := Parse([]byte(route), "t.toml")
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Global.ClientLoginTimeout; got != 60*time.Second {
		t.Fatalf("default %v, want 60s", got)
	}
	for doc, want := range map[string]time.Duration{
		"[mongobouncer]\nclient_login_timeout = \"5s\"\n" + route: 5 * time.Second,
		"[mongobouncer]\nclient_login_timeout = \"0s\"\n" + route: 0,
	} {
		cfg, err := Parse([]byte(doc), "t.toml")
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.Global.ClientLoginTimeout; got != want {
			t.Errorf("%q: %v, want %v", doc, got, want)
		}
	}
	for doc, want := range map[string]string{
		"[mongobouncer]\nclient_login_timeout = \"-1s\"\n" + route: `t.toml:2: client_login_timeout = "-1s": must not be negative`,
		route + "client_login_timeout = \"5s\"\n":                  `t.toml:3: unknown key "client_login_timeout" in [databases."*"]; client_login_timeout is global`,
	} {
		_, err := Parse([]byte(doc), "t.toml")
		if err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("got %v\nwant prefix %s", err, want)
		}
	}
}

// tls_mode = "allow" with tls_ca_file is valid, but warned about (with its
// line): plain clients skip the certificate the CA requires of TLS ones.
// "require" with a CA, and "allow" without one, are not warned about.
func TestTLSAllowWithCAWarns(t *testing.T) {
	tlsDoc := func(mode, ca string) string {
		d := "[mongobouncer]\ntls_mode = \"" + mode + "\"\ntls_cert_file = \"c.pem\"\ntls_key_file = \"k.pem\"\n"
		if ca != "" {
			d += "tls_ca_file = \"" + ca + "\"\n"
		}
		return d + route
	}
	cfg, err := Parse([]byte(tlsDoc("allow", "ca.pem")), "t.toml")
	if err != nil {
		t.Fatal(err)
	}
	ws := cfg.Warnings()
	if len(ws) != 1 || !errors.Is(ws[0], ErrTLSWarning) ||
		!strings.HasPrefix(ws[0].Error(), `t.toml:2: tls_mode = "allow" with tls_ca_file: `) ||
		!strings.Contains(ws[0].Error(), "plain clients connect without any certificate") {
		t.Fatalf("warnings %v, want one ErrTLSWarning on line 2 about plain clients", ws)
	}
	for _, d := range []string{tlsDoc("require", "ca.pem"), tlsDoc("allow", "")} {
		cfg, err := Parse([]byte(d), "t.toml")
		if err != nil {
			t.Fatal(err)
		}
		if ws := cfg.Warnings(); len(ws) != 0 {
			t.Errorf("%q: warnings %v, want none", d, ws)
		}
	}
}
