package pool

// The adaptive-limit algorithms beside Gradient2 (limiter.go) and the
// probe (limiter_probe.go, which "auto" uses) for max_pool_size = "auto":
// Vegas and AIMD, as Netflix's concurrency-limits defines them, fed the
// same windows of samples. Which one "auto" uses is limiterAlgorithm;
// docs/pool.md and docs/performance.md say how they were compared.

import (
	"math"
	"time"
)

// limiter is what the pool asks of an adaptive limit (Pool.lim). Like the
// pool's other state it is guarded by Pool.mu; time comes in as arguments.
type limiter interface {
	// Sample records one operation (see Limiter.Sample) and reports
	// whether the limit was updated.
	Sample(now, rtt time.Duration, inflight int, drop bool) bool
	// Limit is the current limit.
	Limit() int
	// SetBounds moves the floor and ceiling (configuration reload).
	SetBounds(floor, ceiling int)
	// Stats is a snapshot for metrics and SHOW POOLS.
	Stats() LimiterStats
	// Tick lets time pass without a sample (a probe's deadline) and
	// reports whether the limit changed.
	Tick(now time.Duration) bool
	// ProbeDeadline is when a probe under way ends at the latest, so that
	// the pool can Tick then; false when none is.
	ProbeDeadline() (time.Duration, bool)
}

// noProbe is the limiter interface's probe half for the limiters that
// change only on samples (Gradient2, Vegas, AIMD): no probe, nothing on a
// Tick.
type noProbe struct{}

// Tick does nothing.
func (noProbe) Tick(time.Duration) bool { return false }

// ProbeDeadline reports no probe.
func (noProbe) ProbeDeadline() (time.Duration, bool) { return 0, false }

// Algorithm names for limiterAlgorithm.
const (
	AlgorithmProbe     = "probe"
	AlgorithmGradient2 = "gradient2"
	AlgorithmVegas     = "vegas"
	AlgorithmAIMD      = "aimd"
)

// limiterAlgorithm is the algorithm "auto" uses: Envoy's gradient over a
// probed minimum RTT (ProbeLimiter), which, alone of the four, comes down
// to an upstream's knee when that is below where the limit starts (a
// single writer, such as FerretDB on SQLite). Vegas, the earlier choice
// by the capacity-model sweep, stays for comparison. It is a variable, not
// a setting, so that the sweep (cmd/mongobouncer-bench) can build binaries
// with another one (go build -ldflags "-X
// github.com/mongobouncer/mongobouncer/internal/pool.limiterAlgorithm=vegas")
// and compare them again; an unknown name means the probe.
var limiterAlgorithm = AlgorithmProbe

// newAdaptiveLimiter returns the limiter limiterAlgorithm names.
func newAdaptiveLimiter(o LimiterOptions) limiter {
	switch limiterAlgorithm {
	case AlgorithmGradient2:
		return NewLimiter(o)
	case AlgorithmAIMD:
		return NewAIMDLimiter(o)
	case AlgorithmVegas:
		return NewVegasLimiter(o)
	}
	return NewProbeLimiter(o)
}

// window aggregates samples into one update, as Limiter does: at least
// o.Window long and o.MinSamples samples, or ended at once by a drop.
type window struct {
	dur        time.Duration
	minSamples int
	start      time.Duration // -1 before the first sample
	n          int
	sum        time.Duration
	inflight   int // highest in-flight count seen
	drops      int
}

func newWindow(o LimiterOptions) window {
	w := window{dur: o.Window, minSamples: o.MinSamples, start: -1}
	if w.dur <= 0 {
		w.dur = DefaultLimiterWindow
	}
	if w.minSamples <= 0 {
		w.minSamples = DefaultLimiterMinSamples
	}
	return w
}

