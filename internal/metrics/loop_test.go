package metrics

import "testing"

// The loop's spin counts are exported as the source gives them at each
// scrape, by result, and not at all without a source.
func TestLoopSpinSeries(t *testing.T) {
	const fam = "mongobouncer_event_loop_spins_total"
	m := New()
	if mf := families(t, m)[fam]; mf != nil {
		t.Fatalf("exported without a source: %v", mf)
	}
	var caught, missed uint64 = 7, 2
	m.SetLoopSpinSource(func() (uint64, uint64) { return caught, missed })
	caught, missed = 9, 3
	if c, mi := val(t, m, fam, "result", "caught"), val(t, m, fam, "result", "missed"); c != 9 || mi != 3 {
		t.Fatalf("caught %v, missed %v; want 9 and 3", c, mi)
	}
	if n := len(families(t, m)[fam].GetMetric()); n != 2 {
		t.Fatalf("%d series, want 2", n)
	}
}
