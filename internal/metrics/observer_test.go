package metrics

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestObserverClients(t *testing.T) {
	m := New()
	for range 5 {
		m.ClientConnected()
	}
	m.ClientDisconnected()
	m.ClientDisconnected()
	if v := val(t, m, "mongobouncer_client_connections"); v != 3 {
		t.Fatalf("current clients %v, want 3", v)
	}
	if v := val(t, m, "mongobouncer_client_connections_accepted_total"); v != 5 {
		t.Fatalf("accepted clients %v, want 5", v)
	}
	s := m.Stats()
	if s.ClientsCurrent != 3 || s.ClientsTotal != 5 {
		t.Fatalf("stats clients %d/%d, want 3/5", s.ClientsCurrent, s.ClientsTotal)
	}
}

func TestObserverRequests(t *testing.T) {
	m := New()
	m.Request("app", "find", 100, 1000, 2*time.Millisecond, true)
	m.Request("app", "find", 50, 500, 4*time.Millisecond, false)
	m.Request("app", "insert", 300, 60, time.Millisecond, true)
	m.Request("other-db", "find", 10, 20, 8*time.Millisecond, true)

	checks := []struct {
		name string
		kv   []string
		want float64
	}{
		{"mongobouncer_operations_total", []string{"route", "app", "command", "find"}, 2},
		{"mongobouncer_operations_total", []string{"route", "app", "command", "insert"}, 1},
		{"mongobouncer_operations_total", []string{"route", "other-db", "command", "find"}, 1},
		{"mongobouncer_client_received_bytes_total", []string{"route", "app"}, 450},
		{"mongobouncer_client_sent_bytes_total", []string{"route", "app"}, 1560},
		{"mongobouncer_client_received_bytes_total", []string{"route", "other-db"}, 10},
		{"mongobouncer_request_errors_total", []string{"route", "app"}, 1},
		{"mongobouncer_request_errors_total", []string{"route", "other-db"}, 0},
	}
	for _, c := range checks {
		if v := val(t, m, c.name, c.kv...); v != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.kv, v, c.want)
		}
	}
	if n := histCount(t, m, "mongobouncer_request_duration_seconds", "route", "app"); n != 3 {
		t.Errorf("app request duration count %d, want 3", n)
	}
	if s := find(t, m, "mongobouncer_request_duration_seconds", "route", "app"); math.Abs(s.GetHistogram().GetSampleSum()-0.007) > 1e-9 {
		t.Errorf("app request duration sum %v, want 0.007", s.GetHistogram().GetSampleSum())
	}
	s := m.Stats()
	if s.Operations != 4 || s.Errors != 1 || s.BytesIn != 460 || s.BytesOut != 1580 {
		t.Fatalf("stats %+v", s)
	}
	// Mean 3.75ms; nearest-rank p99 of 4 values is the largest, 8ms.
	if rel := math.Abs(float64(s.QueryAvg)-3.75e6) / 3.75e6; rel > 1.0/64 {
		t.Errorf("query avg %v, want ~3.75ms", s.QueryAvg)
	}
	if rel := math.Abs(float64(s.QueryP99)-8e6) / 8e6; rel > 1.0/64 {
		t.Errorf("query p99 %v, want ~8ms", s.QueryP99)
	}
	if s.Uptime <= 0 || s.Uptime > time.Minute {
		t.Errorf("uptime %v", s.Uptime)
	}
}

func TestObserverUpstreamErrorCardinality(t *testing.T) {
	m := New()
	m.UpstreamError("app", 11000)
	m.UpstreamError("app", 11000)
	m.UpstreamError("app", 89)
	m.UpstreamError("b", 11000)
	if v := val(t, m, "mongobouncer_upstream_errors_total", "route", "app", "code", "11000"); v != 2 {
		t.Fatalf("11000 on app: %v", v)
	}
	if v := val(t, m, "mongobouncer_upstream_errors_total", "route", "b", "code", "11000"); v != 1 {
		t.Fatalf("11000 on b: %v", v)
	}
	// 2 distinct codes so far; fill up to the bound, then everything new is
	// "other", on every route, while known codes keep their label.
	for c := int32(1); len(m.codes) < MaxErrorCodes; c++ {
		m.UpstreamError("app", c)
	}
	for i := range 5 * MaxErrorCodes {
		m.UpstreamError("app", int32(1_000_000+i))
		m.UpstreamError("b", int32(1_000_000+i))
	}
	m.UpstreamError("b", 89)
	if v := val(t, m, "mongobouncer_upstream_errors_total", "route", "app", "code", OtherLabel); v != 5*MaxErrorCodes {
		t.Fatalf("other on app: %v, want %d", v, 5*MaxErrorCodes)
	}
	if v := val(t, m, "mongobouncer_upstream_errors_total", "route", "b", "code", OtherLabel); v != 5*MaxErrorCodes {
		t.Fatalf("other on b: %v", v)
	}
	if v := val(t, m, "mongobouncer_upstream_errors_total", "route", "b", "code", "89"); v != 1 {
		t.Fatalf("a labelled code on another route: %v", v)
	}
	labels := map[string]bool{}
	for _, s := range families(t, m)["mongobouncer_upstream_errors_total"].GetMetric() {
		for _, l := range s.GetLabel() {
			if l.GetName() == "code" {
				labels[l.GetValue()] = true
			}
		}
	}
	if len(labels) != MaxErrorCodes+1 {
		t.Fatalf("%d distinct code labels, want %d codes + other", len(labels), MaxErrorCodes)
	}
	if n := len(*m.route("app").codes.Load()); n > 2*MaxErrorCodes {
		t.Fatalf("code cache of %d entries: unbounded", n)
	}
}

