package metrics

import (
	"fmt"
	"testing"
)

// The auth Observer's reports are counted by reason and result, with the
// labels bounded: past maxAuthLabels distinct values, "other".
func TestAuthCounters(t *testing.T) {
	m := New()
	m.AuthFailed("bad_proof")
	m.AuthFailed("bad_proof")
	m.AuthFailed("restricted")
	m.AuthLookup("found")
	m.AuthLookup("peer_busy")
	if v := val(t, m, "mongobouncer_auth_failures_total", "reason", "bad_proof"); v != 2 {
		t.Fatalf("bad_proof %v", v)
	}
	if v := val(t, m, "mongobouncer_auth_failures_total", "reason", "restricted"); v != 1 {
		t.Fatalf("restricted %v", v)
	}
	if v := val(t, m, "mongobouncer_auth_lookups_total", "result", "peer_busy"); v != 1 {
		t.Fatalf("peer_busy %v", v)
	}
	for i := range 2 * maxAuthLabels {
		m.AuthLookup(fmt.Sprintf("r%d", i))
	}
	if n := len(families(t, m)["mongobouncer_auth_lookups_total"].GetMetric()); n != maxAuthLabels+1 {
		t.Fatalf("%d lookup series, want %d and other", n, maxAuthLabels)
	}
	if v := val(t, m, "mongobouncer_auth_lookups_total", "result", OtherLabel); v != float64(maxAuthLabels+2) {
		t.Fatalf("other %v", v)
	}
}
