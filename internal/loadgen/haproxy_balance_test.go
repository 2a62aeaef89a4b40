package loadgen

// Tests of HAProxy as a balancer over several instances
// (haproxy_balance.go): its configuration, and connections spread over two
// servers and redispatched when one closes.

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestHAProxyBalancedConfig(t *testing.T) {
	cfg := HAProxyBalancedConfig("127.0.0.1:7001", []string{"127.0.0.1:6432", "127.0.0.1:6433"}, 1, 100)
	lines := map[string]bool{}
	for l := range strings.Lines(cfg) {
		lines[strings.TrimSpace(l)] = true
	}
	for _, want := range []string{
		"mode tcp", "bind 127.0.0.1:7001", "balance roundrobin", "option redispatch", "retries 3",
		"default-server check inter 200ms fall 1 rise 2",
		"server upstream0 127.0.0.1:6432", "server upstream1 127.0.0.1:6433",
	} {
		if !lines[want] {
			t.Errorf("config lacks %q:\n%s", want, cfg)
		}
	}
	bin, err := FindHAProxy("")
	if err != nil {
		t.Skipf("haproxy not installed (%v): the syntax check is skipped", err)
	}
	path := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, bin, "-c", "-f", path).CombinedOutput(); err != nil {
		t.Fatalf("haproxy -c rejects the configuration: %v\n%s", err, out)
	}
}

// Balanced over two servers, both get clients; with one closed, every
// client still gets through (the refused connection is redispatched).
func TestStartHAProxyBalanced(t *testing.T) {
	if _, err := FindHAProxy(""); err != nil {
		t.Skipf("haproxy not installed: %v", err)
	}
	a, b := startResponder(t, responderOpts{}), startResponder(t, responderOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := StartHAProxy(ctx, HAProxyOptions{Balance: []string{a.addr(), b.addr()}, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Stop()
	res, err := Run(ctx, h.Addr(), Config{Clients: 4, Duration: 300 * time.Millisecond, Rounds: 1})
	if err != nil || res.Ops == 0 || res.Errors != 0 {
		t.Fatalf("through haproxy: %+v, %v", res, err)
	}
	if a.pings.Load() == 0 || b.pings.Load() == 0 {
		t.Fatalf("pings %d and %d: both servers should get clients", a.pings.Load(), b.pings.Load())
	}
	a.close()
	before := b.pings.Load()
	res, err = Run(ctx, h.Addr(), Config{Clients: 4, Duration: 300 * time.Millisecond, Rounds: 1})
	if err != nil || res.Ops == 0 || res.Errors != 0 {
		t.Fatalf("through haproxy with one server closed: %+v, %v", res, err)
	}
	if b.pings.Load()-before < res.Ops {
		t.Fatalf("the open server saw %d pings, the run counted %d", b.pings.Load()-before, res.Ops)
	}
}
