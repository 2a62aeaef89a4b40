package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
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

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
	"go.uber.org/goleak"

	"github.com/mongobouncer/mongobouncer/internal/loadgen"
	"github.com/mongobouncer/mongobouncer/internal/uring"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// okServer answers every OP_MSG with {ok: 1} on a loopback port.
func okServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	ok := bsoncore.NewDocumentBuilder().AppendDouble("ok", 1).Build()
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = true
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					msg, err := wire.ReadMessage(br, nil, 1<<20)
					if err != nil {
						return
					}
					h, err := wire.ParseHeader(msg)
					if err != nil {
						return
					}
					if _, err := c.Write(wire.AppendMsg(nil, 1, h.RequestID, 0, ok)); err != nil {
						return
					}
				}
			})
		}
	})
	return ln.Addr().String()
}

func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func runArgs(args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = run(context.Background(), args, &o, &e)
	return code, o.String(), e.String()
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"-direct", "127.0.0.1:1"},
		{"-proxied", "127.0.0.1:1"},
		{"-direct", "127.0.0.1:1", "-proxied", "127.0.0.1:2", "extra"},
		{"-proxied", "127.0.0.1:1", "-idle", "5"},
		{"-idle", "5", "-pid", "1"},
		{"-nosuchflag"},
		{"-direct", "127.0.0.1:1", "-proxied", "127.0.0.1:2", "-workload", "nope"},
		{"-direct", "127.0.0.1:1", "-proxied", "127.0.0.1:2", "-duration", "100ms", "-warmup", "200ms"},
		{"-direct", "127.0.0.1:1", "-proxied", "127.0.0.1:2", "-ref", "nope"},
		{"-proxied", "127.0.0.1:2", "-ref", "haproxy"},
		{"-direct", "mongodb://127.0.0.1:1/", "-ref", "haproxy"},
		{"-direct", "127.0.0.1:1", "-proxied", "127.0.0.1:2", "-clients", "ten"},
		{"-direct", "127.0.0.1:1", "-proxied", "127.0.0.1:2", "-source", "127.0.0.9-127.0.0.1"},
		{"-clients", "0"},
		{"-proxied", "127.0.0.1:1", "-idle", "5", "-pid", "1", "-idle-repeat", "0"},
	} {
		if code, _, stderr := runArgs(args...); code != 2 || stderr == "" {
			t.Errorf("%q: exit %d, stderr %q; want 2 with a message", args, code, stderr)
		}
	}
	if code, _, _ := runArgs("-h"); code != 0 {
		t.Errorf("-h: exit %d", code)
	}
}

