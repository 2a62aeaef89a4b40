package config

import (
	"strings"
	"testing"
	"time"
)

// tls_watch_interval: 30s by default, "0s" turns the watch off, negative is
// refused with the line, and it is global only.
func TestTLSWatchIntervalKey(t *testing.T) {
	cfg, err := Parse([]byte(route), "t.toml")
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Global.TLSWatchInterval; got != 30*time.Second {
		t.Fatalf("default %v, want 30s", got)
	}
	for doc, want := range map[string]time.Duration{
		"[mongobouncer]\ntls_watch_interval = \"5s\"\n" + route: 5 * time.Second,
		"[mongobouncer]\ntls_watch_interval = \"0s\"\n" + route: 0,
	} {
		cfg, err := Parse([]byte(doc), "t.toml")
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.Global.TLSWatchInterval; got != want {
			t.Errorf("%q: %v, want %v", doc, got, want)
		}
	}
	for doc, want := range map[string]string{
		"[mongobouncer]\ntls_watch_interval = \"-1s\"\n" + route: `t.toml:2: tls_watch_interval = "-1s": must not be negative`,
		route + "tls_watch_interval = \"5s\"\n":                  `t.toml:3: unknown key "tls_watch_interval" in [databases."*"]; tls_watch_interval is global`,
	} {
		_, err := Parse([]byte(doc), "t.toml")
		if err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("got %v\nwant prefix %s", err, want)
		}
	}
}
