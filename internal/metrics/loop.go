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

// LoopAdaptiveSource returns the event loop's choice between epoll and
// io_uring when it runs both (event_loop_io = "auto"): whether it serves
// on io_uring now, the load that decided it (the mean of requests out at
// the upstreams), and the changes of the choice and the clients moved
// since start; ok false when the loop runs one driver. Called at every
// scrape, without any lock of Metrics held; it must not block.
type LoopAdaptiveSource func() (onIOUring bool, load float64, switches, moves uint64, ok bool)

var (
	descLoopIOUring = prometheus.NewDesc(Namespace+"_event_loop_io_uring",
		"1 while the event loop serves its clients on io_uring, 0 while on epoll (event_loop_io = \"auto\", which chooses by load).",
		nil, nil)
	descLoopLoad = prometheus.NewDesc(Namespace+"_event_loop_load",
		"The event loop's load as its choice of driver reads it: the mean number of requests out at the upstreams over the last window of 100ms.",
		nil, nil)
	descLoopSwitches = prometheus.NewDesc(Namespace+"_event_loop_io_switches_total",
		"Changes of the event loop's choice between epoll and io_uring.", nil, nil)
	descLoopMoves = prometheus.NewDesc(Namespace+"_event_loop_moves_total",
		"Clients moved between the event loop's epoll and io_uring threads as its choice changed.", nil, nil)
)

// loopCollector exports the sources' counts; nothing while there is none.
type loopCollector struct {
	src   *atomic.Pointer[LoopSpinSource]
	adapt *atomic.Pointer[LoopAdaptiveSource]
}

// SetLoopAdaptiveSource makes /metrics export src's choice
// (mongobouncer_event_loop_io_uring, _load, _io_switches_total,
// _moves_total) while src reports ok. nil exports none.
func (m *Metrics) SetLoopAdaptiveSource(src LoopAdaptiveSource) {
	if src == nil {
		m.loopAdapt.Store(nil)
		return
	}
	m.loopAdapt.Store(&src)
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
func (c loopCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descLoopSpins
	ch <- descLoopIOUring
	ch <- descLoopLoad
	ch <- descLoopSwitches
	ch <- descLoopMoves
}

// Collect implements prometheus.Collector.
func (c loopCollector) Collect(ch chan<- prometheus.Metric) {
	if p := c.src.Load(); p != nil {
		caught, missed := (*p)()
		ch <- prometheus.MustNewConstMetric(descLoopSpins, prometheus.CounterValue, float64(caught), "caught")
		ch <- prometheus.MustNewConstMetric(descLoopSpins, prometheus.CounterValue, float64(missed), "missed")
	}
	if p := c.adapt.Load(); p != nil {
		if onRing, load, switches, moves, ok := (*p)(); ok {
			ring := 0.0
			if onRing {
				ring = 1
			}
			ch <- prometheus.MustNewConstMetric(descLoopIOUring, prometheus.GaugeValue, ring)
			ch <- prometheus.MustNewConstMetric(descLoopLoad, prometheus.GaugeValue, load)
			ch <- prometheus.MustNewConstMetric(descLoopSwitches, prometheus.CounterValue, float64(switches))
			ch <- prometheus.MustNewConstMetric(descLoopMoves, prometheus.CounterValue, float64(moves))
		}
	}
}
