package pool

// The limit max_pool_size = "auto" uses: Envoy's adaptive concurrency
// gradient over a minimum RTT measured at a pinned low limit.
//
// Why a probe: every other algorithm here (Vegas, Gradient2) takes the
// lowest RTT it happened to see for the no-load RTT. Under a steady full
// load every window is as queued as the last, so that "minimum" is the RTT
// at the current limit, the estimated queue is ~0, and the limit never
// falls below where it started. On FerretDB (one SQLite writer: the RTT
// grows in proportion to the connections in use, the throughput does not)
// Vegas sat at 8–15 where 2 gave the best p99 (docs/performance.md,
// session 11). Envoy's filter measures the minimum where it is one: it
// pins the limit to a low value for a few dozen operations, now and then,
// and compares every later window against that.
//
// The rule (Envoy's gradient controller, over window means):
//
//	gradient = clamp(minRTT × (1 + buffer) / windowRTT, 0.5, 2)
//	limit    = limit × gradient + √(limit × gradient)
//
// so the limit settles where the upstream adds about a quarter of its
// no-load RTT plus √limit of queue: ~12 for 8 workers of equal speed, ~2
// for a single writer (2 is where a gradient clamped at 0.5 leaves it).
// Changes from Envoy's: increases are smoothed (a fifth of the way per
// window, as Gradient2), a window whose demand stayed under half the limit
// does not raise it (application-limited, as our other limiters), a drop
// multiplies the limit by 0.9 at once, and a probe also ends after
// probeMaxTime, since a connection held for a long time (a transaction
// with a slow client) must not hold every other checkout behind a limit
// of one.
//
// And probes come early when the minimum is stale. A gradient cannot tell
// a queue from a slower path: when every reply comes 300 ms later, the
// limit falls to 2 and stays there until the next probe, and 100 clients
// then time out while the upstream idles (the first FerretDB slowdown run:
// 174 errors). So a probe starts early once every window for a second has
// taken over six times the no-load RTT (a queue that deep does not last
// while the limit halves each window), and once every window for a second
// took under half of it (no queue is faster than no load; the limit is
// held meanwhile, and one such window, a run of fast reads, resets when
// the next is not, except while the probes find the minimum raised: then
// one is the slow path ending, and the limit stays held until the probe);
// a probe that finds the no-load RTT over three times the lowest seen is
// followed by another five seconds later, not thirty, until six in a row
// agree, so that the limit does not climb on a slow minimum once the path
// is fast again. Early probes are at least five seconds apart.
//
// And a probe that measured a slower path gives the throughput back at
// once: after every probe the limit is at least the bandwidth-delay
// product, the rate the upstream delivered (smoothed over windows that
// agree with the minimum) times the no-load RTT just measured, with the
// buffer, as BBR sizes its window. In a steady state that is under the
// limit (a single writer at full speed: about 1) and nothing moves; after
// the slower path's early probe it is the concurrency at which the
// upstream delivers what it did before, where the gradient alone climbed
// from the floor by a fifth of the gap per window, each window of ten
// taking seconds at 300 ms an operation.

import (
	"math"
	"math/rand/v2"
	"time"
)

// The probe's and the gradient's constants (Envoy's defaults where it has
// one: buffer 25 %, jitter 15 %, gradient within [0.5, 2]).
const (
	// probeSamples operations at the probe limit make one minRTT.
	probeSamples = 20
	// probeMaxTime ends a probe that has not gathered probeSamples: the
	// mean of what it has is taken (the old minRTT if it has nothing).
	probeMaxTime = time.Second
	// DefaultProbeInterval is the time between the end of one probe and
	// the start of the next (Envoy: 60 s; shorter here so that an upstream
	// whose path became slower for good is re-measured within a minute).
	DefaultProbeInterval = 30 * time.Second
	probeJitter          = 0.15
	probeBuffer          = 0.25
	// A probe also starts early when every window for reprobeAfter has
	// put the no-load RTT far off (an unclamped gradient under
	// reprobeLow or over reprobeHigh), and the last probe ended at least
	// reprobeGap before.
	reprobeLow   = 0.2
	reprobeHigh  = 2.5
	reprobeAfter = time.Second
	reprobeGap   = 5 * time.Second
	// A probe whose mean is over elevatedFactor × the baseline (the
	// lowest no-load RTT probed) is followed by another after reprobeGap,
	// not the interval, until elevatedProbes in a row have agreed: then
	// the higher minimum is the new baseline.
	elevatedFactor = 3
	elevatedProbes = 6
	// rateSmoothing is the weight of each window in the delivery rate.
	rateSmoothing = 0.2
	gradientLow   = 0.5
	gradientHigh  = 2.0
)

