package metrics

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// Every value falls in the bucket whose bounds contain it, buckets are
// contiguous and increasing, and a bucket is never wider than 1/histSub of
// its lower bound (the accuracy the docs promise).
func TestHistBuckets(t *testing.T) {
	var prevEnd uint64
	for i := 0; i < histBuckets; i++ {
		lo, w := histBounds(i)
		if lo != prevEnd {
			t.Fatalf("bucket %d starts at %d, previous ended at %d", i, lo, prevEnd)
		}
		if i >= histSub && w*histSub > lo {
			t.Fatalf("bucket %d [%d,+%d) wider than 1/%d of its bound", i, lo, w, histSub)
		}
		for _, v := range []uint64{lo, lo + w/2, lo + w - 1} {
			if got := histIndex(int64(v)); got != i {
				t.Fatalf("value %d in bucket %d [%d,+%d) indexed %d", v, i, lo, w, got)
			}
		}
		prevEnd = lo + w
	}
	if histIndex(-5) != 0 {
		t.Fatal("negative durations must go to bucket 0")
	}
	if got := histIndex(math.MaxInt64); got != histBuckets-1 {
		t.Fatalf("MaxInt64 indexed %d, want the last bucket %d", got, histBuckets-1)
	}
}

func TestHistEmpty(t *testing.T) {
	var h latencyHist
	if s := h.summary(); s != (histSummary{}) {
		t.Fatalf("empty summary %+v", s)
	}
	if q := h.quantile(0.5); q != 0 {
		t.Fatalf("empty quantile %v", q)
	}
}

// Small values are exact.
func TestHistExactSmall(t *testing.T) {
	var h latencyHist
	for v := range 20 {
		h.record(time.Duration(v + 1)) // 1..20 ns
	}
	s := h.summary()
	if s.count != 20 || s.avg != 11 {
		t.Fatalf("summary %+v, want count 20, avg 11ns (10.5 rounded)", s)
	}
	if s.p99 != 20 {
		t.Fatalf("p99 of 1..20ns = %v, want 20ns", s.p99)
	}
	if q := h.quantile(0.5); q != 10 {
		t.Fatalf("median of 1..20ns = %v, want 10ns (nearest rank)", q)
	}
}

// On known data the p99, the median and the mean are within the promised
// 1/(2*histSub) of the exact nearest-rank values.
func TestHistQuantilesKnownData(t *testing.T) {
	tol := 1.0 / (2 * histSub)
	check := func(name string, got time.Duration, want float64) {
		t.Helper()
		if rel := math.Abs(float64(got)-want) / want; rel > tol {
			t.Errorf("%s = %v, want %v within %.2f%% (off by %.2f%%)", name, got, time.Duration(want), 100*tol, 100*rel)
		}
	}
	cases := []struct {
		name string
		gen  func(i int) time.Duration
		n    int
	}{
		{"uniform 1µs..10ms", func(i int) time.Duration { return time.Duration(i+1) * time.Microsecond }, 10000},
		{"log-uniform 10µs..10s", func(i int) time.Duration {
			return time.Duration(10e3 * math.Pow(1e6, float64(i)/9999))
		}, 10000},
		{"random heavy tail", func(int) time.Duration {
			return time.Duration(50e3 + rand.ExpFloat64()*2e6)
		}, 20000},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var h latencyHist
			vals := make([]float64, c.n)
			var sum float64
			for i := range c.n {
				d := c.gen(i)
				h.record(d)
				vals[i] = float64(d)
				sum += float64(d)
			}
			slices.Sort(vals)
			rank := func(q float64) float64 { return vals[int(math.Ceil(q*float64(c.n)))-1] }
			s := h.summary()
			if s.count != uint64(c.n) {
				t.Fatalf("count %d, want %d", s.count, c.n)
			}
			check("p99", s.p99, rank(0.99))
			check("p50", h.quantile(0.5), rank(0.5))
			check("p999", h.quantile(0.999), rank(0.999))
			check("avg", s.avg, sum/float64(c.n))
		})
	}
}

// A p99 is dominated by its slow 1%: 990 fast values and 10 slow ones put
// the p99 among the fast ones, 11 slow ones put it among the slow ones.
func TestHistP99Boundary(t *testing.T) {
	for _, slow := range []int{10, 11} {
		var h latencyHist
		for range 1000 - slow {
			h.record(time.Millisecond)
		}
		for range slow {
			h.record(time.Second)
		}
		p99 := h.summary().p99
		want := time.Millisecond
		if slow == 11 {
			want = time.Second
		}
		if rel := math.Abs(float64(p99-want)) / float64(want); rel > 1.0/(2*histSub) {
			t.Errorf("%d slow of 1000: p99 %v, want ~%v", slow, p99, want)
		}
	}
}
