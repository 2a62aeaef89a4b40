package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const chromiumPath = "/usr/bin/chromium"

// recordingHandler keeps every /status/data body it served, in order, so
// the test knows exactly what the page rendered.
type recordingHandler struct {
	next http.Handler
	mu   sync.Mutex
	// bodies are the /status/data responses served; guarded by mu.
	bodies [][]byte
}

func (h *recordingHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/status/data" {
		h.next.ServeHTTP(w, r)
		return
	}
	rec := &bodyRecorder{ResponseWriter: w}
	h.next.ServeHTTP(rec, r)
	h.mu.Lock()
	h.bodies = append(h.bodies, rec.buf.Bytes())
	h.mu.Unlock()
}

func (h *recordingHandler) served() [][]byte {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([][]byte(nil), h.bodies...)
}

type bodyRecorder struct {
	http.ResponseWriter
	buf bytes.Buffer
}

func (b *bodyRecorder) Write(p []byte) (int, error) {
	b.buf.Write(p)
	return b.ResponseWriter.Write(p)
}

// chromium runs headless Chromium on url with extra flags and returns its
// stdout. Chromium forks helpers: they share its process group, which is
// killed whole if the run outlives its timeout.
func chromium(t *testing.T, url string, extra ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	args := append([]string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-dev-shm-usage", "--hide-scrollbars", "--mute-audio",
		"--user-data-dir=" + t.TempDir(),
		// Timers run on virtual time, paused while fetches are in flight:
		// several 2 s refreshes happen in about a second of real time.
		"--virtual-time-budget=9000",
	}, extra...)
	cmd := exec.CommandContext(ctx, chromiumPath, append(args, url)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %v: %v\nstderr:\n%s", extra, err, stderr.Bytes())
	}
	return stdout.Bytes()
}