// ProbeLimiter is Envoy's gradient over a probed minimum RTT (see the file
// comment). Not safe for concurrent use (Pool.mu); time comes in as
// arguments.
type ProbeLimiter struct {
	b        bounds
	w        window
	limit    float64
	interval time.Duration
	rnd      func() float64 // [0, 1): the probe interval's jitter

	probing    bool
	probeStart time.Duration // -1: the probe has not seen a time yet
	probeN     int
	probeSum   time.Duration
	saved      float64       // the limit to return to after the probe
	nextProbe  time.Duration // when the next probe starts
	probeEnd   time.Duration // when the last probe ended
	offSince   time.Duration // since when every window took over 6.25x minRTT; -1: the last did not
	lowSince   time.Duration // since when every window took under half minRTT; -1: the last did not

	rate     float64       // completions per second, smoothed over windows near the minimum (see endProbe)
	minRTT   time.Duration // the last probe's mean; 0 before any
	baseline time.Duration // the lowest probe mean (see elevatedFactor); 0 before any
	elevated int           // probes in a row over elevatedFactor × baseline
	measured bool          // a probe has measured minRTT
	last     float64       // last window's mean RTT, ns
	gradient float64
	drops    uint64
	probes   uint64
}

// NewProbeLimiter returns a ProbeLimiter with o's bounds and window. It
// starts with a probe (the limit at the floor until probeSamples
// operations have run or probeMaxTime has passed), then returns to
// o.Initial and follows the gradient.
func NewProbeLimiter(o LimiterOptions) *ProbeLimiter {
	b, initial := newBounds(o)
	l := &ProbeLimiter{b: b, w: newWindow(o), limit: initial, gradient: 1, interval: o.ProbeInterval, rnd: rand.Float64, offSince: -1, lowSince: -1}
	if l.interval <= 0 {
		l.interval = DefaultProbeInterval
	}
	l.startProbe(-1)
	return l
}

// Limit returns the current limit.
func (l *ProbeLimiter) Limit() int { return int(l.limit) }

// SetBounds changes the floor and ceiling; the limit moves into them (a
// probe stays at the new floor).
func (l *ProbeLimiter) SetBounds(floor, ceiling int) {
	l.b.set(floor, ceiling)
	if l.probing {
		l.limit = l.b.floor
		l.saved = l.b.clamp(l.saved)
		return
	}
	l.limit = l.b.clamp(l.limit)
}

// Stats returns a snapshot: MinRTT is the last probe's, LongRTT the last
// window's mean, Gradient the last update's factor.
func (l *ProbeLimiter) Stats() LimiterStats {
	return LimiterStats{Limit: l.Limit(), MinRTT: l.minRTT, LongRTT: time.Duration(l.last),
		Gradient: l.gradient, Drops: l.drops, Probing: l.probing, Probes: l.probes}
}

// ProbeDeadline reports when the probe under way ends at the latest; false
// when none is, or it has not started its clock (no Sample or Tick yet: the
// pool ticks at every checkout, so a probe's second starts with demand).
func (l *ProbeLimiter) ProbeDeadline() (time.Duration, bool) {
	if !l.probing || l.probeStart < 0 {
		return 0, false
	}
	return l.probeStart + probeMaxTime, true
}

