package pool

// Gradient2, one of the adaptive concurrency limits measured for
// max_pool_size = "auto" (how many connections of one pool may be checked
// out at once); "auto" uses the probe (limiter_probe.go). This is
// Netflix's Gradient2 (concurrency-limits)
// fed one aggregated sample per window,
// with two changes: a decrease applies at once (Envoy's rule; Gradient2
// smooths both ways), and drops back off multiplicatively as AIMD does
// (Gradient2 alone ignores them).
// docs/pool.md compares them.

import (
	"math"
	"time"
)

// Limiter defaults.
const (
	// DefaultLimiterCeiling is max_pool_size_ceiling's default.
	DefaultLimiterCeiling = 100
	// DefaultLimiterInitial is the limit a new Limiter starts at (clamped to
	// its floor and ceiling): small enough that a fresh pool does not open
	// a burst of connections before it has learnt anything.
	DefaultLimiterInitial = 8
	// DefaultLimiterWindow is the shortest window of samples that makes one
	// update; at least DefaultLimiterMinSamples samples are needed as well.
	DefaultLimiterWindow     = 100 * time.Millisecond
	DefaultLimiterMinSamples = 10
)

// Gradient2's constants, as in Netflix's Gradient2Limit, and AIMD's back-off.
const (
	limTolerance   = 1.5 // a short RTT up to 1.5× the long one does not lower the limit
	limSmoothing   = 0.2 // weight of a new estimate
	limLongWindow  = 600 // windows averaged into the long RTT (a minute at 100 ms)
	limWarmup      = 10  // windows averaged plainly before the long RTT turns exponential
	limBackoff     = 0.9 // the limit's factor on a window with drops
	limMinRTTReset = 30 * time.Second
)

// LimiterOptions configures a Limiter. Zero fields take the defaults above.
type LimiterOptions struct {
	// Floor is the lowest limit (min_pool_size, at least 1).
	Floor int
	// Ceiling is the highest limit (max_pool_size_ceiling).
	Ceiling int
	// Initial is the starting limit.
	Initial int
	// Window and MinSamples bound each update's window.
	Window     time.Duration
	MinSamples int
	// ProbeInterval is the time between ProbeLimiter's minimum-RTT probes
	// (DefaultProbeInterval if 0), give or take 15 %.
	ProbeInterval time.Duration
}

// LimiterStats is a snapshot of a Limiter, for metrics and SHOW POOLS.
type LimiterStats struct {
	// Limit is the current limit.
	Limit int
	// MinRTT is the lowest window-average RTT of the last 30 s or so (0
	// before the first window).
	MinRTT time.Duration
	// LongRTT is the long-term average RTT the gradient compares against.
	LongRTT time.Duration
	// Gradient is the last update's factor: long RTT × tolerance / short
	// RTT clamped to [0.5, 1], or the back-off after a drop; 1 before the
	// first update.
	Gradient float64
	// Drops counts the samples reported as drops.
	Drops uint64
	// Probing says a minimum-RTT probe holds the limit at the floor now;
	// Probes counts the probes ended (ProbeLimiter only).
	Probing bool
	Probes  uint64
}

// Limiter is an adaptive concurrency limit. It is not safe for concurrent
// use: a Pool's limiter is guarded by Pool.mu, like the rest of the pool.
// Time comes in as arguments, so tests drive it with a fake clock.
type Limiter struct {
	noProbe
	floor, ceiling float64
	window         time.Duration
	minSamples     int

	limit    float64
	gradient float64
	longRTT  float64 // ns; plain average for the first limWarmup windows
	longN    int     // windows averaged into longRTT, up to limWarmup
	minRTT   time.Duration
	minAt    time.Duration // when minRTT was last reset
	drops    uint64

	// The current window.
	winStart    time.Duration
	winN        int
	winSum      time.Duration
	winInflight int // highest in-flight count seen
	winDrops    int
}