func moduleRoot(t *testing.T) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// TestStatusPageInChromium loads /status in headless Chromium while the
// fake Controller's numbers move, and checks from the rendered DOM that
// every chart has the sampler's history and the numbers shown are the ones
// served; then saves a screenshot to artifacts/status.png.
func TestStatusPageInChromium(t *testing.T) {
	if _, err := os.Stat(chromiumPath); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is missing (CI): run make browser-tools", chromiumPath)
		}
		t.Skipf("%s is missing: run make browser-tools (as root) for the status page test", chromiumPath)
	}
	f := newFake()
	f.nClients = 57
	s := NewSampler(f, 2*time.Second, 5*time.Minute)
	// Each reading of the clock is 2 s after the previous one: 60
	// prefilled samples are two minutes of history, and every fetch of the
	// page adds one more (the sampler is not started: on-demand sampling).
	s.now = fakeClock(2 * time.Second)
	for range 60 {
		s.Sample()
	}
	rec := &recordingHandler{next: NewHTTPHandler(f, nil, nil, WithSampler(s))}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: rec, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	url := "http://" + l.Addr().String() + "/status"

	dom := string(chromium(t, url, "--dump-dom"))
	m := regexp.MustCompile(`<body data-refreshes="(\d+)"`).FindStringSubmatch(dom)
	if m == nil {
		t.Fatalf("no refresh count in the DOM:\n%.2000s", dom)
	}
	refreshes, _ := strconv.Atoi(m[1])
	bodies := rec.served()
	if refreshes < 2 || refreshes > len(bodies) {
		t.Fatalf("page refreshed %d times, server served %d bodies", refreshes, len(bodies))
	}
	// The DOM shows the refreshes-th response.
	var d StatusData
	if err := json.Unmarshal(bodies[refreshes-1], &d); err != nil {
		t.Fatal(err)
	}
	n := len(d.Times)
	if n < 60+2-1 {
		t.Fatalf("the rendered data has %d samples", n)
	}
	shown := func(key string) string {
		t.Helper()
		re := regexp.MustCompile(`data-v="` + regexp.QuoteMeta(html.EscapeString(key)) + `">([^<]*)<`)
		m := re.FindStringSubmatch(dom)
		if m == nil {
			t.Fatalf("no value %q in the DOM", key)
		}
		return m[1]
	}
	last := func(v []int) string { return strconv.Itoa(v[len(v)-1]) }
	for _, st := range clientStates {
		if got, want := shown("clients."+string(st)), last(d.Clients[string(st)]); got != want {
			t.Errorf("clients %s shows %s, served %s", st, got, want)
		}
		if got, want := shown("now."+string(st)), strconv.Itoa(d.Current.ClientsBy[st]); got != want {
			t.Errorf("now %s shows %s, served %s", st, got, want)
		}
	}
	if got, want := shown("latency.waitP99"), strconv.FormatFloat(d.Latency["waitP99"][n-1], 'f', -1, 64); got != want {
		t.Errorf("wait p99 shows %s, served %s", got, want)
	}
	if got, want := shown("rates.operations"), strconv.FormatFloat(d.Rates["operations"][n-1], 'f', -1, 64); got != want {
		t.Errorf("operations/s shows %s, served %s", got, want)
	}
	if len(d.Current.TopApps) != 3 {
		t.Fatalf("top apps served: %+v", d.Current.TopApps)
	}
	for _, a := range d.Current.TopApps {
		// 57 to 61 clients, a third of them each.
		if got, want := shown("app."+a.AppName), strconv.Itoa(a.Clients); got != want || a.Clients < 19 || a.Clients > 21 {
			t.Errorf("app %q shows %s clients, served %s", a.AppName, got, want)
		}
	}
	if len(d.Pools) != 4 {
		t.Fatalf("%d pools served", len(d.Pools))
	}
	lastErrors, adaptive := 0, 0
	for _, p := range d.Pools {
		id := p.Route + "|" + p.Server
		for k, series := range map[string]gapInts{"available": p.Available, "inUse": p.InUse, "pending": p.Pending, "waiters": p.Waiters} {
			if got, want := shown("pool."+id+"."+k), strconv.Itoa(int(series[n-1])); got != want {
				t.Errorf("pool %s %s shows %s, served %s", id, k, got, want)
			}
		}
		// Its header names the server's role and round-trip time, and
		// the monitor's error when there is one.
		if got := shown("pool." + id + ".role"); got != p.Role || p.Role == "" {
			t.Errorf("pool %s role shows %q, served %q", id, got, p.Role)
		}
		// 0 is "no round trip measured yet", not a fast server.
		want := "rtt –"
		if p.RTTMs > 0 {
			want = "rtt " + strconv.FormatFloat(math.Round(p.RTTMs*100)/100, 'f', -1, 64) + " ms"
		}
		if got := shown("pool." + id + ".rttMs"); got != want {
			t.Errorf("pool %s rtt shows %q, served %v", id, got, p.RTTMs)
		}
		if p.LastError != "" {
			lastErrors++
			if got := shown("pool." + id + ".lastError"); got != html.EscapeString(p.LastError) {
				t.Errorf("pool %s last error shows %q, served %q", id, got, p.LastError)
			}
		} else if strings.Contains(dom, `data-v="pool.`+html.EscapeString(id)+`.lastError"`) {
			t.Errorf("pool %s shows a last error, served none", id)
		}
		// The pool's card has its stacked chart with a point per sample.
		card := regexp.MustCompile(`data-pool="` + regexp.QuoteMeta(html.EscapeString(id)) + `"[\s\S]*?</svg>`).FindString(dom)
		for _, series := range []string{"inUse", "pending", "available", "waiters"} {
			pm := regexp.MustCompile(`data-series="` + series + `" data-points="(\d+)"`).FindStringSubmatch(card)
			if pm == nil || pm[1] != strconv.Itoa(n) {
				t.Errorf("pool %s chart %s: %v, want %d points", id, series, pm, n)
			}
		}
		// An adaptive pool's card draws its limit over time too; a fixed
		// one has no limit line.
		lm := regexp.MustCompile(`data-series="limit" data-points="(\d+)"`).FindStringSubmatch(card)
		if p.Limit > 0 {
			adaptive++
			if lm == nil || lm[1] != strconv.Itoa(n) {
				t.Errorf("pool %s limit line: %v, want %d points", id, lm, n)
			}
			if got, want := shown("pool."+id+".limit"), strconv.Itoa(int(p.Limits[n-1])); got != want || want != strconv.Itoa(p.Limit) {
				t.Errorf("pool %s limit shows %s, served %s (info %d)", id, got, want, p.Limit)
			}
		} else if lm != nil {
			t.Errorf("fixed-size pool %s draws a limit line", id)
		}
		if got := len(regexp.MustCompile(`[ML]\d`).FindAllString(card, -1)); got < 4*n {
			t.Errorf("pool %s chart has %d path points, want at least %d", id, got, 4*n)
		}
		// Its checkout-latency chart shows the mean wait of the last
		// interval, computed from the totals' differences.
		w := p.WaitAvgMs[n-1]
		if w < 1 || w > 5 {
			t.Errorf("pool %s served a last-interval wait of %v ms, want 1..5", id, w)
		}
		if got, want := shown("pool."+id+".waitAvgMs"), strconv.FormatFloat(w, 'f', -1, 64); got != want {
			t.Errorf("pool %s wait shows %s, served %s", id, got, want)
		}
	}
	if adaptive != 1 {
		t.Errorf("%d adaptive pools drawn, want 1", adaptive)
	}
	if lastErrors != 1 {
		t.Errorf("%d pools with a last error served, want the fake's 1", lastErrors)
	}
	// Every chart is drawn over all samples: 4 overview charts, and two
	// per pool (connections, checkout wait).
	if got, want := len(regexp.MustCompile(`<svg[^>]*data-points="`+strconv.Itoa(n)+`"`).FindAllString(dom, -1)), 4+2*len(d.Pools); got != want {
		t.Errorf("%d charts with %d points, want %d", got, n, want)
	}
	if t.Failed() {
		t.Logf("DOM:\n%s", dom)
		return
	}

	dir := filepath.Join(moduleRoot(t), "artifacts")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	png := filepath.Join(dir, "status.png")
	_ = os.Remove(png)
	chromium(t, url, "--screenshot="+png, "--window-size=1280,900")
	b, err := os.ReadFile(png)
	if err != nil {
		t.Fatalf("no screenshot: %v", err)
	}
	if len(b) < 10_000 || !bytes.HasPrefix(b, []byte("\x89PNG")) {
		t.Fatalf("screenshot is %d bytes, not a rendered page", len(b))
	}
	t.Log(fmt.Sprintf("screenshot: %s (%d bytes)", png, len(b)))
}
