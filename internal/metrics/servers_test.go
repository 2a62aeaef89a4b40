package metrics

import (
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/mongobouncer/mongobouncer/internal/pool"
)

const (
	famServerInfo = "mongobouncer_server_info"
	famServerRTT  = "mongobouncer_server_rtt_seconds"
)

// fakeServers is a ServerSource whose answer the test changes between
// scrapes, as failovers and membership changes change a topology.
type fakeServers struct {
	mu    sync.Mutex
	list  []ServerRole // guarded by mu
	calls int          // guarded by mu
}

func (f *fakeServers) set(list ...ServerRole) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.list = list
}

func (f *fakeServers) source() []ServerRole {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	return append([]ServerRole(nil), f.list...)
}

// series returns the label sets of family name, each as "k=v,k=v" in label
// order, with their values.
func series(t *testing.T, m *Metrics, name string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	mf := families(t, m)[name]
	if mf == nil {
		return out
	}
	for _, s := range mf.GetMetric() {
		key := ""
		for i, l := range s.GetLabel() {
			if i > 0 {
				key += ","
			}
			key += l.GetName() + "=" + l.GetValue()
		}
		out[key] = s.GetGauge().GetValue()
	}
	if mf.GetType() != dto.MetricType_GAUGE {
		t.Fatalf("%s is %v, want a gauge", name, mf.GetType())
	}
	return out
}

