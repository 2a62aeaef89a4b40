package admin

import (
	"cmp"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"
)

// Sampler defaults: a sample every 2 s for the last 5 minutes.
const (
	DefaultSampleInterval = 2 * time.Second
	DefaultSampleWindow   = 5 * time.Minute
)

// Bounds that keep a sampler's memory fixed whatever the configuration
// or the number of routes: at most maxSamples samples of at most
// maxPoolsPerSample pools and maxApps application names each.
const (
	maxSamples        = 3600
	maxPoolsPerSample = 256
	maxApps           = 8
)

// Sampler records, at a fixed interval, what the status page charts:
// every pool's connection counts, the clients by state and the Controller's
// stats. It keeps the last window's worth of samples in a ring buffer, so
// its memory is bounded. Its methods are safe for concurrent use.
type Sampler struct {
	ctl      Controller
	interval time.Duration
	window   time.Duration
	now      func() time.Time

	mu sync.Mutex
	// ring holds the samples, oldest first from index next once full;
	// n counts the valid ones (at most len(ring)). All guarded by mu.
	ring []sample
	next int
	n    int

	lifeMu sync.Mutex
	// stop and done are non-nil once Start ran; stopped is set by Stop, so
	// a Start after Stop does nothing. All guarded by lifeMu.
	stop    chan struct{}
	done    chan struct{}
	stopped bool
}

// sample is one point in time.
type sample struct {
	at             time.Time
	pools          []PoolInfo // sorted by route, server
	clients        int
	byState        [4]int // ClientIdle, ClientWaiting, ClientActive, ClientPinned
	apps           []AppCount
	stats          StatsInfo
	perSec         Rates // since the previous sample
	poolsTruncated bool  // pools beyond maxPoolsPerSample were dropped
}

var clientStates = [4]ClientState{ClientIdle, ClientWaiting, ClientActive, ClientPinned}

// NewSampler returns a stopped sampler taking a sample every interval and
// keeping the last window (defaults for values <= 0; at most 3600 samples).
func NewSampler(ctl Controller, interval, window time.Duration) *Sampler {
	if interval <= 0 {
		interval = DefaultSampleInterval
	}
	if window <= 0 {
		window = DefaultSampleWindow
	}
	n := int((window + interval - 1) / interval)
	n = max(2, min(n, maxSamples))
	return &Sampler{ctl: ctl, interval: interval, window: time.Duration(n) * interval, now: time.Now, ring: make([]sample, n)}
}

// Capacity is how many samples the sampler keeps.
func (s *Sampler) Capacity() int { return len(s.ring) }

// Len is how many samples the sampler holds now.
func (s *Sampler) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// Start takes a sample now and then one every interval, on its own
// goroutine, until Stop. Calling it again, or after Stop, does nothing.
func (s *Sampler) Start() {
	s.lifeMu.Lock()
	defer s.lifeMu.Unlock()
	if s.stop != nil || s.stopped {
		return
	}
	s.stop, s.done = make(chan struct{}), make(chan struct{})
	go s.run(s.stop, s.done)
}

// Stop ends the sampling goroutine and waits for it (at most one sample
// in progress). It is safe to call more than once, and without Start.
func (s *Sampler) Stop() {
	s.lifeMu.Lock()
	defer s.lifeMu.Unlock()
	if s.stopped {
		return
	}
	s.stopped = true
	if s.stop != nil {
		close(s.stop)
		<-s.done
	}
}

// running reports whether the sampling goroutine runs.
func (s *Sampler) running() bool {
	s.lifeMu.Lock()
	defer s.lifeMu.Unlock()
	return s.stop != nil && !s.stopped
}