func TestCompareJSON(t *testing.T) {
	a, b := okServer(t), okServer(t)
	code, stdout, stderr := runArgs("-direct", a, "-proxied", b, "-clients", "2", "-duration", "300ms",
		"-warmup", "50ms", "-rounds", "1", "-json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var out struct {
		Compare struct {
			ThroughputRatio float64 `json:"throughput_ratio"`
			Direct          struct {
				Addr string `json:"addr"`
				Ops  int64  `json:"ops"`
			} `json:"direct"`
			Runs []json.RawMessage `json:"runs"`
		} `json:"compare"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal([]byte(stdout), &out); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, stdout)
	}
	if out.Compare.ThroughputRatio <= 0 || out.Compare.Direct.Addr != a || out.Compare.Direct.Ops == 0 ||
		len(out.Compare.Runs) != 2 || out.Error != "" {
		t.Fatalf("JSON %s", stdout)
	}
	if !strings.Contains(stderr, "proxied/direct throughput") {
		t.Fatalf("table missing from stderr: %s", stderr)
	}
}

func TestCompareTableAndIdle(t *testing.T) {
	a, b := okServer(t), okServer(t)
	code, stdout, stderr := runArgs("-direct", a, "-proxied", b, "-clients", "1", "-duration", "300ms",
		"-warmup", "0s", "-rounds", "1", "-idle", "10", "-pid", strconv.Itoa(os.Getpid()), "-settle", "50ms")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"proxied/direct throughput", "10 connections to " + b, "per idle client"} {
		if !strings.Contains(stdout, want) {
			t.Fatalf("stdout lacks %q:\n%s", want, stdout)
		}
	}
}

func TestFailureExit(t *testing.T) {
	b := okServer(t)
	code, stdout, stderr := runArgs("-direct", deadAddr(t), "-proxied", b, "-clients", "1", "-duration", "300ms", "-json")
	if code != 1 || !strings.Contains(stderr, "measured no operations") {
		t.Fatalf("exit %d stderr %q", code, stderr)
	}
	var out output
	if err := json.Unmarshal([]byte(stdout), &out); err != nil || out.Error == "" || out.Compare == nil {
		t.Fatalf("JSON %q (%v): want the partial report and the error", stdout, err)
	}
}

// TestSpawnWithReference builds this tool and mongobouncer and runs a short
// -spawn -reference comparison: the fake upstream, mongobouncer and both
// reference relays each run in a process of their own, and every side
// carries traffic.
func TestSpawnWithReference(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two binaries")
	}
	dir := t.TempDir()
	bench, bouncer := filepath.Join(dir, "mongobouncer-bench"), filepath.Join(dir, "mongobouncer")
	for bin, pkg := range map[string]string{bench: ".", bouncer: "../mongobouncer"} {
		cmd := exec.Command("go", "build", "-o", bin, pkg)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, haproxyErr := loadgen.FindHAProxy("")
	// 1 s per run: five processes share the cores with the race detector,
	// and a freshly started relay may take a few hundred milliseconds to
	// answer its first hello on a loaded machine.
	cmd := exec.CommandContext(ctx, bench, "-spawn", bouncer, "-reference", "-ref", "haproxy", "-clients", "4,2", "-duration", "1s",
		"-warmup", "50ms", "-rounds", "1", "-json")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v\nstderr:\n%s", err, stderr.String())
	}
	var out output
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, stdout.String())
	}
	if out.Compare == nil || out.Compare.Proxied.Ops == 0 || out.Compare.Proxied.Errors != 0 || out.CPUPerOp <= 0 {
		t.Fatalf("mongobouncer comparison: %+v", out)
	}
	// -ref haproxy comes first (its order on the command line), then the
	// relays of -reference; haproxy is skipped, with a message, where it
	// is not installed.
	var want []loadgen.RelayKind
	if haproxyErr == nil {
		want = append(want, "haproxy")
	} else if !strings.Contains(stderr.String(), "haproxy: skipped") {
		t.Errorf("no message for the missing haproxy:\n%s", stderr.String())
	}
	want = append(want, loadgen.RelayGoroutine, loadgen.RelayEpoll)
	if uring.Supported() {
		want = append(want, loadgen.RelayUring)
	}
	var got []loadgen.RelayKind
	for _, r := range out.References {
		got = append(got, r.Relay)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("references %v, want %v", got, want)
	}
	// Every target at both client counts, in order.
	if len(out.Series) != 2*(1+len(want)) || out.Series[0].Clients != 4 || out.Series[0].Target != "mongobouncer" ||
		out.Series[len(out.Series)-1].Clients != 2 {
		t.Fatalf("series of %d entries: %+v", len(out.Series), out.Series)
	}
	byName := map[loadgen.RelayKind]*loadgen.Report{}
	for _, r := range out.References {
		byName[r.Relay] = r.Compare
	}
	for _, r := range out.References {
		if r.Compare == nil || r.Compare.Proxied.Ops == 0 || r.Compare.Proxied.Errors != 0 || r.Compare.ThroughputRatio <= 0 {
			t.Fatalf("%s relay: %+v", r.Relay, r.Compare)
		}
	}
	// Every process is measured: the load tool and the upstream on both
	// sides, the proxy on the proxied side only.
	for _, c := range []struct {
		name string
		rep  *loadgen.Report
		want []string
	}{
		{"mongobouncer", out.Compare, []string{"bench", "upstream", "mongobouncer"}},
		{"goroutine relay", byName[loadgen.RelayGoroutine], []string{"bench", "upstream", "goroutine-relay"}},
		{"epoll relay", byName[loadgen.RelayEpoll], []string{"bench", "upstream", "epoll-relay"}},
		{"haproxy", byName["haproxy"], []string{"bench", "upstream", "haproxy"}},
	} {
		if c.rep == nil && c.name == "haproxy" && haproxyErr != nil {
			continue
		}
		var got []string
		for _, p := range c.rep.Proxied.CPU {
			got = append(got, p.Name)
		}
		if strings.Join(got, ",") != strings.Join(c.want, ",") || len(c.rep.Direct.CPU) != 2 || c.rep.CPURatio <= 0 {
			t.Fatalf("%s: CPU measured for %v (direct %+v), ratio %v", c.name, got, c.rep.Direct.CPU, c.rep.CPURatio)
		}
	}
	if !strings.Contains(stderr.String(), "summary (each row") || !strings.Contains(stderr.String(), "proxy CPU/op") {
		t.Fatalf("summary table missing:\n%s", stderr.String())
	}
}

func TestParseRefsAndCounts(t *testing.T) {
	got, err := parseRefs(" haproxy, relay-epoll ,haproxy,")
	if err != nil || !slices.Equal(got, []string{refHAProxy, refRelayEpoll}) {
		t.Errorf("parseRefs = %v, %v", got, err)
	}
	relays, err := parseRefs("relays")
	if err != nil || len(relays) < 2 || relays[0] != refRelayGoroutine || relays[1] != refRelayEpoll {
		t.Errorf("parseRefs(relays) = %v, %v", relays, err)
	}
	// -ref relay-epoll -reference: the epoll relay once, where -ref put it.
	if got, err := parseRefs("relay-epoll,haproxy,relays"); err != nil || len(got) < 3 ||
		!slices.Equal(got[:3], []string{refRelayEpoll, refHAProxy, refRelayGoroutine}) {
		t.Errorf("parseRefs with relays after relay-epoll = %v, %v", got, err)
	}
	if got, err := parseRefs(""); err != nil || len(got) != 0 {
		t.Errorf("parseRefs(\"\") = %v, %v", got, err)
	}
	if _, err := parseRefs("nginx"); err == nil {
		t.Error("parseRefs(nginx) accepted")
	}
	if got, err := parseCounts("1, 10,100,1000"); err != nil || !slices.Equal(got, []int{1, 10, 100, 1000}) {
		t.Errorf("parseCounts = %v, %v", got, err)
	}
	for _, bad := range []string{"x", "-1", "1,,y"} {
		if _, err := parseCounts(bad); err == nil {
			t.Errorf("parseCounts(%q) accepted", bad)
		}
	}
}

// -ref haproxy in front of a -direct address, without -spawn: the
// comparison runs (or, without haproxy, says it is skipped and fails for
// want of a target).
func TestRefHAProxyWithoutSpawn(t *testing.T) {
	a := okServer(t)
	code, stdout, stderr := runArgs("-direct", a, "-ref", "haproxy", "-clients", "1,2", "-duration", "300ms",
		"-warmup", "50ms", "-rounds", "1", "-json")
	if _, err := loadgen.FindHAProxy(""); err != nil {
		if code != 1 || !strings.Contains(stderr, "haproxy: skipped") {
			t.Fatalf("exit %d without haproxy:\n%s", code, stderr)
		}
		return
	}
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, stderr)
	}
	var out output
	if err := json.Unmarshal([]byte(stdout), &out); err != nil {
		t.Fatal(err)
	}
	if len(out.Series) != 2 || out.Series[0].Target != "haproxy" || out.Series[1].Clients != 2 || out.Compare != nil {
		t.Fatalf("series %+v", out.Series)
	}
	for _, s := range out.Series {
		cpu, ok := s.Compare.Proxied.ProcessCPU("haproxy")
		if s.Compare.Proxied.Ops == 0 || s.Compare.Proxied.Errors != 0 || !ok || cpu.Total < 0 {
			t.Fatalf("%d clients: %+v", s.Clients, s.Compare.Proxied)
		}
	}
}