// add records a sample and reports whether the window is complete; the
// caller reads it and calls reset.
func (w *window) add(now, rtt time.Duration, inflight int, drop bool) bool {
	if w.start < 0 {
		w.start = now
	}
	if drop {
		w.drops++
	} else {
		w.n++
		w.sum += rtt
	}
	w.inflight = max(w.inflight, inflight)
	return w.drops > 0 || (now-w.start >= w.dur && w.n >= w.minSamples)
}

// mean is the window's average RTT in ns (at least 1; 0 with no samples).
func (w *window) mean() float64 {
	if w.n == 0 {
		return 0
	}
	return math.Max(1, float64(w.sum)/float64(w.n))
}

func (w *window) reset(now time.Duration) {
	w.start, w.n, w.sum, w.inflight, w.drops = now, 0, 0, 0, 0
}

// bounds are a limiter's floor and ceiling, with NewLimiter's defaults.
type bounds struct{ floor, ceiling float64 }

func newBounds(o LimiterOptions) (bounds, float64) {
	floor := max(o.Floor, 1)
	ceiling := o.Ceiling
	if ceiling <= 0 {
		ceiling = DefaultLimiterCeiling
	}
	ceiling = max(ceiling, floor)
	initial := o.Initial
	if initial <= 0 {
		initial = DefaultLimiterInitial
	}
	b := bounds{float64(floor), float64(ceiling)}
	return b, b.clamp(float64(initial))
}

func (b *bounds) set(floor, ceiling int) {
	floor = max(floor, 1)
	b.floor, b.ceiling = float64(floor), float64(max(ceiling, floor))
}

func (b bounds) clamp(v float64) float64 { return math.Max(b.floor, math.Min(b.ceiling, v)) }

// log10Root is concurrency-limits' Log10RootFunction: log10 of the limit,
// at least 1, in whole steps.
func log10Root(limit float64) float64 { return math.Max(1, math.Floor(math.Log10(limit))) }

// Vegas's queue bounds as multiples of log10(limit), concurrency-limits'
// (a tighter 2 and 4 measured no better: docs/performance.md).
const vegasAlpha, vegasBeta = 3, 6

// vegasProbe is how many windows, times the limit, pass before the
// no-load RTT is forgotten and measured again (concurrency-limits'
// probeMultiplier, counted in windows here).
const vegasProbe = 30

// VegasLimiter is concurrency-limits' VegasLimit over windows: the queue
// at the upstream is estimated as limit × (1 − noLoadRTT / RTT); below
// log10(limit) the limit grows by 6·log10(limit), below 3·log10(limit) by
// log10(limit), above 6·log10(limit) it falls by log10(limit), and a drop
// takes log10(limit) off. The no-load RTT is the lowest window mean, reset
// every vegasProbe × limit windows. Not safe for concurrent use (Pool.mu).
type VegasLimiter struct {
	noProbe
	alpha     float64 // the queue below which the limit grows, × log10(limit)
	beta      float64 // the queue above which it falls, × log10(limit); also the fast step
	b         bounds
	w         window
	limit     float64
	noLoad    float64 // ns; 0 until the first window
	last      float64 // last window's mean RTT, ns
	sinceProb int     // windows since the no-load RTT was last reset
	drops     uint64
}

// NewVegasLimiter returns a VegasLimiter with o's bounds and window.
func NewVegasLimiter(o LimiterOptions) *VegasLimiter {
	b, initial := newBounds(o)
	return &VegasLimiter{alpha: vegasAlpha, beta: vegasBeta, b: b, w: newWindow(o), limit: initial}
}

// Limit returns the current limit.
func (l *VegasLimiter) Limit() int { return int(l.limit) }

// SetBounds changes the floor and ceiling; the limit moves into them.
func (l *VegasLimiter) SetBounds(floor, ceiling int) {
	l.b.set(floor, ceiling)
	l.limit = l.b.clamp(l.limit)
}

// Stats returns a snapshot: MinRTT is the no-load RTT, LongRTT the last
// window's mean, Gradient their ratio.
func (l *VegasLimiter) Stats() LimiterStats {
	g := 1.0
	if l.last > 0 && l.noLoad > 0 {
		g = l.noLoad / l.last
	}
	return LimiterStats{Limit: l.Limit(), MinRTT: time.Duration(l.noLoad), LongRTT: time.Duration(l.last),
		Gradient: g, Drops: l.drops}
}