func (s *Sampler) run(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		s.Sample()
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// Sample records one sample now. The sampling goroutine calls it; tests
// and an HTTP handler without a running sampler call it directly.
func (s *Sampler) Sample() {
	pools := sortedPools(s.ctl.Pools())
	trunc := len(pools) > maxPoolsPerSample
	if trunc {
		pools = pools[:maxPoolsPerSample:maxPoolsPerSample]
	}
	clients := s.ctl.Clients()
	stats := s.ctl.Stats()
	sm := sample{at: s.now(), pools: pools, clients: len(clients), stats: stats, poolsTruncated: trunc}
	apps := map[string]int{}
	for _, c := range clients {
		if i := slices.Index(clientStates[:], c.State); i >= 0 {
			sm.byState[i]++
		}
		if len(apps) < 4096 || apps[c.AppName] > 0 { // bound the map on huge client counts
			apps[c.AppName]++
		}
	}
	sm.apps = topApps(apps)

	s.mu.Lock()
	defer s.mu.Unlock()
	since := SincePrevious
	var prev StatsInfo
	if s.n > 0 {
		prev = s.ring[(s.next+len(s.ring)-1)%len(s.ring)].stats
	}
	if s.n == 0 || stats.Uptime <= prev.Uptime {
		prev, since = StatsInfo{}, SinceStart
	}
	if s.n > 0 {
		shareErrors(sm.pools, s.ring[(s.next+len(s.ring)-1)%len(s.ring)].pools)
	}
	sm.perSec = rates(prev, stats, since)
	s.ring[s.next] = sm
	s.next = (s.next + 1) % len(s.ring)
	s.n = min(s.n+1, len(s.ring))
}

// shareErrors makes each pool's LastError the previous sample's string
// when the text is the same, so that a server that stays down keeps one
// copy of its error (up to 512 bytes) in the ring, not one per sample.
func shareErrors(cur, prev []PoolInfo) {
	var last map[[2]string]string
	for _, p := range prev {
		if p.LastError != "" {
			if last == nil {
				last = map[[2]string]string{}
			}
			last[[2]string{p.Route, p.Server}] = p.LastError
		}
	}
	if last == nil {
		return
	}
	for i := range cur {
		if e, ok := last[[2]string{cur[i].Route, cur[i].Server}]; ok && e == cur[i].LastError {
			cur[i].LastError = e
		}
	}
}

// sampleIfOlder takes a sample when the newest is older than age: how a
// handler without a running sampler still builds a history while someone
// watches the page.
func (s *Sampler) sampleIfOlder(age time.Duration) {
	s.mu.Lock()
	fresh := s.n > 0 && s.now().Sub(s.ring[(s.next+len(s.ring)-1)%len(s.ring)].at) < age
	s.mu.Unlock()
	if !fresh {
		s.Sample()
	}
}

// samples returns the held samples, oldest first.
func (s *Sampler) samples() []sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]sample, 0, s.n)
	start := (s.next - s.n + len(s.ring)) % len(s.ring)
	for i := range s.n {
		out = append(out, s.ring[(start+i)%len(s.ring)])
	}
	return out
}

// AppCount is how many clients share an appName.
type AppCount struct {
	AppName string `json:"appName"`
	Clients int    `json:"clients"`
}

func topApps(apps map[string]int) []AppCount {
	out := make([]AppCount, 0, len(apps))
	for a, n := range apps {
		out = append(out, AppCount{a, n})
	}
	slices.SortFunc(out, func(a, b AppCount) int {
		return cmp.Or(cmp.Compare(b.Clients, a.Clients), cmp.Compare(a.AppName, b.AppName))
	})
	return out[:min(len(out), maxApps)]
}

// StatusData is /status/data: the sampler's history as columns aligned on
// Times (Unix milliseconds), and the newest sample's details.
type StatusData struct {
	IntervalMs int64   `json:"intervalMs"`
	WindowSec  float64 `json:"windowSec"`
	Times      []int64 `json:"times"`
	// Clients are client counts: total and one series per state.
	Clients map[string][]int `json:"clients"`
	// Latency series in milliseconds: waitAvg, waitP99, queryAvg,
	// queryP99, as the Controller's Stats reports them.
	Latency map[string][]float64 `json:"latency"`
	// Rates series per second between consecutive samples: operations,
	// errors, bytesIn, bytesOut.
	Rates map[string][]float64 `json:"rates"`
	Pools []PoolSeries         `json:"pools"`
	// Current is the newest sample; zero when there is none.
	Current CurrentStatus `json:"current"`
}

// PoolSeries is one pool's connection counts over time; a null in a series
// means the pool did not exist at that sample.
type PoolSeries struct {
	PoolInfo  `json:"info"` // the pool's newest snapshot
	Available gapInts       `json:"available"`
	InUse     gapInts       `json:"inUse"`
	Pending   gapInts       `json:"pending"`
	Waiters   gapInts       `json:"waiters"`
	// Limits is the adaptive limit (max_pool_size = "auto"); null where the
	// pool had none.
	Limits gapInts `json:"limit"`
	// WaitAvgMs is the pool's mean checkout wait over each sample
	// interval (0 when nothing was checked out; missing for a pool's first
	// sample, which has no interval).
	WaitAvgMs gapFloats `json:"waitAvgMs"`
}

// gapFloats is a series where NaN marks a missing point; JSON shows it as
// null, which the page draws as a gap.
type gapFloats []float64

// MarshalJSON implements json.Marshaler.
func (g gapFloats) MarshalJSON() ([]byte, error) {
	return appendGaps(g, 8, func(v float64) bool { return math.IsNaN(v) || math.IsInf(v, 0) },
		func(b []byte, v float64) []byte { return strconv.AppendFloat(b, v, 'f', -1, 64) }), nil
}

// appendGaps writes series g as a JSON array, null where gap says a point is
// missing; size is a guess at one value's length.
func appendGaps[T any](g []T, size int, gap func(T) bool, value func([]byte, T) []byte) []byte {
	b := make([]byte, 0, 2+size*len(g))
	b = append(b, '[')
	for i, v := range g {
		if i > 0 {
			b = append(b, ',')
		}
		if gap(v) {
			b = append(b, "null"...)
		} else {
			b = value(b, v)
		}
	}
	return append(b, ']')
}

// CurrentStatus is the newest sample's details.
type CurrentStatus struct {
	At            time.Time           `json:"at"`
	Clients       int                 `json:"clients"`
	ClientsBy     map[ClientState]int `json:"clientsByState"`
	TopApps       []AppCount          `json:"topApps"`
	Stats         StatsReport         `json:"stats"`
	PoolsTruncate bool                `json:"poolsTruncated"`
}

