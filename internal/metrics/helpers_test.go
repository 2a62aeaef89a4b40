package metrics

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
)

// families gathers m's registry by family name.
func families(t *testing.T, m *Metrics) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := m.reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := make(map[string]*dto.MetricFamily, len(mfs))
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

// find returns the series of family name whose labels are exactly kv (name,
// value pairs), or nil.
func find(t *testing.T, m *Metrics, name string, kv ...string) *dto.Metric {
	t.Helper()
	mf := families(t, m)[name]
	if mf == nil {
		return nil
	}
	want := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		want[kv[i]] = kv[i+1]
	}
outer:
	for _, s := range mf.GetMetric() {
		if len(s.GetLabel()) != len(want) {
			continue
		}
		for _, l := range s.GetLabel() {
			if v, ok := want[l.GetName()]; !ok || v != l.GetValue() {
				continue outer
			}
		}
		return s
	}
	return nil
}

// val returns the value of a counter or gauge series; the test fails if the
// series does not exist.
func val(t *testing.T, m *Metrics, name string, kv ...string) float64 {
	t.Helper()
	s := find(t, m, name, kv...)
	if s == nil {
		t.Fatalf("no series %s%v; have:\n%s", name, kv, dump(t, m, name))
	}
	switch {
	case s.Counter != nil:
		return s.GetCounter().GetValue()
	case s.Gauge != nil:
		return s.GetGauge().GetValue()
	case s.Untyped != nil:
		return s.GetUntyped().GetValue()
	}
	t.Fatalf("series %s%v is neither counter nor gauge", name, kv)
	return 0
}

// histCount returns the sample count of a histogram series (0 if absent).
func histCount(t *testing.T, m *Metrics, name string, kv ...string) uint64 {
	t.Helper()
	s := find(t, m, name, kv...)
	if s == nil {
		return 0
	}
	return s.GetHistogram().GetSampleCount()
}

// dump lists the series of family name, for failure messages.
func dump(t *testing.T, m *Metrics, name string) string {
	t.Helper()
	mf := families(t, m)[name]
	if mf == nil {
		return "(family absent)"
	}
	var lines []string
	for _, s := range mf.GetMetric() {
		var ls []string
		for _, l := range s.GetLabel() {
			ls = append(ls, l.GetName()+"="+l.GetValue())
		}
		lines = append(lines, fmt.Sprintf("  {%s} %v", strings.Join(ls, ","), s))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}
