package admin

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func do(t *testing.T, h http.Handler, method, target string, hdr ...string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(method, target, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func decodeJSON(t *testing.T, w *httptest.ResponseRecorder, v any) {
	t.Helper()
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q", ct)
	}
	if err := json.Unmarshal(w.Body.Bytes(), v); err != nil {
		t.Fatalf("body is not JSON: %v\n%s", err, w.Body)
	}
}

func TestHTTPShow(t *testing.T) {
	f := newFake()
	h := NewHTTPHandler(f, nil, nil)
	for _, tc := range []struct{ path, key string }{
		{"/admin/pools", "pools"}, {"/admin/stats", "stats"}, {"/admin/clients", "clients"},
		{"/admin/servers", "servers"}, {"/admin/config", "config"},
	} {
		w := do(t, h, http.MethodGet, tc.path)
		if w.Code != http.StatusOK {
			t.Fatalf("%s: %d %s", tc.path, w.Code, w.Body)
		}
		var body map[string]json.RawMessage
		decodeJSON(t, w, &body)
		if string(body["ok"]) != "1" || len(body[tc.key]) == 0 || len(body) != 2 {
			t.Fatalf("%s: %s", tc.path, w.Body)
		}
		// The key comes first, as on the wire.
		if !strings.HasPrefix(w.Body.String(), "{\n  \""+tc.key+"\": ") {
			t.Errorf("%s does not start with %q: %.40s", tc.path, tc.key, w.Body)
		}
	}
	// Same content as the wire: pools sorted, with the fake's numbers.
	var pools struct{ Pools []PoolInfo }
	decodeJSON(t, do(t, h, http.MethodGet, "/admin/pools"), &pools)
	if want := sortedPools(f.Pools()); !slices.Equal(pools.Pools, want) {
		t.Fatalf("pools\n got %+v\nwant %+v", pools.Pools, want)
	}
	var stats struct{ Stats StatsReport }
	decodeJSON(t, do(t, h, http.MethodGet, "/admin/stats"), &stats)
	if s := stats.Stats; s.Rates.Since != SincePrevious || s.Operations == 0 || s.Rates.OperationsPerSec != 250 {
		t.Fatalf("stats %+v", s)
	}
	var cfg struct {
		Config struct{ Mongobouncer map[string]any }
	}
	decodeJSON(t, do(t, h, http.MethodGet, "/admin/config"), &cfg)
	if cfg.Config.Mongobouncer["listen"] != "127.0.0.1:27016" {
		t.Fatalf("config %+v", cfg.Config)
	}
	if w := do(t, h, http.MethodHead, "/admin/pools"); w.Code != http.StatusOK {
		t.Fatalf("HEAD: %d", w.Code)
	}
}

func TestHTTPActions(t *testing.T) {
	f := newFake()
	f.reload = errBadFile
	h := NewHTTPHandler(f, nil, nil)
	for _, tc := range []struct {
		target string
		status int
		call   string
		want   string
	}{
		{"/admin/pause", 200, "pause ", `"note": "paused every route`},
		{"/admin/pause?route=orders", 200, "pause orders", `"note": "paused route orders`},
		{"/admin/resume?route=orders", 200, "resume orders", "resumed route orders"},
		{"/admin/reconnect?route=%2A", 200, "reconnect *", "reconnecting route *"},
		{"/admin/shutdown", 200, "shutdown", "ShutdownInProgress (91)"},
		{"/admin/pause?route=nope", 400, "", `"codeName": "BadValue"`},
		{"/admin/reload", 500, "", `"errmsg": "mongobouncer: mongobouncer.toml:7: max_pool_size = -1: must be at least 1"`},
		{"/admin/reload?route=orders", 400, "", "reload takes no route argument"},
		{"/admin/drop", 404, "", `"code": 59`},
	} {
		before := len(f.Calls())
		w := do(t, h, http.MethodPost, tc.target)
		if w.Code != tc.status || !strings.Contains(w.Body.String(), tc.want) {
			t.Errorf("POST %s: %d %s, want %d with %q", tc.target, w.Code, w.Body, tc.status, tc.want)
		}
		var body map[string]any
		decodeJSON(t, w, &body)
		calls := f.Calls()
		if tc.call == "" && len(calls) != before || tc.call != "" && (len(calls) != before+1 || calls[before] != tc.call) {
			t.Errorf("POST %s: controller calls %q, want %q", tc.target, calls[before:], tc.call)
		}
	}
	if w := do(t, h, http.MethodGet, "/admin/pools?route=orders"); w.Code != http.StatusBadRequest {
		t.Errorf("GET /admin/pools?route=: %d", w.Code)
	}
}

func TestHTTPMethods(t *testing.T) {
	f := newFake()
	h := NewHTTPHandler(f, nil, nil)
	for _, tc := range []struct{ method, path, allow string }{
		{http.MethodPost, "/admin/pools", "GET, HEAD"},
		{http.MethodDelete, "/admin/config", "GET, HEAD"},
		{http.MethodGet, "/admin/shutdown", "POST"},
		{http.MethodGet, "/admin/pause", "POST"},
		{http.MethodPut, "/admin/reload", "POST"},
		{http.MethodPost, "/healthz", "GET, HEAD"},
		{http.MethodPost, "/readyz", "GET, HEAD"},
		{http.MethodPost, "/status", "GET, HEAD"},
		{http.MethodPost, "/status/data", "GET, HEAD"},
	} {
		w := do(t, h, tc.method, tc.path)
		if w.Code != http.StatusMethodNotAllowed || w.Header().Get("Allow") != tc.allow {
			t.Errorf("%s %s: %d Allow %q, want 405 Allow %q", tc.method, tc.path, w.Code, w.Header().Get("Allow"), tc.allow)
		}
	}
	if calls := f.Calls(); len(calls) != 0 {
		t.Fatalf("wrong methods reached the controller: %q", calls)
	}
}

func TestHTTPCrossOriginRefused(t *testing.T) {
	f := newFake()
	h := NewHTTPHandler(f, nil, nil)
	w := do(t, h, http.MethodPost, "/admin/shutdown", "Sec-Fetch-Site", "cross-site")
	if w.Code != http.StatusForbidden {
		t.Fatalf("cross-site POST: %d", w.Code)
	}
	w = do(t, h, http.MethodPost, "http://127.0.0.1:8080/admin/pause", "Origin", "http://evil.example")
	if w.Code != http.StatusForbidden {
		t.Fatalf("cross-origin POST: %d", w.Code)
	}
	if calls := f.Calls(); len(calls) != 0 {
		t.Fatalf("cross-origin requests reached the controller: %q", calls)
	}
	// Reads stay open: Prometheus and curl send no such headers anyway.
	if w := do(t, h, http.MethodGet, "/admin/pools", "Sec-Fetch-Site", "cross-site"); w.Code != http.StatusOK {
		t.Fatalf("cross-site GET: %d", w.Code)
	}
}

func TestHealthAndReady(t *testing.T) {
	f := newFake()
	h := NewHTTPHandler(f, nil, nil)
	if w := do(t, h, http.MethodGet, "/healthz"); w.Code != 200 || w.Body.String() != "ok\n" {
		t.Fatalf("healthz: %d %q", w.Code, w.Body)
	}
	if w := do(t, h, http.MethodGet, "/readyz"); w.Code != 200 || w.Body.String() != "ok\n" {
		t.Fatalf("readyz ready: %d %q", w.Code, w.Body)
	}
	f.mu.Lock()
	f.reasons = []string{"warning: the open-file limit\nis low"}
	f.mu.Unlock()
	if w := do(t, h, http.MethodGet, "/readyz"); w.Code != 200 || w.Body.String() != "ok\nwarning: the open-file limit is low\n" {
		t.Fatalf("readyz ready with a warning: %d %q", w.Code, w.Body)
	}
	f.mu.Lock()
	f.ready, f.reasons = false, []string{"route orders: no ready pool (127.0.0.1:27017: connection refused)", "route *: no server\nselected"}
	f.mu.Unlock()
	w := do(t, h, http.MethodGet, "/readyz")
	want := "route orders: no ready pool (127.0.0.1:27017: connection refused)\nroute *: no server selected\n"
	if w.Code != http.StatusServiceUnavailable || w.Body.String() != want {
		t.Fatalf("readyz not ready: %d %q, want 503 %q", w.Code, w.Body, want)
	}
	f.mu.Lock()
	f.reasons = nil
	f.mu.Unlock()
	if w := do(t, h, http.MethodGet, "/readyz"); w.Code != 503 || w.Body.String() != "not ready\n" {
		t.Fatalf("readyz without reasons: %d %q", w.Code, w.Body)
	}
	// healthz does not depend on readiness.
	if w := do(t, h, http.MethodGet, "/healthz"); w.Code != 200 {
		t.Fatalf("healthz while not ready: %d", w.Code)
	}
}

func TestMetricsHandler(t *testing.T) {
	m := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "mongobouncer_up 1\n")
	})
	if w := do(t, NewHTTPHandler(newFake(), m, nil), http.MethodGet, "/metrics"); w.Code != 200 || w.Body.String() != "mongobouncer_up 1\n" {
		t.Fatalf("metrics: %d %q", w.Code, w.Body)
	}
	if w := do(t, NewHTTPHandler(newFake(), nil, nil), http.MethodGet, "/metrics"); w.Code != 404 {
		t.Fatalf("metrics without a handler: %d", w.Code)
	}
}

