// Tests of the restart measurement's configuration writer: what it writes
// is a configuration mongobouncer loads, with the settings asked for.

package main

import (
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/config"
)

func TestBouncerConfigTextLoads(t *testing.T) {
	for _, el := range []string{"", "true", "false"} {
		c := bouncerConfig{listen: "127.0.0.1:1", admin: "127.0.0.1:2", upstream: "mongodb://127.0.0.1:3/",
			shutdownTimeout: 7 * time.Second, shutdownDelay: time.Second, eventLoop: el}
		cfg, err := config.Parse([]byte(c.text()), "b0.toml")
		if err != nil {
			t.Fatalf("event_loop %q: %v\n%s", el, err, c.text())
		}
		if want := el != "false"; cfg.Global.EventLoop != want {
			t.Errorf("event_loop %q: EventLoop = %v, want %v", el, cfg.Global.EventLoop, want)
		}
		if cfg.Global.ShutdownTimeout != 7*time.Second || cfg.Global.ShutdownDelay != time.Second {
			t.Errorf("shutdown_timeout, shutdown_delay = %v, %v", cfg.Global.ShutdownTimeout, cfg.Global.ShutdownDelay)
		}
	}
}
