// This file holds the average round-trip time of server-selection.md
// ("Calculation of Average Round Trip Times"): the moving average the
// monitors keep of hello round trips, which the latency window compares.

package sdam

import (
	"math"
	"time"
)

// RTTAlpha is the weight of a new sample in the moving average. The
// specification fixes it at 0.2 (about 85% of the weight on the nine most
// recent samples).
const RTTAlpha = 0.2

// NextAvgRTT returns the average round-trip time after a new sample: the
// sample itself when there is no previous average (hasPrev false, as after
// the server became available), else alpha*sample + (1-alpha)*prev. A
// negative sample (a clock step) counts as zero, so the average never goes
// negative. The arithmetic is in float64 nanoseconds, exact to the
// nanosecond for averages below 104 days, and rounded to the nearest
// nanosecond.
func NextAvgRTT(prev time.Duration, hasPrev bool, sample time.Duration) time.Duration {
	sample = max(sample, 0)
	if !hasPrev {
		return sample
	}
	prev = max(prev, 0)
	avg := math.Round(RTTAlpha*float64(sample) + (1-RTTAlpha)*float64(prev))
	if avg >= math.MaxInt64 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(avg)
}
