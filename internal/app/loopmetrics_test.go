package app

import (
	"testing"

	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// /metrics exports the event loop's spin counts as the proxy has them at
// the scrape, by result.
func TestLoopSpinMetrics(t *testing.T) {
	up := fakemongo.Start(t, fakemongo.Options{})
	a := routesApp(t, map[string]string{"*": "mongodb://" + up.Addr() + "/?directConnection=true"})
	for range 20 {
		ping(t, a, "test")
	}
	c1, m1 := a.server.LoopSpins()
	got := map[string]float64{}
	for _, m := range gather(t, a, "mongobouncer_event_loop_spins_total") {
		got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
	}
	c2, m2 := a.server.LoopSpins()
	if len(got) != 2 {
		t.Fatalf("series %v, want caught and missed", got)
	}
	if got["caught"] < float64(c1) || got["caught"] > float64(c2) || got["missed"] < float64(m1) || got["missed"] > float64(m2) {
		t.Fatalf("exported %v; the server had caught %d – %d, missed %d – %d", got, c1, c2, m1, m2)
	}
}
