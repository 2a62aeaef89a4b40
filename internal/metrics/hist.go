package metrics

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

// latencyHist is a lock-free log-linear histogram of durations in
// nanoseconds, for the averages and p99s of SHOW STATS. It exists beside the
// Prometheus histograms because their buckets are far too coarse for a p99
// and reading them back means gathering the registry.
//
// Values below histSub ns have a bucket each (exact). Above, every power of
// two is split into histSub equal buckets, so a bucket's width is at most
// 1/histSub of its lower bound and a bucket's midpoint is within 1/(2*histSub)
// (1.6%) of any value in it. Recording is one atomic add; the count and the
// sum are derived from the buckets when read, which also means nothing can
// overflow (a sum of nanoseconds would after ~200 days of 1000 busy
// connections).
type latencyHist struct {
	counts [histBuckets]atomic.Uint64
}

const (
	histSubBits = 5
	histSub     = 1 << histSubBits // sub-buckets per power of two
	// histMaxExp is the largest shift: values from histSub<<histMaxExp ns
	// (2^46 ns, about 19.5 hours) up go to the last bucket.
	histMaxExp  = 40
	histBuckets = (histMaxExp + 2) * histSub
)

// histIndex returns the bucket of ns (negative counts as 0).
func histIndex(ns int64) int {
	if ns < histSub {
		if ns < 0 {
			return 0
		}
		return int(ns)
	}
	e := bits.Len64(uint64(ns)) - histSubBits - 1
	if e > histMaxExp {
		return histBuckets - 1
	}
	return e*histSub + int(uint64(ns)>>e)
}

// histBounds returns the lowest value of bucket i and its width.
func histBounds(i int) (lo, width uint64) {
	if i < histSub {
		return uint64(i), 1
	}
	e := i/histSub - 1
	m := uint64(i - e*histSub)
	return m << e, 1 << e
}

// histMid is the value reported for bucket i: the middle of its integer
// range (the value itself for the exact buckets).
func histMid(i int) float64 {
	lo, w := histBounds(i)
	return float64(lo) + float64(w-1)/2
}

// record adds one duration.
func (h *latencyHist) record(d time.Duration) {
	h.counts[histIndex(int64(d))].Add(1)
}

// histSummary is what SHOW STATS reports from a latencyHist.
type histSummary struct {
	count uint64
	avg   time.Duration
	p99   time.Duration
}

// summary reads the histogram once and derives its count, mean and p99.
// Concurrent records may or may not be included; the result is consistent
// with the bucket values it read.
func (h *latencyHist) summary() histSummary {
	var snap [histBuckets]uint64
	var total uint64
	var sum float64
	for i := range h.counts {
		c := h.counts[i].Load()
		snap[i] = c
		total += c
		if c != 0 {
			sum += float64(c) * histMid(i)
		}
	}
	if total == 0 {
		return histSummary{}
	}
	return histSummary{
		count: total,
		avg:   durationOf(sum / float64(total)),
		p99:   durationOf(quantileOf(&snap, total, 0.99)),
	}
}

// quantile returns the q-quantile (0 < q <= 1) of the recorded durations, 0
// when nothing was recorded.
func (h *latencyHist) quantile(q float64) time.Duration {
	var snap [histBuckets]uint64
	var total uint64
	for i := range h.counts {
		snap[i] = h.counts[i].Load()
		total += snap[i]
	}
	if total == 0 {
		return 0
	}
	return durationOf(quantileOf(&snap, total, q))
}

// quantileOf returns the midpoint of the bucket holding the value of rank
// ceil(q*total) (the nearest-rank definition).
func quantileOf(snap *[histBuckets]uint64, total uint64, q float64) float64 {
	rank := uint64(math.Ceil(q * float64(total)))
	if rank < 1 {
		rank = 1
	}
	if rank > total {
		rank = total
	}
	var cum uint64
	for i, c := range snap {
		cum += c
		if cum >= rank {
			return histMid(i)
		}
	}
	return histMid(histBuckets - 1)
}

func durationOf(ns float64) time.Duration {
	if ns >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(math.Round(ns))
}