// Tick lets time pass without a sample: it starts a new limiter's probe
// clock, and ends a probe past its deadline. It reports whether the limit
// changed.
func (l *ProbeLimiter) Tick(now time.Duration) bool {
	if !l.probing {
		return false
	}
	if l.probeStart < 0 {
		l.probeStart = now
		return false
	}
	if now-l.probeStart >= probeMaxTime {
		l.endProbe(now)
		return true
	}
	return false
}

// Sample records one operation; see Limiter.Sample.
func (l *ProbeLimiter) Sample(now, rtt time.Duration, inflight int, drop bool) bool {
	if drop {
		l.drops++
	}
	if l.probing {
		if l.probeStart < 0 {
			l.probeStart = now
		}
		switch {
		case drop:
			// The limit to come back to backs off; the probe goes on.
			l.saved = l.b.clamp(l.saved * limBackoff)
		case float64(inflight) <= l.b.floor:
			// Only operations that ran at the probe's concurrency say
			// what the no-load RTT is (those started before it did not).
			l.probeN++
			l.probeSum += rtt
		}
		if l.probeN >= probeSamples || now-l.probeStart >= probeMaxTime {
			l.endProbe(now)
			return true
		}
		return false
	}
	early := (l.offSince >= 0 && now-l.offSince >= reprobeAfter) || (l.lowSince >= 0 && now-l.lowSince >= reprobeAfter)
	if now >= l.nextProbe || (early && now-l.probeEnd >= reprobeGap) {
		l.startProbe(now)
		return true
	}
	if !l.w.add(now, rtt, inflight, drop) {
		return false
	}
	l.update(now)
	l.w.reset(now)
	return true
}

// startProbe pins the limit to the floor; now < 0 starts its clock at the
// first Sample or Tick.
func (l *ProbeLimiter) startProbe(now time.Duration) {
	l.probing, l.probeStart, l.probeN, l.probeSum = true, now, 0, 0
	l.saved, l.limit = l.limit, l.b.floor
}

// endProbe takes the probe's mean for minRTT (keeping the old one if no
// operation ran at its concurrency), restores the limit, and schedules the
// next probe.
func (l *ProbeLimiter) endProbe(now time.Duration) {
	if l.probeN > 0 {
		l.minRTT, l.measured = max(1, l.probeSum/time.Duration(l.probeN)), true
	}
	l.probes++
	l.probing, l.probeEnd, l.offSince, l.lowSince = false, now, -1, -1
	// The limit comes back to where it was, and at least to the
	// bandwidth-delay product: the rate the upstream delivered over the
	// no-load RTT just measured, with the gradient's buffer. In a steady
	// state that is below the limit (a single writer at full speed: ~1),
	// so nothing moves; after a probe that found the path slower it is
	// what keeps the throughput: a gradient climbs from the 2 a slow path
	// left it at by a fifth of the gap per window, and at 310 ms an
	// operation a window of ten takes seconds, while 100 clients time out
	// (FerretDB, +300 ms for 10 s: 164 operations past 5 s).
	bdp := l.rate * l.minRTT.Seconds() * (1 + probeBuffer)
	l.limit = l.b.clamp(max(l.saved, bdp))
	j := 1 + probeJitter*(2*l.rnd()-1)
	l.nextProbe = now + time.Duration(float64(l.interval)*j)
	switch {
	case l.baseline == 0 || l.minRTT <= l.baseline:
		l.baseline, l.elevated = l.minRTT, 0
	case l.minRTT > elevatedFactor*l.baseline && l.elevated+1 < elevatedProbes:
		// The no-load RTT rose (a slower path, a slower upstream):
		// probe again soon, so that the limit does not climb on this
		// minimum for a whole interval once it falls back.
		l.elevated++
		l.nextProbe = now + reprobeGap
	case l.minRTT > elevatedFactor*l.baseline:
		l.baseline, l.elevated = l.minRTT, 0 // the new normal
	default:
		l.elevated = 0
	}
	l.w.reset(now)
}