func sameSeries(a, b map[string]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// The server series follow the source at every scrape: a member appears
// with its role, a failover replaces each changed member's series (no
// series with the old role is left), and a member that leaves, or a route
// that goes, takes its series with it.
func TestServerSeriesFollowTheTopology(t *testing.T) {
	m := New()
	if got := series(t, m, famServerInfo); len(got) != 0 {
		t.Fatalf("server series without a source: %v", got)
	}
	f := &fakeServers{}
	m.SetServerSource(f.source)

	f.set(
		ServerRole{Route: "orders", Server: "db1:27017", Role: "primary", RTT: 1500 * time.Microsecond},
		ServerRole{Route: "orders", Server: "db2:27017", Role: "secondary", RTT: 3 * time.Millisecond},
		ServerRole{Route: "orders", Server: "db3:27017", Role: "unknown"}, // never reached: no RTT
		ServerRole{Route: "*", Server: "mongos:27017", Role: "mongos", RTT: time.Millisecond},
	)
	steps := []struct {
		name      string
		set       []ServerRole
		info, rtt map[string]float64
	}{
		{
			name: "discovered",
			info: map[string]float64{
				"role=primary,route=orders,server=db1:27017":   1,
				"role=secondary,route=orders,server=db2:27017": 1,
				"role=unknown,route=orders,server=db3:27017":   1,
				"role=mongos,route=*,server=mongos:27017":      1,
			},
			rtt: map[string]float64{
				"route=orders,server=db1:27017": 0.0015,
				"route=orders,server=db2:27017": 0.003,
				"route=*,server=mongos:27017":   0.001,
			},
		},
		{
			name: "failover",
			set: []ServerRole{
				{Route: "orders", Server: "db1:27017", Role: "unknown", RTT: 1500 * time.Microsecond},
				{Route: "orders", Server: "db2:27017", Role: "primary", RTT: 2 * time.Millisecond},
				{Route: "orders", Server: "db3:27017", Role: "secondary", RTT: 4 * time.Millisecond},
				{Route: "*", Server: "mongos:27017", Role: "mongos", RTT: time.Millisecond},
			},
			info: map[string]float64{
				"role=unknown,route=orders,server=db1:27017":   1,
				"role=primary,route=orders,server=db2:27017":   1,
				"role=secondary,route=orders,server=db3:27017": 1,
				"role=mongos,route=*,server=mongos:27017":      1,
			},
			rtt: map[string]float64{
				"route=orders,server=db1:27017": 0.0015,
				"route=orders,server=db2:27017": 0.002,
				"route=orders,server=db3:27017": 0.004,
				"route=*,server=mongos:27017":   0.001,
			},
		},
		{
			name: "member removed, route removed",
			set: []ServerRole{
				{Route: "orders", Server: "db2:27017", Role: "primary", RTT: 2 * time.Millisecond},
				{Route: "orders", Server: "db3:27017", Role: "secondary", RTT: 4 * time.Millisecond},
			},
			info: map[string]float64{
				"role=primary,route=orders,server=db2:27017":   1,
				"role=secondary,route=orders,server=db3:27017": 1,
			},
			rtt: map[string]float64{
				"route=orders,server=db2:27017": 0.002,
				"route=orders,server=db3:27017": 0.004,
			},
		},
		{name: "every route removed", set: []ServerRole{}, info: map[string]float64{}, rtt: map[string]float64{}},
	}
	for _, st := range steps {
		if st.set != nil {
			f.set(st.set...)
		}
		if got := series(t, m, famServerInfo); !sameSeries(got, st.info) {
			t.Errorf("%s: %s\n got %v\nwant %v", st.name, famServerInfo, got, st.info)
		}
		if got := series(t, m, famServerRTT); !sameSeries(got, st.rtt) {
			t.Errorf("%s: %s\n got %v\nwant %v", st.name, famServerRTT, got, st.rtt)
		}
	}

	// SetServerSource(nil) stops the export and the calls.
	f.set(ServerRole{Route: "orders", Server: "db2:27017", Role: "primary"})
	m.SetServerSource(nil)
	f.mu.Lock()
	before := f.calls
	f.mu.Unlock()
	if got := series(t, m, famServerInfo); len(got) != 0 {
		t.Errorf("series after SetServerSource(nil): %v", got)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.calls != before {
		t.Errorf("the removed source was called %d more times", f.calls-before)
	}
}

// A source that lists a server twice, or with labels that are not UTF-8,
// does not break the scrape.
func TestServerSeriesDuplicatesAndBadLabels(t *testing.T) {
	m := New()
	m.SetServerSource(func() []ServerRole {
		return []ServerRole{
			{Route: "r", Server: "a:1", Role: "primary", RTT: time.Millisecond},
			{Route: "r", Server: "a:1", Role: "secondary", RTT: 2 * time.Millisecond},
			{Route: "r\xff", Server: "b\xfe:1", Role: "x\xff", RTT: time.Millisecond},
		}
	})
	want := map[string]float64{
		"role=primary,route=r,server=a:1":             1,
		"role=x\uFFFD,route=r\uFFFD,server=b\uFFFD:1": 1,
	}
	if got := series(t, m, famServerInfo); !sameSeries(got, want) {
		t.Fatalf("got %v\nwant %v", got, want)
	}
	if v := val(t, m, famServerRTT, "route", "r", "server", "a:1"); v != 0.001 {
		t.Fatalf("rtt of the first entry %v, want 0.001", v)
	}
}

// An adaptive pool's limit, minimum RTT, gradient and drops are exported
// per server; a fixed-size pool has none of those series.
func TestAdaptiveLimitSeries(t *testing.T) {
	m := New()
	f := &fakeServers{}
	m.SetServerSource(f.source)
	f.set(
		ServerRole{Route: "orders", Server: "db1:27017", Role: "primary",
			Limit: &AdaptiveLimit{Limit: 12, MinRTT: 2 * time.Millisecond, Gradient: 0.75, Drops: 3}},
		ServerRole{Route: "fixed", Server: "db1:27017", Role: "primary"},
	)
	want := map[string]map[string]float64{
		"mongobouncer_pool_limit":                 {"route=orders,server=db1:27017": 12},
		"mongobouncer_pool_limit_min_rtt_seconds": {"route=orders,server=db1:27017": 0.002},
		"mongobouncer_pool_limit_gradient":        {"route=orders,server=db1:27017": 0.75},
	}
	for fam, w := range want {
		if got := series(t, m, fam); !sameSeries(got, w) {
			t.Errorf("%s = %v, want %v", fam, got, w)
		}
	}
	drops := families(t, m)["mongobouncer_pool_limit_drops_total"]
	if drops == nil || len(drops.GetMetric()) != 1 || drops.GetMetric()[0].GetCounter().GetValue() != 3 {
		t.Errorf("drops = %v, want one counter at 3", drops)
	}
}

// The max_db_connections series carry the source's pool.ShareStats.
func TestDBConnectionSeries(t *testing.T) {
	m := New()
	f := &fakeServers{}
	m.SetServerSource(f.source)
	f.set(ServerRole{Route: "orders", Server: "db1:27017", Role: "primary",
		DB: pool.ShareStats{Max: 20, Used: 17, Waiting: 2, Waits: 9, Evictions: 4}})
	key := "route=orders,server=db1:27017"
	for name, want := range map[string]float64{"mongobouncer_db_connections_max": 20, "mongobouncer_db_connections": 17,
		"mongobouncer_db_connections_waiting_pools": 2} {
		if got := series(t, m, name); got[key] != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	mfs := families(t, m)
	for name, want := range map[string]float64{"mongobouncer_db_connections_waits_total": 9, "mongobouncer_db_connections_evictions_total": 4} {
		mf := mfs[name]
		if mf == nil || len(mf.GetMetric()) != 1 || mf.GetMetric()[0].GetCounter().GetValue() != want {
			t.Errorf("%s = %v, want %v", name, mf, want)
		}
	}
}
