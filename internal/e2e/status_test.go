package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// TestStatusPageWithRealTraffic loads the admin listener's /status page in
// headless Chromium while driver traffic flows through a whole mongobouncer,
// checks that the pool and client charts carry samples and that the page
// names the pool and the application, and saves a screenshot as a test
// artifact (artifacts/status-e2e.png).
func TestStatusPageWithRealTraffic(t *testing.T) {
	const chromium = "/usr/bin/chromium"
	if _, err := os.Stat(chromium); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is missing (CI): run make browser-tools", chromium)
		}
		t.Skipf("%s is missing: run make browser-tools (as root)", chromium)
	}
	oneIO(t) // the admin page; the traffic only feeds its charts
	up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
	a, addr, _ := fileBouncer(t, baseTOML(up.URI(), ""))
	waitUsable(t, a, 1)
	c := driver(t, addr, "&appName=status-e2e")
	stop := make(chan struct{})
	ops, errs, wg := load(t, c, 6, stop)
	defer func() {
		close(stop)
		wg.Wait()
		if errs.Load() != 0 {
			t.Errorf("%d workload errors", errs.Load())
		}
	}()
	// The sampler records every 2 s: let a few samples of traffic in.
	time.Sleep(5 * time.Second)
	if ops.Load() == 0 {
		t.Fatal("no traffic")
	}

	run := func(extra ...string) []byte {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		args := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
			"--disable-background-networking", "--disable-component-update", "--disable-sync",
			"--disable-dev-shm-usage", "--hide-scrollbars", "--user-data-dir=" + t.TempDir(),
			"--virtual-time-budget=5000"}, extra...)
		cmd := exec.CommandContext(ctx, chromium, append(args, "http://"+a.AdminAddr().String()+"/status")...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
		cmd.WaitDelay = 5 * time.Second
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("chromium: %v\n%s", err, errb.Bytes())
		}
		return out.Bytes()
	}
	dom := string(run("--dump-dom"))
	if m := regexp.MustCompile(`data-refreshes="(\d+)"`).FindStringSubmatch(dom); m == nil || m[1] == "0" {
		t.Fatalf("the page never loaded its data:\n%.1500s", dom)
	}
	if !regexp.MustCompile(`data-pool="\*\|` + regexp.QuoteMeta(up.Addr()) + `"`).MatchString(dom) {
		t.Fatalf("no chart for the pool of %s", up.Addr())
	}
	// Every chart has at least two samples.
	pts := regexp.MustCompile(`<svg[^>]*data-points="(\d+)"`).FindAllStringSubmatch(dom, -1)
	if len(pts) < 5 {
		t.Fatalf("%d charts on the page", len(pts))
	}
	for _, p := range pts {
		if n, _ := strconv.Atoi(p[1]); n < 2 {
			t.Fatalf("a chart has %d samples after 5 s of traffic", n)
		}
	}
	if !regexp.MustCompile(`data-v="pool\.\*\|` + regexp.QuoteMeta(up.Addr()) + `\.waitAvgMs">[0-9.]+<`).MatchString(dom) {
		t.Fatal("no checkout latency shown for the pool")
	}
	if !regexp.MustCompile(`data-v="app\.status-e2e">[1-9]`).MatchString(dom) {
		t.Fatal("the page does not count the workload's clients under its appName")
	}
	// The page prints large numbers with a suffix (12.3k, 1.2M).
	if m := regexp.MustCompile(`data-v="rates\.operations">([0-9.]+[kM]?)<`).FindStringSubmatch(dom); m == nil || strings.Trim(m[1], "0.") == "" {
		t.Fatalf("operations/s not shown or zero: %v", m)
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "artifacts")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	png := filepath.Join(dir, "status-e2e.png")
	run("--screenshot="+png, "--window-size=1280,900")
	if st, err := os.Stat(png); err != nil || st.Size() < 10_000 {
		t.Fatalf("screenshot %s: %v", png, err)
	}
	t.Logf("screenshot: %s", png)
}
