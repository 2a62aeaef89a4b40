package loadgen

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestBucketBoundaries(t *testing.T) {
	for i := 0; i < histBuckets-1; i++ {
		hi := bucketHigh(i)
		if got := bucketOf(hi); got != i {
			t.Fatalf("bucketOf(bucketHigh(%d)=%d) = %d", i, hi, got)
		}
		if got := bucketOf(hi + 1); got != i+1 {
			t.Fatalf("bucketOf(%d) = %d, want %d", hi+1, got, i+1)
		}
		// The relative width of a bucket is what bounds the error.
		lo := int64(0)
		if i > 0 {
			lo = bucketHigh(i-1) + 1
		}
		if lo >= histSub && float64(hi-lo+1)/float64(lo) > 1.0/histSub+1e-12 {
			t.Fatalf("bucket %d [%d, %d] wider than 1/%d", i, lo, hi, histSub)
		}
	}
	if got := bucketOf(math.MaxInt64); got != histBuckets-1 {
		t.Fatalf("bucketOf(MaxInt64) = %d, want last bucket %d", got, histBuckets-1)
	}
}

func TestHistogramSmallValuesExact(t *testing.T) {
	h := NewHistogram()
	for v := range 64 {
		h.Record(time.Duration(v))
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0, 0}, {0.01, 0}, {0.5, 31}, {0.9, 57}, {1, 63}} {
		if got := h.Quantile(c.q); got != c.want {
			t.Errorf("Quantile(%v) = %d, want %d", c.q, got, c.want)
		}
	}
}

func TestHistogramKnownData(t *testing.T) {
	h := NewHistogram()
	for i := 1; i <= 10000; i++ {
		h.Record(time.Duration(i) * time.Microsecond)
	}
	if h.Count() != 10000 {
		t.Fatalf("Count = %d", h.Count())
	}
	if h.Min() != time.Microsecond || h.Max() != 10*time.Millisecond {
		t.Fatalf("Min/Max = %v/%v", h.Min(), h.Max())
	}
	if want := 5000500 * time.Nanosecond; h.Mean() != want {
		t.Fatalf("Mean = %v, want %v", h.Mean(), want)
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0.5, 5000 * time.Microsecond}, {0.9, 9000 * time.Microsecond}, {0.99, 9900 * time.Microsecond}, {1, 10 * time.Millisecond}} {
		got := h.Quantile(c.q)
		if got < c.want || float64(got) > float64(c.want)*(1+1.0/histSub) {
			t.Errorf("Quantile(%v) = %v, want within [%v, +1/%d]", c.q, got, c.want, histSub)
		}
	}
	s := h.Summary()
	if s.P50 != h.Quantile(0.5) || s.P99 != h.Quantile(0.99) || s.Max != h.Max() {
		t.Fatalf("Summary %+v disagrees with Quantile", s)
	}
}

// TestHistogramAgainstSort checks quantiles of skewed random data against
// the exact order statistics.
func TestHistogramAgainstSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	h := NewHistogram()
	vals := make([]int64, 50000)
	for i := range vals {
		// Log-normal around 50µs with a long tail, like loopback latency.
		vals[i] = int64(math.Exp(rng.NormFloat64()*1.2) * 50000)
		h.Record(time.Duration(vals[i]))
	}
	slices.Sort(vals)
	for _, q := range []float64{0.001, 0.1, 0.5, 0.9, 0.99, 0.999, 1} {
		rank := int(math.Ceil(q*float64(len(vals)))) - 1
		exact := vals[rank]
		got := int64(h.Quantile(q))
		if got < exact || float64(got) > float64(exact)*(1+1.0/histSub)+1 {
			t.Errorf("Quantile(%v) = %d, exact %d", q, got, exact)
		}
	}
}

func TestHistogramMerge(t *testing.T) {
	a, b, all := NewHistogram(), NewHistogram(), NewHistogram()
	for i := range 1000 {
		d := time.Duration(i*i) * time.Nanosecond
		all.Record(d)
		if i%3 == 0 {
			a.Record(d)
		} else {
			b.Record(d)
		}
	}
	a.Merge(b)
	a.Merge(nil)
	a.Merge(NewHistogram())
	if a.Count() != all.Count() || a.Summary() != all.Summary() || a.Min() != all.Min() {
		t.Fatalf("merged %+v, want %+v", a.Summary(), all.Summary())
	}
}

func TestHistogramEdges(t *testing.T) {
	h := NewHistogram()
	if h.Quantile(0.5) != 0 || h.Max() != 0 || h.Min() != 0 || h.Mean() != 0 {
		t.Fatal("empty histogram should report zeros")
	}
	h.Record(-5)
	h.Record(time.Hour) // beyond the tracked range
	if h.Min() != 0 || h.Max() != time.Hour {
		t.Fatalf("Min/Max = %v/%v", h.Min(), h.Max())
	}
	if got := h.Quantile(1); got != time.Hour {
		t.Fatalf("Quantile(1) = %v, want the exact max", got)
	}
	if got := h.Quantile(0.5); got != 0 {
		t.Fatalf("Quantile(0.5) = %v, want 0", got)
	}
}

func BenchmarkHistogramRecord(b *testing.B) {
	h := NewHistogram()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h.Record(time.Duration(i&0xfffff) * 97)
	}
}

// Two runs merged report their operations over their measured time
// together, and the latencies of both: the slow run's tail shows in p99.
func TestResultMerge(t *testing.T) {
	fast := Result{Ops: 90, Errors: 1, Elapsed: time.Second, ErrorSamples: []string{"a"}, hist: NewHistogram()}
	for range 90 {
		fast.hist.Record(time.Millisecond)
	}
	slow := Result{Ops: 10, WarmupOps: 3, Elapsed: time.Second, ErrorSamples: []string{"b", "c", "d", "e", "f"}, hist: NewHistogram()}
	for range 10 {
		slow.hist.Record(time.Second)
	}
	fast.Merge(&slow)
	if fast.Ops != 100 || fast.WarmupOps != 3 || fast.Errors != 1 || fast.Elapsed != 2*time.Second || fast.OpsPerSec != 50 {
		t.Fatalf("merged %+v", fast)
	}
	if len(fast.ErrorSamples) != maxErrorSamples || fast.ErrorSamples[0] != "a" {
		t.Errorf("error samples %v", fast.ErrorSamples)
	}
	if fast.Histogram().Count() != 100 || fast.Latency.P50 > 2*time.Millisecond || fast.Latency.P99 < 500*time.Millisecond {
		t.Errorf("latency %+v over %d", fast.Latency, fast.Histogram().Count())
	}
	var empty Result
	empty.Merge(&Result{})
	if empty.OpsPerSec != 0 || empty.Histogram().Count() != 0 {
		t.Errorf("merging nothing gave %+v", empty)
	}
}
