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

// The loop's choice between epoll and io_uring is exported while its source
// says the loop runs both, and not at all otherwise.
func TestLoopAdaptiveSeries(t *testing.T) {
	m := New()
	ok, onRing := false, false
	m.SetLoopAdaptiveSource(func() (bool, float64, uint64, uint64, bool) { return onRing, 2.5, 4, 40, ok })
	fams := families(t, m)
	for _, f := range []string{"mongobouncer_event_loop_io_uring", "mongobouncer_event_loop_load",
		"mongobouncer_event_loop_io_switches_total", "mongobouncer_event_loop_moves_total"} {
		if fams[f] != nil {
			t.Fatalf("%s exported for a loop of one driver", f)
		}
	}
	ok, onRing = true, true
	for f, want := range map[string]float64{"mongobouncer_event_loop_io_uring": 1, "mongobouncer_event_loop_load": 2.5,
		"mongobouncer_event_loop_io_switches_total": 4, "mongobouncer_event_loop_moves_total": 40} {
		if got := val(t, m, f); got != want {
			t.Fatalf("%s = %v, want %v", f, got, want)
		}
	}
	onRing = false
	if got := val(t, m, "mongobouncer_event_loop_io_uring"); got != 0 {
		t.Fatalf("on epoll: mongobouncer_event_loop_io_uring = %v, want 0", got)
	}
}
