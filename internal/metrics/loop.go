package metrics

// The event loop's series: what the proxy's loop threads counted, asked of
// the app at every scrape rather than kept here.

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// LoopSpinSource returns the event loop's spin counts since start
// (event_loop_spin): the replies a loop thread caught while waiting awake,
// and the spins that ended without one. It is called at every scrape,
// without any lock of Metrics held, and must not block.
type LoopSpinSource func() (caught, missed uint64)

var descLoopSpins = prometheus.NewDesc(Namespace+"_event_loop_spins_total",
	"Spins of the io_uring loop threads waiting awake for a lone fast reply (event_loop_spin), by result: caught (the reply came within the spin, sparing a sleep and a wake-up) or missed (the spin ended without it, its CPU spent for nothing).",
	[]string{"result"}, nil)

// loopCollector exports the source's counts; nothing while there is none.
type loopCollector struct {
	src *atomic.Pointer[LoopSpinSource]
}

// SetLoopSpinSource makes /metrics export src's counts
// (mongobouncer_event_loop_spins_total). nil exports none.
func (m *Metrics) SetLoopSpinSource(src LoopSpinSource) {
	if src == nil {
		m.loopSrc.Store(nil)
		return
	}
	m.loopSrc.Store(&src)
}

// Describe implements prometheus.Collector.
func (c loopCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descLoopSpins }

// Collect implements prometheus.Collector.
func (c loopCollector) Collect(ch chan<- prometheus.Metric) {
	p := c.src.Load()
	if p == nil {
		return
	}
	caught, missed := (*p)()
	ch <- prometheus.MustNewConstMetric(descLoopSpins, prometheus.CounterValue, float64(caught), "caught")
	ch <- prometheus.MustNewConstMetric(descLoopSpins, prometheus.CounterValue, float64(missed), "missed")
}