// Sample records one operation; see Limiter.Sample.
func (l *VegasLimiter) Sample(now, rtt time.Duration, inflight int, drop bool) bool {
	if drop {
		l.drops++
	}
	if !l.w.add(now, rtt, inflight, drop) {
		return false
	}
	l.update()
	l.w.reset(now)
	return true
}

func (l *VegasLimiter) update() {
	lg := log10Root(l.limit)
	if l.w.drops > 0 {
		l.limit = l.b.clamp(l.limit - lg)
		return
	}
	rtt := l.w.mean()
	l.last = rtt
	l.sinceProb++
	if l.sinceProb > vegasProbe*int(l.limit) {
		// Probe: forget the no-load RTT, so that a server that became
		// slower for good is not taken for a queue forever.
		l.sinceProb, l.noLoad = 0, rtt
		return
	}
	if l.noLoad == 0 || rtt < l.noLoad {
		l.noLoad = rtt
		return
	}
	if float64(l.w.inflight)*2 < l.limit {
		return // application-limited
	}
	queue := math.Ceil(l.limit * (1 - l.noLoad/rtt))
	switch {
	case queue <= lg:
		l.limit += l.beta * lg
	case queue < l.alpha*lg:
		l.limit += lg
	case queue > l.beta*lg:
		l.limit -= lg
	}
	l.limit = l.b.clamp(l.limit)
}

// aimdBackoff and aimdTimeout are concurrency-limits' AIMDLimit defaults:
// the factor on a drop, and the RTT past which a sample counts as one.
const (
	aimdBackoff = 0.9
	aimdTimeout = 5 * time.Second
)

// AIMDLimiter is concurrency-limits' AIMDLimit over windows: +1 per window
// whose demand reached half the limit, ×0.9 per window with a drop (a
// sample slower than 5 s counts as one). Latency alone never lowers it.
// Not safe for concurrent use (Pool.mu).
type AIMDLimiter struct {
	noProbe
	b     bounds
	w     window
	limit float64
	grad  float64
	minR  time.Duration
	drops uint64
}

// NewAIMDLimiter returns an AIMDLimiter with o's bounds and window.
func NewAIMDLimiter(o LimiterOptions) *AIMDLimiter {
	b, initial := newBounds(o)
	return &AIMDLimiter{b: b, w: newWindow(o), limit: initial, grad: 1}
}

// Limit returns the current limit.
func (l *AIMDLimiter) Limit() int { return int(l.limit) }

// SetBounds changes the floor and ceiling; the limit moves into them.
func (l *AIMDLimiter) SetBounds(floor, ceiling int) {
	l.b.set(floor, ceiling)
	l.limit = l.b.clamp(l.limit)
}

// Stats returns a snapshot (Gradient is 0.9 after a drop, else 1).
func (l *AIMDLimiter) Stats() LimiterStats {
	return LimiterStats{Limit: l.Limit(), MinRTT: l.minR, LongRTT: l.minR, Gradient: l.grad, Drops: l.drops}
}

// Sample records one operation; see Limiter.Sample.
func (l *AIMDLimiter) Sample(now, rtt time.Duration, inflight int, drop bool) bool {
	drop = drop || rtt > aimdTimeout
	if drop {
		l.drops++
	} else if l.minR == 0 || rtt < l.minR {
		l.minR = rtt
	}
	if !l.w.add(now, rtt, inflight, drop) {
		return false
	}
	switch {
	case l.w.drops > 0:
		l.grad = aimdBackoff
		l.limit = l.b.clamp(l.limit * aimdBackoff)
	case float64(l.w.inflight)*2 >= l.limit:
		l.grad = 1
		l.limit = l.b.clamp(l.limit + 1)
	}
	l.w.reset(now)
	return true
}