func TestObserverCommandAndRouteBounds(t *testing.T) {
	m := New()
	for i := range MaxCommandsPerRoute + 10 {
		m.Request("app", "cmd"+strconv.Itoa(i), 1, 1, 0, true)
	}
	if v := val(t, m, "mongobouncer_operations_total", "route", "app", "command", OtherLabel); v != 10 {
		t.Fatalf("commands past the bound: %v, want 10 as other", v)
	}
	if got := len(families(t, m)["mongobouncer_operations_total"].GetMetric()); got != MaxCommandsPerRoute+1 {
		t.Fatalf("%d command series, want %d", got, MaxCommandsPerRoute+1)
	}
	for i := range MaxRoutes + 3 {
		m.UpstreamError(fmt.Sprintf("r%d", i), 1)
	}
	if got := len(*m.routes.Load()); got != MaxRoutes+1 {
		t.Fatalf("%d routes cached, want %d + other", got, MaxRoutes)
	}
}

func TestForgetRoute(t *testing.T) {
	m := New()
	m.Request("gone", "find", 1, 1, time.Millisecond, false)
	m.UpstreamError("gone", 13)
	m.Request("kept", "find", 1, 1, time.Millisecond, true)
	m.ForgetRoute("gone")
	m.ForgetRoute("never-seen")
	for _, f := range []string{"mongobouncer_operations_total", "mongobouncer_request_duration_seconds",
		"mongobouncer_client_received_bytes_total", "mongobouncer_client_sent_bytes_total",
		"mongobouncer_request_errors_total", "mongobouncer_upstream_errors_total"} {
		for _, s := range families(t, m)[f].GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "route" && l.GetValue() == "gone" {
					t.Errorf("%s still has route gone: %v", f, s)
				}
			}
		}
	}
	if v := val(t, m, "mongobouncer_operations_total", "route", "kept", "command", "find"); v != 1 {
		t.Fatalf("kept route lost: %v", v)
	}
	// Totals since start are not forgotten.
	if s := m.Stats(); s.Operations != 2 || s.Errors != 1 {
		t.Fatalf("stats %+v", s)
	}
	m.Request("gone", "find", 1, 1, time.Millisecond, true)
	if v := val(t, m, "mongobouncer_operations_total", "route", "gone", "command", "find"); v != 1 {
		t.Fatalf("route after forget restarts at %v, want 1", v)
	}
}

// testutil's lint finds no naming problem in any family.
func TestMetricNamesLint(t *testing.T) {
	m := New()
	m.Request("app", "find", 1, 1, time.Millisecond, true)
	m.UpstreamError("app", 1)
	mon := m.PoolMonitor("app")
	mon.HandleEvent(poolCreated("a:1", 10))
	problems, err := testutil.GatherAndLint(m.reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if !strings.HasPrefix(p.Metric, Namespace+"_") {
			continue // the runtime collectors' names are not ours
		}
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// ClientPanicked counts a recovered panic by path; both series exist, at
// 0, before any panic.
func TestClientPanicked(t *testing.T) {
	m := New()
	for _, path := range []string{"goroutine", "loop"} {
		if got := val(t, m, "mongobouncer_panics_total", "path", path); got != 0 {
			t.Fatalf("%s: %v before any panic, want 0", path, got)
		}
	}
	m.ClientPanicked("loop")
	m.ClientPanicked("loop")
	m.ClientPanicked("goroutine")
	if got := val(t, m, "mongobouncer_panics_total", "path", "loop"); got != 2 {
		t.Errorf("loop: %v, want 2", got)
	}
	if got := val(t, m, "mongobouncer_panics_total", "path", "goroutine"); got != 1 {
		t.Errorf("goroutine: %v, want 1", got)
	}
}