// update applies one closed window, ending at now.
func (l *ProbeLimiter) update(now time.Duration) {
	if l.w.drops > 0 {
		l.gradient = limBackoff
		l.limit = l.b.clamp(l.limit * limBackoff)
		return
	}
	rtt := l.w.mean()
	l.last = rtt
	if !l.measured && (l.minRTT == 0 || time.Duration(rtt) < l.minRTT) {
		// No probe has measured one (nothing ran at the floor during the
		// first): the lowest window mean stands in until one does.
		l.minRTT = time.Duration(rtt)
	}
	raw := float64(l.minRTT) * (1 + probeBuffer) / rtt
	agrees := raw >= reprobeLow && raw <= reprobeHigh // the window is near the minimum
	if agrees {
		// Only windows that agree with the minimum measure the rate the
		// bandwidth-delay product needs: not those of a slower path,
		// whose low rate is the limit it brought down.
		if r := float64(l.w.n) / max(time.Duration(1), now-l.w.start).Seconds(); l.rate == 0 {
			l.rate = r
		} else {
			l.rate += rateSmoothing * (r - l.rate)
		}
	}
	switch {
	case agrees && l.elevated > 0 && l.lowSince >= 0:
		// While the last probes found the no-load RTT raised (a slower
		// path), one window under half of it is the path coming back,
		// not noise: the limit stays held until the probe, or it
		// climbs on the slow minimum until the single writer's queue
		// fills the difference (FerretDB, after a 300 ms slowdown: to
		// 95 connections and 495 timeouts).
		l.offSince = -1
	case agrees:
		l.offSince, l.lowSince = -1, -1
	case raw > reprobeHigh && l.elevated > 0:
		l.offSince = -1
		if l.lowSince < 0 {
			l.lowSince = now - reprobeAfter // due at once (reprobeGap permitting)
		}
	case raw > reprobeHigh:
		// Operations took under half the no-load RTT. One window can
		// (FerretDB: ten fast reads and no insert); every window for a
		// second cannot, unless the no-load RTT fell (a path fast
		// again), and then the limit would climb on the stale minimum
		// until the queue it builds matches it. So such a window raises
		// nothing, and Sample probes again once they have held for
		// reprobeAfter.
		l.offSince = -1
		if l.lowSince < 0 {
			l.lowSince = now
		}
	case l.offSince < 0:
		// Operations take over six times the no-load RTT. A queue that
		// deep does not last: the limit halves each window. What lasts
		// is a no-load RTT that rose (a slower path: every reply later,
		// the limit held at 2 until the next probe while the upstream
		// idles): Sample probes again once this has held for
		// reprobeAfter, counted from this window's start: at 310 ms an
		// operation one window of ten lasts over a second, and is a
		// second of evidence by itself.
		l.lowSince, l.offSince = -1, l.w.start
	}
	g := math.Max(gradientLow, math.Min(gradientHigh, raw))
	l.gradient = g
	est := l.limit * g
	est += math.Sqrt(est)
	if est > l.limit && (l.lowSince >= 0 || l.elevated > 0 || float64(l.w.inflight)*2 < l.limit) {
		// Application-limited (no evidence that more would help), or
		// the minimum may be stale (above), or the probes find the path
		// slower than the baseline: then the limit is the
		// bandwidth-delay product endProbe set, which keeps the rate the
		// upstream delivered before, and a gradient over the slow
		// minimum climbed past it to 70 on FerretDB's single writer,
		// and to 100 as the path came back, its queue still read
		// against the slow minimum. (The headroom raises the
		// limit at gradients a little under 1 too: the check is on the
		// increase, not the gradient, or 10 clients took it to ~48.)
		return
	}
	if est > l.limit {
		// Increases are smoothed (Gradient2's weight, 0.2); decreases
		// apply at once. A window of ten samples that happened to hold
		// only fast operations reads as a gradient of 2: unsmoothed, it
		// doubled the limit about once a second on FerretDB's mix of
		// reads and single-writer inserts, and each spike put a burst of
		// waiting writes at the upstream.
		est = l.limit*(1-limSmoothing) + est*limSmoothing
	}
	l.limit = l.b.clamp(est)
}