// gapInts is a series where -1 marks a missing point; JSON shows it as
// null, which the page draws as a gap.
type gapInts []int32

// MarshalJSON implements json.Marshaler.
func (g gapInts) MarshalJSON() ([]byte, error) {
	return appendGaps(g, 4, func(v int32) bool { return v < 0 },
		func(b []byte, v int32) []byte { return strconv.AppendInt(b, int64(v), 10) }), nil
}

// Data returns the sampler's history for the status page.
func (s *Sampler) Data() StatusData {
	ss := s.samples()
	n := len(ss)
	d := StatusData{
		IntervalMs: s.interval.Milliseconds(),
		WindowSec:  s.window.Seconds(),
		Times:      make([]int64, n),
		Clients:    map[string][]int{"total": make([]int, n)},
		Latency:    map[string][]float64{},
		Rates:      map[string][]float64{},
		Pools:      []PoolSeries{},
	}
	for _, st := range clientStates {
		d.Clients[string(st)] = make([]int, n)
	}
	for _, k := range []string{"waitAvg", "waitP99", "queryAvg", "queryP99"} {
		d.Latency[k] = make([]float64, n)
	}
	for _, k := range []string{"operations", "errors", "bytesIn", "bytesOut"} {
		d.Rates[k] = make([]float64, n)
	}
	type key struct{ route, server string }
	idx := map[key]int{}
	// prev holds each pool's checkout totals at its previous sample.
	type totals struct {
		checkouts uint64
		wait      time.Duration
	}
	prev := map[key]totals{}
	for i, sm := range ss {
		d.Times[i] = sm.at.UnixMilli()
		d.Clients["total"][i] = sm.clients
		for j, st := range clientStates {
			d.Clients[string(st)][i] = sm.byState[j]
		}
		d.Latency["waitAvg"][i] = ms(sm.stats.WaitAvg)
		d.Latency["waitP99"][i] = ms(sm.stats.WaitP99)
		d.Latency["queryAvg"][i] = ms(sm.stats.QueryAvg)
		d.Latency["queryP99"][i] = ms(sm.stats.QueryP99)
		d.Rates["operations"][i] = sm.perSec.OperationsPerSec
		d.Rates["errors"][i] = sm.perSec.ErrorsPerSec
		d.Rates["bytesIn"][i] = sm.perSec.BytesInPerSec
		d.Rates["bytesOut"][i] = sm.perSec.BytesOutPerSec
		for _, p := range sm.pools {
			k := key{p.Route, p.Server}
			j, ok := idx[k]
			if !ok {
				j = len(d.Pools)
				idx[k] = j
				d.Pools = append(d.Pools, PoolSeries{
					Available: gaps(n), InUse: gaps(n), Pending: gaps(n), Waiters: gaps(n), Limits: gaps(n), WaitAvgMs: floatGaps(n),
				})
			}
			ps := &d.Pools[j]
			ps.PoolInfo = p
			ps.Available[i], ps.InUse[i], ps.Pending[i], ps.Waiters[i] =
				clamp32(p.Available), clamp32(p.InUse), clamp32(p.Pending), clamp32(p.Waiters)
			if p.Limit > 0 {
				ps.Limits[i] = clamp32(p.Limit)
			}
			if pt, ok := prev[k]; ok && p.Checkouts >= pt.checkouts {
				ps.WaitAvgMs[i] = 0
				if dc := p.Checkouts - pt.checkouts; dc > 0 {
					ps.WaitAvgMs[i] = ms((p.CheckoutWait - pt.wait) / time.Duration(dc))
				}
			}
			prev[k] = totals{p.Checkouts, p.CheckoutWait}
		}
	}
	if len(d.Pools) > maxPoolsPerSample { // pools that came and went
		d.Pools = d.Pools[:maxPoolsPerSample]
	}
	slices.SortFunc(d.Pools, func(a, b PoolSeries) int {
		return cmp.Or(cmp.Compare(a.Route, b.Route), cmp.Compare(a.Server, b.Server))
	})
	d.Current.ClientsBy = map[ClientState]int{}
	d.Current.TopApps = []AppCount{}
	if n > 0 {
		last := ss[n-1]
		d.Current.At = last.at
		d.Current.Clients = last.clients
		for j, st := range clientStates {
			d.Current.ClientsBy[st] = last.byState[j]
		}
		d.Current.TopApps = last.apps
		d.Current.Stats = statsReport(last.stats, last.perSec)
		d.Current.PoolsTruncate = last.poolsTruncated
	}
	return d
}

func floatGaps(n int) gapFloats {
	g := make(gapFloats, n)
	for i := range g {
		g[i] = math.NaN()
	}
	return g
}

func gaps(n int) gapInts {
	g := make(gapInts, n)
	for i := range g {
		g[i] = -1
	}
	return g
}

func clamp32(v int) int32 { return int32(max(0, min(v, 1<<31-1))) }
