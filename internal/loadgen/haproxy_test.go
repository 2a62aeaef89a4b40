package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestHAProxyMaxConn(t *testing.T) {
	for _, c := range []struct {
		limit uint64
		want  int
	}{
		{20000, (20000 - haproxyFDReserve) / 2},
		{1 << 20, (1<<20 - haproxyFDReserve) / 2},
		{2 * haproxyFDReserve, 1},
		{0, 1},
	} {
		if got := HAProxyMaxConn(c.limit); got != c.want {
			t.Errorf("HAProxyMaxConn(%d) = %d, want %d", c.limit, got, c.want)
		}
	}
}

func TestHAProxyConfig(t *testing.T) {
	cfg := HAProxyConfig("127.0.0.1:7001", "127.0.0.1:27017", 2, 9950)
	// Line by line, indentation aside: what each one means is the point.
	lines := map[string]bool{}
	for l := range strings.Lines(cfg) {
		lines[strings.TrimSpace(l)] = true
	}
	for _, want := range []string{
		"global", "nbthread 2", "maxconn 9950",
		"defaults", "mode tcp", "timeout client 1h", "timeout server 1h",
		"frontend mongo", "bind 127.0.0.1:7001", "default_backend upstream",
		"backend upstream", "server upstream 127.0.0.1:27017",
	} {
		if !lines[want] {
			t.Errorf("config lacks %q:\n%s", want, cfg)
		}
	}
	// No pooling, no checks, no HTTP: nothing that does more than relay.
	for _, not := range []string{"http", "check", "http-reuse", "pool-max-conn", "daemon"} {
		if strings.Contains(cfg, not) {
			t.Errorf("config has %q:\n%s", not, cfg)
		}
	}
	// HAProxy itself accepts it, where it is installed.
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

func TestHAProxyMissing(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-haproxy")
	if _, err := FindHAProxy(missing); !errors.Is(err, ErrNoHAProxy) {
		t.Fatalf("FindHAProxy(%s) = %v, want ErrNoHAProxy", missing, err)
	}
	h, err := StartHAProxy(context.Background(), HAProxyOptions{Binary: missing, Upstream: "127.0.0.1:1"})
	if !errors.Is(err, ErrNoHAProxy) || h != nil {
		t.Fatalf("StartHAProxy with no binary = %v, %v; want ErrNoHAProxy", h, err)
	}
}

// A started HAProxy relays the ping workload to the upstream, its CPU
// time can be read, and Stop ends it and removes its directory.
func TestStartHAProxy(t *testing.T) {
	if _, err := FindHAProxy(""); err != nil {
		t.Skipf("haproxy not installed: %v", err)
	}
	r := startResponder(t, responderOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := StartHAProxy(ctx, HAProxyOptions{Upstream: r.addr(), Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Stop()
	if !strings.Contains(h.Config, "nbthread 1") || !strings.Contains(h.Config, "server upstream "+r.addr()) {
		t.Fatalf("config:\n%s", h.Config)
	}
	res, err := Run(ctx, h.Addr(), Config{Clients: 2, Duration: 300 * time.Millisecond, Rounds: 1})
	if err != nil || res.Ops == 0 || res.Errors != 0 {
		t.Fatalf("through haproxy: %+v, %v", res, err)
	}
	if p := r.pings.Load(); p < res.Ops {
		t.Fatalf("upstream saw %d pings, the run counted %d", p, res.Ops)
	}
	if _, err := ProcessCPUTime(h.PID()); err != nil {
		t.Fatalf("haproxy CPU time: %v", err)
	}
	dir := h.dir
	h.Stop()
	select {
	case <-h.exited:
	default:
		t.Fatal("haproxy still running after Stop")
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("configuration directory %s left behind: %v", dir, err)
	}
}

// BalancerConfig's health check is wired: of two servers, the one whose
// /readyz answers 503 gets no new connection once HAProxy has checked it,
// and gets them again once it answers 200.
func TestBalancerConfigFollowsReadyz(t *testing.T) {
	if _, err := FindHAProxy(""); err != nil {
		t.Skipf("haproxy not installed: %v", err)
	}
	var servers []BalancerServer
	var ready [2]atomic.Bool
	for i := range 2 {
		ready[i].Store(true)
		// The server says its index and closes.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				_, _ = fmt.Fprintf(c, "%d", i)
				c.Close()
			}
		}()
		hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/readyz" || !ready[i].Load() {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
		}))
		t.Cleanup(hs.Close)
		servers = append(servers, BalancerServer{Addr: ln.Addr().String(), Check: hs.Listener.Addr().String()})
	}
	listen, err := freeLoopbackAddr()
	if err != nil {
		t.Fatal(err)
	}
	cfg := BalancerConfig(listen, servers)
	h, err := StartHAProxy(context.Background(), HAProxyOptions{Listen: listen, Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Stop()
	// which counts the servers 20 connections reach.
	which := func() [2]int {
		var n [2]int
		for range 20 {
			c, err := net.DialTimeout("tcp", listen, 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			b, _ := io.ReadAll(c)
			c.Close()
			switch string(b) {
			case "0":
				n[0]++
			case "1":
				n[1]++
			}
		}
		return n
	}
	// waitFor polls until the counts satisfy ok (checks run every 500 ms;
	// rise 2 and fall 1 make a change visible within about 1.5 s).
	waitFor := func(what string, ok func([2]int) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			n := which()
			if ok(n) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: connections reached %v\n%s", what, n, cfg)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	waitFor("both ready", func(n [2]int) bool { return n[0] > 0 && n[1] > 0 })
	ready[0].Store(false)
	waitFor("server 0 not ready", func(n [2]int) bool { return n[0] == 0 && n[1] == 20 })
	ready[0].Store(true)
	waitFor("server 0 ready again", func(n [2]int) bool { return n[0] > 0 && n[1] > 0 })
}