func TestIndex(t *testing.T) {
	h := NewHTTPHandler(newFake(), nil, nil)
	w := do(t, h, http.MethodGet, "/")
	for i := range commands {
		if !strings.Contains(w.Body.String(), commands[i].path) {
			t.Errorf("index does not list %s", commands[i].path)
		}
	}
	if w := do(t, h, http.MethodGet, "/nope"); w.Code != 404 {
		t.Errorf("/nope: %d", w.Code)
	}
}

func TestStatusPageSelfContained(t *testing.T) {
	w := do(t, NewHTTPHandler(newFake(), nil, nil), http.MethodGet, "/status")
	if w.Code != 200 || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/html") {
		t.Fatalf("status: %d %q", w.Code, w.Header().Get("Content-Type"))
	}
	page := w.Body.String()
	// No external assets: nothing is loaded by URL, and the only absolute
	// URL is the SVG namespace.
	if m := regexp.MustCompile(`(?i)\b(src|href)\s*=|@import|url\(`).FindString(page); m != "" {
		t.Errorf("page loads something: %q", m)
	}
	urls := regexp.MustCompile(`https?://[^"'\s]+`).FindAllString(page, -1)
	if len(slices.DeleteFunc(urls, func(u string) bool { return u == "http://www.w3.org/2000/svg" })) != 0 {
		t.Errorf("page names URLs: %q", urls)
	}
	// The CSP's script hash is the inline script's, so the browser runs it.
	csp := w.Header().Get("Content-Security-Policy")
	script := page[strings.Index(page, "<script>")+len("<script>") : strings.Index(page, "</script>")]
	sum := sha256.Sum256([]byte(script))
	if !strings.Contains(csp, "'sha256-"+base64.StdEncoding.EncodeToString(sum[:])+"'") || !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("CSP %q does not allow exactly the inline script", csp)
	}
	if !strings.Contains(page, `fetch("/status/data"`) {
		t.Errorf("page does not fetch /status/data")
	}
}

