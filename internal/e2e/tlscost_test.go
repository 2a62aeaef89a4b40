package e2e

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// TestMeasureTLSCost measures what client TLS costs a mongobouncer binary
// (docs/performance.md, "Client TLS"): the ping round trip of one plain and
// one TLS client, alternated, and the RSS of K idle plain or TLS clients,
// each in a fresh process. It is a measurement, not a check: it runs only
// when MONGOBOUNCER_MEASURE_TLS names the binary, and fails only when an
// operation fails. The TLS client's own encryption runs in the test
// process, so its round trip includes the client side of TLS too.
//
//	go build -o /tmp/mb ./cmd/mongobouncer
//	MONGOBOUNCER_MEASURE_TLS=/tmp/mb MONGOBOUNCER_MEASURE_IDLE=10000 go test -run TestMeasureTLSCost -v ./internal/e2e/
func TestMeasureTLSCost(t *testing.T) {
	bin := os.Getenv("MONGOBOUNCER_MEASURE_TLS")
	if bin == "" {
		t.Skip("set MONGOBOUNCER_MEASURE_TLS to a mongobouncer binary to measure")
	}
	idle := 2000
	if s := os.Getenv("MONGOBOUNCER_MEASURE_IDLE"); s != "" {
		idle, _ = strconv.Atoi(s)
	}
	up := fakemongo.Start(t, fakemongo.Options{})
	f := newTLSFiles(t, t.TempDir(), "m")
	clientCfg := &tls.Config{RootCAs: mustPool(t, f.ca), ServerName: "localhost", MinVersion: tls.VersionTLS12}

	// Round trips: 10 rounds of 2,000 pings per kind, the order swapped
	// every round; the median of each run, then the median of those.
	// MONGOBOUNCER_MEASURE_EXTRA adds [mongobouncer] lines to this
	// process's configuration (event_loop = false: both kinds on
	// goroutines).
	_, addr := spawnBouncer(t, bin, up.Addr(), f, os.Getenv("MONGOBOUNCER_MEASURE_EXTRA"))
	plain, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	secure, err := tls.Dial("tcp", addr, clientCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer secure.Close()
	med := map[string][]time.Duration{}
	for round := range 10 {
		kinds := []string{"plain", "tls"}
		if round%2 == 1 {
			slices.Reverse(kinds)
		}
		for _, k := range kinds {
			c := net.Conn(plain)
			if k == "tls" {
				c = secure
			}
			d, err := pingRun(c, 2000)
			if err != nil {
				t.Fatalf("%s: %v", k, err)
			}
			med[k] = append(med[k], d)
		}
	}
	for _, k := range []string{"plain", "tls"} {
		slices.Sort(med[k])
		t.Logf("ping round trip %s: median of 10 run medians %v (runs %v .. %v)", k, med[k][5], med[k][0], med[k][9])
	}

	// Idle clients, each kind in a fresh process (MONGOBOUNCER_MEASURE_IDLE
	// of them; 0 skips this part).
	if idle == 0 {
		return
	}
	for _, kind := range []struct{ name, extra string }{
		{"plain, event loop", ""},
		{"tls", ""},
		{"plain, event_loop = false", "event_loop = false\n"},
	} {
		pid, addr := spawnBouncer(t, bin, up.Addr(), f, kind.extra)
		var cfg *tls.Config
		if strings.HasPrefix(kind.name, "tls") {
			cfg = clientCfg
		}
		before := rssOf(t, pid)
		start := time.Now()
		conns, err := openIdleClients(addr, cfg, idle)
		took := time.Since(start)
		if err != nil {
			t.Fatalf("%s: %v", kind.name, err)
		}
		time.Sleep(2 * time.Second)
		after := rssOf(t, pid)
		for _, c := range conns {
			c.Close()
		}
		t.Logf("idle %s: %d clients opened in %v, RSS %.1f -> %.1f MiB, %.0f bytes per client", kind.name, idle, took.Round(time.Millisecond),
			float64(before)/(1<<20), float64(after)/(1<<20), float64(after-before)/float64(idle))
	}
}

func mustPool(t *testing.T, caFile string) *x509.CertPool {
	t.Helper()
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(mustRead(t, caFile)) {
		t.Fatal("no CA")
	}
	return p
}

// spawnBouncer runs bin with a configuration serving TLS in allow mode
// (plus extra [mongobouncer] lines) and returns its PID and address.
func spawnBouncer(t *testing.T, bin, upstream string, f tlsFiles, extra string) (int, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	path := filepath.Join(t.TempDir(), "mb.toml")
	doc := fmt.Sprintf("[mongobouncer]\nlisten = %q\nmax_client_conn = 30000\nlog_level = \"warn\"\n%s%s[databases.\"*\"]\nconnection_string = \"mongodb://%s/?directConnection=true\"\n",
		addr, f.tlsTOML("allow", false), extra, upstream)
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config", path)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	waitFor(t, "mongobouncer listening", func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return cmd.Process.Pid, addr
}

var (
	helloDoc = bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}}
	pingDoc  = bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}}
)

func roundTrip(c net.Conn, body []byte, id int32) error {
	if _, err := c.Write(wire.AppendMsg(nil, id, 0, 0, body)); err != nil {
		return err
	}
	_, err := wire.ReadMessage(c, nil, wire.DefaultMaxMessageSize)
	return err
}

// pingRun makes n sequential pings on c and returns their median.
func pingRun(c net.Conn, n int) (time.Duration, error) {
	body, _ := bson.Marshal(pingDoc)
	ds := make([]time.Duration, n)
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	for i := range ds {
		start := time.Now()
		if err := roundTrip(c, body, int32(i+1)); err != nil {
			return 0, err
		}
		ds[i] = time.Since(start)
	}
	slices.Sort(ds)
	return ds[n/2], nil
}

// openIdleClients opens n clients that each send a hello and a ping, then
// stay idle.
func openIdleClients(addr string, cfg *tls.Config, n int) ([]net.Conn, error) {
	conns := make([]net.Conn, n)
	hello, _ := bson.Marshal(helloDoc)
	ping, _ := bson.Marshal(pingDoc)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	next := make(chan int)
	for range 32 {
		wg.Go(func() {
			for i := range next {
				var c net.Conn
				var err error
				if cfg != nil {
					c, err = tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, cfg)
				} else {
					c, err = net.DialTimeout("tcp", addr, 10*time.Second)
				}
				if err == nil {
					_ = c.SetDeadline(time.Now().Add(30 * time.Second))
					if err = roundTrip(c, hello, 1); err == nil {
						err = roundTrip(c, ping, 2)
					}
					_ = c.SetDeadline(time.Time{})
				}
				mu.Lock()
				if err != nil && first == nil {
					first = fmt.Errorf("client %d: %w", i, err)
				}
				conns[i] = c
				mu.Unlock()
			}
		})
	}
	for i := range conns {
		next <- i
	}
	close(next)
	wg.Wait()
	var out []net.Conn
	for _, c := range conns {
		if c != nil {
			out = append(out, c)
		}
	}
	return out, first
}

// rssOf reads VmRSS of pid from /proc.
func rssOf(t *testing.T, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb * 1024
		}
	}
	t.Fatal("no VmRSS")
	return 0
}
