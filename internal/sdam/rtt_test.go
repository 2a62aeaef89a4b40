// The runner of the official rtt suite (server-selection/rtt) and unit
// tests of the moving average.

package sdam_test

import (
	"encoding/json"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/sdam"
	"github.com/mongobouncer/mongobouncer/internal/testutil/specdir"
)

// TestServerSelectionRTTSpec checks NextAvgRTT against each file:
// avg_rtt_ms is the previous average ("NULL" for none), new_rtt_ms the
// sample, new_avg_rtt the expected average, compared to the nanosecond.
func TestServerSelectionRTTSpec(t *testing.T) {
	dir := specdir.Dir(t, "server-selection", "rtt")
	for _, path := range specdir.Files(t, dir, "*.json") {
		name := strings.TrimSuffix(filepath.Base(path), ".json")
		t.Run(name, func(t *testing.T) {
			var f struct {
				AvgRTTMS  json.RawMessage `json:"avg_rtt_ms"`
				NewRTTMS  float64         `json:"new_rtt_ms"`
				NewAvgRTT float64         `json:"new_avg_rtt"`
			}
			selDecode(t, path, &f)
			var prev time.Duration
			hasPrev := true
			if string(f.AvgRTTMS) == `"NULL"` {
				hasPrev = false
			} else {
				var ms float64
				if err := json.Unmarshal(f.AvgRTTMS, &ms); err != nil {
					t.Fatalf("avg_rtt_ms %s: %v", f.AvgRTTMS, err)
				}
				prev = selMillis(ms)
			}
			got := sdam.NextAvgRTT(prev, hasPrev, selMillis(f.NewRTTMS))
			if want := selMillis(f.NewAvgRTT); got != want {
				t.Errorf("NextAvgRTT(%v, %v, %v) = %v, want %v", prev, hasPrev, selMillis(f.NewRTTMS), got, want)
			}
		})
	}
}

func TestNextAvgRTTEdges(t *testing.T) {
	cases := []struct {
		name         string
		prev         time.Duration
		hasPrev      bool
		sample, want time.Duration
	}{
		{"first sample ignores prev", 50 * time.Millisecond, false, 7 * time.Millisecond, 7 * time.Millisecond},
		{"negative sample is zero", 10 * time.Millisecond, true, -time.Second, 8 * time.Millisecond},
		{"negative first sample is zero", 0, false, -time.Second, 0},
		{"rounds to nearest ns", 1, true, 2, 1}, // 0.4 + 0.8 = 1.2
		{"huge values saturate", time.Duration(math.MaxInt64), true, time.Duration(math.MaxInt64), time.Duration(math.MaxInt64)},
	}
	for _, c := range cases {
		if got := sdam.NextAvgRTT(c.prev, c.hasPrev, c.sample); got != c.want {
			t.Errorf("%s: NextAvgRTT(%v, %v, %v) = %v, want %v", c.name, c.prev, c.hasPrev, c.sample, got, c.want)
		}
	}
	// Repeated samples converge on the sample.
	avg, has := time.Duration(0), false
	for range 100 {
		avg = sdam.NextAvgRTT(avg, has, 20*time.Millisecond)
		has = true
	}
	if avg != 20*time.Millisecond {
		t.Errorf("after 100 equal samples avg = %v", avg)
	}
}