func TestStatusDataOnDemand(t *testing.T) {
	// Without a running sampler the handler samples when the page asks,
	// at most once per half interval.
	f := newFake()
	s := NewSampler(f, time.Second, time.Minute)
	now := t0
	s.now = func() time.Time { return now }
	h := NewHTTPHandler(f, nil, nil, WithSampler(s))
	get := func() StatusData {
		var d StatusData
		decodeJSON(t, do(t, h, http.MethodGet, "/status/data"), &d)
		return d
	}
	if d := get(); len(d.Times) != 1 || len(d.Pools) != 4 {
		t.Fatalf("first fetch: %d samples, %d pools", len(d.Times), len(d.Pools))
	}
	if d := get(); len(d.Times) != 1 {
		t.Fatalf("second fetch at the same instant sampled again: %d", len(d.Times))
	}
	now = now.Add(600 * time.Millisecond)
	if d := get(); len(d.Times) != 2 {
		t.Fatalf("fetch after half an interval: %d samples", len(d.Times))
	}
}

func TestServerServeShutdown(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := newFake()
	srv := NewServer(f, nil, nil)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	c := &http.Client{Timeout: 5 * time.Second}
	base := "http://" + l.Addr().String()
	resp, err := c.Get(base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "ok\n" {
		t.Fatalf("healthz over TCP: %d %q", resp.StatusCode, body)
	}
	resp, err = c.Post(base+"/admin/pause?route=orders", "", bytes.NewReader(nil))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || !slices.Equal(f.Calls(), []string{"pause orders"}) {
		t.Fatalf("pause over TCP: %d, calls %q", resp.StatusCode, f.Calls())
	}
	// The server's sampler runs while it serves: the first sample is
	// taken at Start.
	deadline := time.Now().Add(5 * time.Second)
	for srv.sampler.Len() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if srv.sampler.Len() == 0 {
		t.Fatal("the server's sampler took no sample")
	}
	c.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve after Shutdown: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after Shutdown")
	}
	if srv.sampler.running() {
		t.Fatal("sampler still running after Shutdown")
	}
}

func TestServerServeError(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	srv := NewServer(newFake(), nil, nil)
	if err := srv.Serve(l); err == nil || errors.Is(err, http.ErrServerClosed) {
		t.Fatalf("Serve on a closed listener: %v", err)
	}
	if srv.sampler.running() {
		t.Fatal("sampler left running after Serve failed")
	}
}

// Every admin HTTP answer names the process that gave it: with
// so_reuseport, old and new processes share the address during an upgrade.
func TestAdminAnswersCarryThePID(t *testing.T) {
	h := NewHTTPHandler(newFake(), nil, nil)
	for _, path := range []string{"/readyz", "/healthz", "/nothing-here"} {
		w := do(t, h, http.MethodGet, path)
		if got := w.Header().Get(PIDHeader); got != strconv.Itoa(os.Getpid()) {
			t.Fatalf("%s: %s = %q, want %d", path, PIDHeader, got, os.Getpid())
		}
	}
}
