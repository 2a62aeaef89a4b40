package loadgen

import (
	"math"
	"math/bits"
	"time"
)

// The histogram is log-bucketed like HdrHistogram: every power of two is
// split into histSub linear sub-buckets, so a recorded value is known to
// within 1/histSub (1.6%) of itself whatever its magnitude, with a fixed,
// small array and O(1) recording. Values below histSub are exact.
const (
	histSubBits = 6
	histSub     = 1 << histSubBits
	// histMaxBits caps the tracked range at 2^36 ns (about 69 s); longer
	// latencies land in the last bucket (Max still records them exactly).
	// The cap keeps one histogram at about 16 KiB, which matters because
	// every client owns one.
	histMaxBits = 36
	histBuckets = (histMaxBits - histSubBits + 1) * histSub
)

// Histogram records durations into log-spaced buckets. The zero value is
// not usable; create one with NewHistogram. A Histogram is not safe for
// concurrent use: give each goroutine its own and Merge them afterwards.
type Histogram struct {
	counts [histBuckets]uint64
	count  uint64
	sum    float64
	min    int64
	max    int64
}

// NewHistogram returns an empty histogram.
func NewHistogram() *Histogram {
	return &Histogram{min: math.MaxInt64}
}

// bucketOf returns the bucket index of v (v >= 0).
func bucketOf(v int64) int {
	u := uint64(v)
	if u < histSub {
		return int(u)
	}
	shift := bits.Len64(u) - histSubBits - 1
	if shift > histMaxBits-histSubBits-1 {
		return histBuckets - 1
	}
	return (shift+1)<<histSubBits + int(u>>uint(shift)) - histSub
}

// bucketHigh returns the largest value that maps to bucket i.
func bucketHigh(i int) int64 {
	if i < histSub {
		return int64(i)
	}
	shift := i>>histSubBits - 1
	mant := int64(histSub + i&(histSub-1))
	return (mant+1)<<uint(shift) - 1
}

// Record adds one observation. Negative durations count as zero.
func (h *Histogram) Record(d time.Duration) {
	v := int64(d)
	if v < 0 {
		v = 0
	}
	h.counts[bucketOf(v)]++
	h.count++
	h.sum += float64(v)
	if v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
}

// Merge adds every observation of o to h.
func (h *Histogram) Merge(o *Histogram) {
	if o == nil || o.count == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.count += o.count
	h.sum += o.sum
	h.min = min(h.min, o.min)
	h.max = max(h.max, o.max)
}

// Count returns the number of observations.
func (h *Histogram) Count() uint64 { return h.count }

// Max returns the largest observation (exact), or 0 when empty.
func (h *Histogram) Max() time.Duration {
	if h.count == 0 {
		return 0
	}
	return time.Duration(h.max)
}

// Min returns the smallest observation (exact), or 0 when empty.
func (h *Histogram) Min() time.Duration {
	if h.count == 0 {
		return 0
	}
	return time.Duration(h.min)
}

// Mean returns the exact arithmetic mean, or 0 when empty.
func (h *Histogram) Mean() time.Duration {
	if h.count == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.count))
}

// Quantile returns the value at quantile q in [0, 1]: the highest value
// equivalent to the ceil(q*count)-th smallest observation, that is at most
// 1/64 above the true value, and clamped to [Min, Max] so Quantile(1) is the
// exact maximum. Quantiles that fall beyond the tracked range (about 69 s)
// report Max. It returns 0 when empty.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.count == 0 {
		return 0
	}
	if q <= 0 {
		return time.Duration(h.min)
	}
	rank := uint64(math.Ceil(q * float64(h.count)))
	rank = max(1, min(rank, h.count))
	if rank == h.count {
		return time.Duration(h.max)
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			if i == histBuckets-1 {
				// The overflow bucket has no meaningful upper bound.
				return time.Duration(h.max)
			}
			return time.Duration(min(max(bucketHigh(i), h.min), h.max))
		}
	}
	return time.Duration(h.max)
}

// Latency summarises a histogram. Durations marshal to JSON as integer
// nanoseconds (the _ns suffix in the field names says so).
type Latency struct {
	// Mean is the arithmetic mean.
	Mean time.Duration `json:"mean_ns"`
	// P50 is the median.
	P50 time.Duration `json:"p50_ns"`
	// P90 is the 90th percentile.
	P90 time.Duration `json:"p90_ns"`
	// P99 is the 99th percentile.
	P99 time.Duration `json:"p99_ns"`
	// Max is the largest observation.
	Max time.Duration `json:"max_ns"`
}

// Summary returns the mean, p50, p90, p99 and max of h.
func (h *Histogram) Summary() Latency {
	return Latency{
		Mean: h.Mean(),
		P50:  h.Quantile(0.50),
		P90:  h.Quantile(0.90),
		P99:  h.Quantile(0.99),
		Max:  h.Max(),
	}
}
