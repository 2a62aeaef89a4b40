package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/loadgen"
)

func TestParseSizes(t *testing.T) {
	got, err := parseSizes("2, 4,auto,64")
	if err != nil || strings.Join(got, ",") != "2,4,auto,64" {
		t.Fatalf("got %v, %v", got, err)
	}
	for _, bad := range []string{"", "0", "-1", "big", "2,,x"} {
		if _, err := parseSizes(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// The table compares every size, auto included, with the fastest fixed
// size, and gives auto's limit range.
func TestSweepTable(t *testing.T) {
	row := func(size string, ops float64, p99 time.Duration, limit ...float64) sweepRow {
		r := sweepRow{Clients: 10, Size: size, Result: loadgen.Result{OpsPerSec: ops, Latency: loadgen.Latency{P99: p99}}}
		for i, v := range limit {
			r.Limit = append(r.Limit, loadgen.Point{At: time.Duration(i) * time.Second, Value: v})
		}
		return r
	}
	var buf bytes.Buffer
	rows := []sweepRow{row("2", 500, 20*time.Millisecond), row("8", 1000, 10*time.Millisecond), row("auto", 950, 11*time.Millisecond, 8, 5, 12)}
	rows[0].Result.Steal = 0.123 // the host took an eighth of the CPU during that size's run
	writeSweepTable(&buf, 10, sweep{cfg: loadgen.Config{Workload: "find-insert", Duration: time.Second}}, rows)
	out := buf.String()
	for _, want := range []string{"best fixed size: 8", "0.95", "1.10", "5–12", "steal", "12.3%"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestParseModelAndAutoBins(t *testing.T) {
	c, err := parseModel("8, 5ms, 0.3")
	if err != nil || c.Workers != 8 || c.Service != 5*time.Millisecond || c.Contention != 0.3 {
		t.Fatalf("got %+v, %v", c, err)
	}
	for _, bad := range []string{"", "8", "0,5ms", "8,x", "8,5ms,-1", "8,5ms,1,2"} {
		if _, err := parseModel(bad); err == nil {
			t.Errorf("model %q accepted", bad)
		}
	}
	bins, err := parseAutoBins("vegas=/tmp/a, aimd=/tmp/b")
	if err != nil || bins["vegas"] != "/tmp/a" || bins["aimd"] != "/tmp/b" {
		t.Fatalf("got %v, %v", bins, err)
	}
	if _, err := parseAutoBins("vegas"); err == nil {
		t.Error("auto-bin without a path accepted")
	}
	if got, err := parseSizes("8,auto,auto-vegas"); err != nil || len(got) != 3 || !isAuto(got[2]) {
		t.Fatalf("auto-NAME sizes: %v, %v", got, err)
	}
}

// A run and its reverse put every size at places summing to n-1, whatever
// the rotation: a drift linear in the place falls on all sizes alike.
func TestSweepOrderBalancesPlaces(t *testing.T) {
	sizes := []string{"2", "4", "8", "16", "32", "64", "auto"}
	if got := sweepOrder(sizes, 2, false); !slices.Equal(got, []string{"8", "16", "32", "64", "auto", "2", "4"}) {
		t.Fatalf("rotation 2: %v", got)
	}
	for r := range 2 * len(sizes) {
		fwd, rev := sweepOrder(sizes, r, false), sweepOrder(sizes, r, true)
		place := map[string]int{}
		for i := range fwd {
			place[fwd[i]] += i
			place[rev[i]] += i
		}
		for _, s := range sizes {
			if place[s] != len(sizes)-1 {
				t.Fatalf("rotation %d: size %s at places summing to %d, want %d (%v, %v)", r, s, place[s], len(sizes)-1, fwd, rev)
			}
		}
	}
}
