package metrics

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/mongobouncer/mongobouncer/internal/pool"
)

// allFamilies is every family mongobouncer exports, with its type.
var allFamilies = map[string]dto.MetricType{
	"mongobouncer_pool_connections":                  dto.MetricType_GAUGE,
	"mongobouncer_pool_wait_queue_length":            dto.MetricType_GAUGE,
	"mongobouncer_pool_max_size":                     dto.MetricType_GAUGE,
	"mongobouncer_pool_utilization_ratio":            dto.MetricType_GAUGE,
	"mongobouncer_pool_checkout_duration_seconds":    dto.MetricType_HISTOGRAM,
	"mongobouncer_pool_checkout_failures_total":      dto.MetricType_COUNTER,
	"mongobouncer_pool_connections_created_total":    dto.MetricType_COUNTER,
	"mongobouncer_pool_connections_closed_total":     dto.MetricType_COUNTER,
	"mongobouncer_pool_cleared_total":                dto.MetricType_COUNTER,
	"mongobouncer_client_connections":                dto.MetricType_GAUGE,
	"mongobouncer_client_connections_accepted_total": dto.MetricType_COUNTER,
	"mongobouncer_operations_total":                  dto.MetricType_COUNTER,
	"mongobouncer_request_duration_seconds":          dto.MetricType_HISTOGRAM,
	"mongobouncer_client_received_bytes_total":       dto.MetricType_COUNTER,
	"mongobouncer_client_sent_bytes_total":           dto.MetricType_COUNTER,
	"mongobouncer_request_errors_total":              dto.MetricType_COUNTER,
	"mongobouncer_upstream_errors_total":             dto.MetricType_COUNTER,
	"mongobouncer_server_info":                       dto.MetricType_GAUGE,
	"mongobouncer_server_rtt_seconds":                dto.MetricType_GAUGE,
	"mongobouncer_client_tls_refused_total":          dto.MetricType_COUNTER,
	"mongobouncer_client_login_timeouts_total":       dto.MetricType_COUNTER,
	"mongobouncer_event_loop_spins_total":            dto.MetricType_COUNTER,
	"mongobouncer_auth_failures_total":               dto.MetricType_COUNTER,
	"mongobouncer_auth_lookups_total":                dto.MetricType_COUNTER,
	"mongobouncer_panics_total":                      dto.MetricType_COUNTER,
	"mongobouncer_db_connections_max":                dto.MetricType_GAUGE,
	"mongobouncer_db_connections":                    dto.MetricType_GAUGE,
	"mongobouncer_db_connections_waiting_pools":      dto.MetricType_GAUGE,
	"mongobouncer_db_connections_waits_total":        dto.MetricType_COUNTER,
	"mongobouncer_db_connections_evictions_total":    dto.MetricType_COUNTER,
	"mongobouncer_client_user_limit_refused_total":   dto.MetricType_COUNTER,
}

// A scrape of Handler parses as Prometheus text and holds every family
// (with their types), plus the Go and process collectors.
func TestHandlerScrape(t *testing.T) {
	m := New()
	mon := m.PoolMonitor("app")
	mon.HandleEvent(poolCreated("db:27017", 10))
	mon.HandleEvent(pool.Event{Type: pool.ConnectionCreated, Address: "db:27017", ConnectionID: 1, Counts: pool.Counts{Total: 1, Pending: 1}})
	mon.HandleEvent(pool.Event{Type: pool.ConnectionCheckedOut, Address: "db:27017", ConnectionID: 1, Duration: time.Millisecond, Counts: pool.Counts{Total: 1, InUse: 1}})
	m.ClientConnected()
	m.Request("app", "find", 10, 20, time.Millisecond, true)
	m.UpstreamError("app", 11000)
	m.ClientTLSRefused("plain")
	m.AuthFailed("bad_proof")
	m.AuthLookup("found")
	m.ClientLoginTimeout("first_message")
	m.SetServerSource(func() []ServerRole {
		return []ServerRole{{Route: "app", Server: "db:27017", Role: "primary", RTT: time.Millisecond}}
	})
	m.SetLoopSpinSource(func() (uint64, uint64) { return 7, 2 })

	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	req.Header.Set("Accept", "text/plain")
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("content type %q", ct)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatalf("scrape does not parse: %v", err)
	}
	for name, typ := range allFamilies {
		mf := mfs[name]
		if mf == nil {
			t.Errorf("family %s missing from the scrape", name)
			continue
		}
		if mf.GetType() != typ {
			t.Errorf("family %s is %v, want %v", name, mf.GetType(), typ)
		}
		if mf.GetHelp() == "" {
			t.Errorf("family %s has no help", name)
		}
	}
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total"} {
		if mfs[name] == nil {
			t.Errorf("runtime family %s missing", name)
		}
	}
	for name := range mfs {
		if strings.HasPrefix(name, Namespace+"_") {
			if _, ok := allFamilies[name]; !ok {
				t.Errorf("family %s is exported but not in the test's (and docs') list", name)
			}
		}
	}
}

// Invalid UTF-8 in a route, command or server neither panics nor breaks the
// scrape: it is exported with replacement characters.
func TestInvalidUTF8Labels(t *testing.T) {
	m := New()
	bad := "r\xff"
	m.Request(bad, "c\xfe", 1, 1, time.Millisecond, true)
	m.UpstreamError(bad, 2)
	mon := m.PoolMonitor(bad)
	mon.HandleEvent(poolCreated("h\xff:1", 5))
	mon.HandleEvent(pool.Event{Type: pool.ConnectionCheckOutFailed, Address: "h\xff:1", Reason: "x\xff"})
	mon.HandleEvent(pool.Event{Type: pool.ConnectionCheckedOut, Address: "h\xff:1", Counts: pool.Counts{Total: 1, InUse: 1}})
	if v := val(t, m, famConns, "route", "r\uFFFD", "server", "h\uFFFD:1", "state", "in_use"); v != 1 {
		t.Fatalf("in use %v", v)
	}
	if v := val(t, m, "mongobouncer_operations_total", "route", "r\uFFFD", "command", "c\uFFFD"); v != 1 {
		t.Fatalf("operations %v", v)
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	parser := expfmt.NewTextParser(model.LegacyValidation)
	if _, err := parser.TextToMetricFamilies(rec.Body); err != nil {
		t.Fatalf("scrape does not parse: %v", err)
	}
	m.ForgetRoute(bad)
	mon.HandleEvent(pool.Event{Type: pool.PoolClosed, Address: "h\xff:1"})
	if s := find(t, m, "mongobouncer_operations_total", "route", "r\uFFFD", "command", "c\uFFFD"); s != nil {
		t.Fatalf("forgotten route still exported: %v", s)
	}
}