// NewLimiter returns a Limiter with o's bounds (Floor at least 1, Ceiling
// at least Floor).
func NewLimiter(o LimiterOptions) *Limiter {
	if o.Floor < 1 {
		o.Floor = 1
	}
	if o.Ceiling <= 0 {
		o.Ceiling = DefaultLimiterCeiling
	}
	o.Ceiling = max(o.Ceiling, o.Floor)
	if o.Initial <= 0 {
		o.Initial = DefaultLimiterInitial
	}
	if o.Window <= 0 {
		o.Window = DefaultLimiterWindow
	}
	if o.MinSamples <= 0 {
		o.MinSamples = DefaultLimiterMinSamples
	}
	l := &Limiter{
		floor: float64(o.Floor), ceiling: float64(o.Ceiling),
		window: o.Window, minSamples: o.MinSamples,
		gradient: 1,
		winStart: -1,
	}
	l.limit = l.clamp(float64(o.Initial))
	return l
}

// SetBounds changes the floor and ceiling (configuration reload); the limit
// moves into them at once.
func (l *Limiter) SetBounds(floor, ceiling int) {
	floor = max(floor, 1)
	l.floor, l.ceiling = float64(floor), float64(max(ceiling, floor))
	l.limit = l.clamp(l.limit)
}

// Limit returns the current limit.
func (l *Limiter) Limit() int { return int(l.limit) }

// Stats returns a snapshot.
func (l *Limiter) Stats() LimiterStats {
	return LimiterStats{Limit: l.Limit(), MinRTT: l.minRTT, LongRTT: time.Duration(l.longRTT),
		Gradient: l.gradient, Drops: l.drops}
}

// Sample records one operation that ended at now (any monotonic offset)
// after rtt, with inflight operations running when it started (itself
// included); drop says it timed out, failed on the network or was refused
// as overloaded. It returns true when the limit was updated.
func (l *Limiter) Sample(now, rtt time.Duration, inflight int, drop bool) bool {
	if l.winStart < 0 {
		l.winStart = now
	}
	if drop {
		l.winDrops++
		l.drops++
	} else {
		l.winN++
		l.winSum += rtt
	}
	l.winInflight = max(l.winInflight, inflight)
	// A drop ends its window at once: back-off must not wait for samples
	// an overloaded server may never send.
	if l.winDrops == 0 && (now-l.winStart < l.window || l.winN < l.minSamples) {
		return false
	}
	l.update(now)
	l.winStart, l.winN, l.winSum, l.winInflight, l.winDrops = now, 0, 0, 0, 0
	return true
}

// update applies one closed window.
func (l *Limiter) update(now time.Duration) {
	if l.winDrops > 0 {
		l.gradient = limBackoff
		l.limit = l.clamp(l.limit * limBackoff)
		return
	}
	short := float64(l.winSum) / float64(l.winN)
	if short <= 0 {
		short = 1
	}
	if r := time.Duration(short); l.minRTT == 0 || r < l.minRTT || now-l.minAt >= limMinRTTReset {
		l.minRTT, l.minAt = r, now
	}
	if l.longN < limWarmup {
		l.longN++
		l.longRTT += (short - l.longRTT) / float64(l.longN)
	} else {
		const f = 2.0 / (limLongWindow + 1)
		l.longRTT = l.longRTT*(1-f) + short*f
	}
	if l.longRTT/short > 2 {
		// Latency fell well below the long-term average (the server
		// recovered): let the average follow faster, so that the limit is
		// not held down by the slow past.
		l.longRTT *= 0.95
	}
	if float64(l.winInflight) < l.limit/2 {
		// Application-limited: too little demand to learn whether a higher
		// limit would hurt.
		return
	}
	l.gradient = math.Max(0.5, math.Min(1, limTolerance*l.longRTT/short))
	est := l.limit*l.gradient + math.Sqrt(l.limit)
	if est < l.limit {
		// Latency climbed: back off at once, as Envoy's filter does, not
		// at Gradient2's smoothed pace (a fifth of the way per window),
		// which took seconds to halve the limit when a server slowed
		// down fourfold. Only increases are smoothed.
		l.limit = l.clamp(est)
		return
	}
	l.limit = l.clamp(l.limit*(1-limSmoothing) + est*limSmoothing)
}

func (l *Limiter) clamp(v float64) float64 { return math.Max(l.floor, math.Min(l.ceiling, v)) }
