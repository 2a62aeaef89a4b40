package loadgen

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// maxErrorSamples is how many error messages a Result keeps.
const maxErrorSamples = 5

// Result is the outcome of one run against one address.
type Result struct {
	// Addr is the address the run targeted.
	Addr string `json:"addr"`
	// Workload and Clients repeat the configuration.
	Workload string `json:"workload"`
	// Clients is the number of concurrent clients.
	Clients int `json:"clients"`
	// Ops counts successful operations completed after the warm-up.
	Ops int64 `json:"ops"`
	// WarmupOps counts successful operations completed during the warm-up.
	WarmupOps int64 `json:"warmup_ops"`
	// Errors counts failed operations and failed connection attempts,
	// warm-up included, so a failing server is never hidden.
	Errors int64 `json:"errors"`
	// ErrorSamples holds the first few error messages.
	ErrorSamples []string `json:"error_samples,omitempty"`
	// Start is when the run's clock started, after any set-up (a driver
	// workload's connections and seed documents): the measured window
	// runs from Start + Warmup to Start + Duration at most.
	Start time.Time `json:"start"`
	// Elapsed is the measured window: from the end of the warm-up to the
	// completion of the last operation.
	Elapsed time.Duration `json:"elapsed_ns"`
	// OpsPerSec is Ops / Elapsed.
	OpsPerSec float64 `json:"ops_per_sec"`
	// Latency summarises the measured operations' latencies.
	Latency Latency `json:"latency"`
	// Steal is the share of the machine's CPU time the hypervisor gave
	// other guests during the run, warm-up included (Linux's steal time;
	// 0 where it cannot be read). On a shared two-core VM it moves a
	// CPU-bound upstream's throughput by a tenth and more, so sweeps
	// report it beside each size.
	Steal float64 `json:"cpu_steal,omitempty"`

	hist *Histogram
}

// Histogram returns the latency histogram of the measured operations, for
// merging several results. It must not be modified.
func (r *Result) Histogram() *Histogram {
	if r.hist == nil {
		return NewHistogram()
	}
	return r.hist
}

// Merge adds o, a run of the same workload against the same target, to r:
// operations, errors and measured time add up, and the latencies are
// those of both runs together. The demo runs each target twice, in
// mirrored orders, and reports them as one.
func (r *Result) Merge(o *Result) {
	s := SideSummary{Ops: r.Ops, Errors: r.Errors, ErrorSamples: r.ErrorSamples, Elapsed: r.Elapsed, hist: r.hist}
	s.add(o)
	r.Ops, r.Errors, r.ErrorSamples, r.Elapsed = s.Ops, s.Errors, s.ErrorSamples, s.Elapsed
	r.OpsPerSec, r.Latency, r.hist = s.OpsPerSec, s.Latency, s.hist
	r.WarmupOps += o.WarmupOps
}

// errorLog counts errors cheaply and keeps the first few messages.
type errorLog struct {
	mu sync.Mutex
	// samples is guarded by mu.
	samples []string
}

func (l *errorLog) add(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.samples) < maxErrorSamples {
		l.samples = append(l.samples, err.Error())
	}
}

func (l *errorLog) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.samples...)
}

// run is the state shared by the clients of one run.
type run struct {
	cfg         Config
	measureFrom time.Time
	// deadline is when the run ends; operations never wait past it.
	deadline time.Time
	// issued counts operations started, to enforce cfg.MaxOps.
	issued atomic.Int64
	errs   errorLog
}

// take reserves one operation; false means the op budget is spent.
func (r *run) take() bool { return r.issued.Add(1) <= r.cfg.MaxOps }

// opDeadline is the deadline for an operation starting at now.
func (r *run) opDeadline(now time.Time) time.Time {
	d := now.Add(r.cfg.OpTimeout)
	if d.After(r.deadline) {
		return r.deadline
	}
	return d
}

// stats is one client's tally; only that client's goroutine touches it.
type stats struct {
	hist      *Histogram
	ops       int64
	warmupOps int64
	errors    int64
	lastEnd   time.Time
}

func newStats() *stats { return &stats{hist: NewHistogram()} }

// success records an operation that ran from start to end.
func (s *stats) success(r *run, start, end time.Time) {
	s.lastEnd = end
	if end.Before(r.measureFrom) {
		s.warmupOps++
		return
	}
	s.ops++
	s.hist.Record(end.Sub(start))
}

// failure records a failed operation or connection attempt.
func (s *stats) failure(r *run, err error) {
	s.errors++
	r.errs.add(err)
}

// Run drives cfg's workload at addr until cfg.Duration passes, cfg.MaxOps
// operations have been attempted, or ctx is cancelled, and returns what it
// measured. For the ping workload addr is host:port; for the driver
// workload it may also be a mongodb:// URI. Failed operations are counted
// in the Result, not returned as an error; the error is non-nil only for
// an invalid configuration or a cancelled ctx (the Result then holds what
// was measured so far).
func Run(ctx context.Context, addr string, cfg Config) (Result, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return Result{}, err
	}
	var prep *driverPrep
	if cfg.Workload != WorkloadPing {
		prep = prepareDriver(ctx, addr, cfg)
		defer prep.close(ctx, cfg.Logger.Warn)
	}
	stolen := startSteal()
	start := time.Now()
	if cfg.OnStart != nil {
		cfg.OnStart(start)
	}
	r := &run{cfg: cfg, measureFrom: start.Add(cfg.Warmup), deadline: start.Add(cfg.Duration)}
	runCtx, cancel := context.WithDeadline(ctx, r.deadline)
	defer cancel()

	var all []*stats
	switch cfg.Workload {
	case WorkloadPing:
		all = runPing(runCtx, addr, r)
	case WorkloadDriver, WorkloadFindInsert:
		all = runDriver(runCtx, prep, r)
	default:
		return Result{}, fmt.Errorf("%w: unknown workload %q", ErrInvalidConfig, cfg.Workload)
	}

	res := Result{Addr: addr, Workload: cfg.Workload, Clients: cfg.Clients, Start: start, hist: NewHistogram()}
	var end time.Time
	for _, s := range all {
		res.Ops += s.ops
		res.WarmupOps += s.warmupOps
		res.Errors += s.errors
		res.hist.Merge(s.hist)
		if s.lastEnd.After(end) {
			end = s.lastEnd
		}
	}
	res.ErrorSamples = r.errs.list()
	if res.Ops > 0 {
		res.Elapsed = end.Sub(r.measureFrom)
		if res.Elapsed > 0 {
			res.OpsPerSec = float64(res.Ops) / res.Elapsed.Seconds()
		}
	}
	res.Latency = res.hist.Summary()
	res.Steal = stolen()
	return res, ctx.Err()
}

// startSteal starts measuring the share of the machine's CPU time the
// hypervisor gave other guests; the function it returns reports the share
// since (0 where /proc/stat cannot be read).
func startSteal() func() float64 {
	steal0, total0, err0 := machineCPU()
	return func() float64 {
		steal1, total1, err := machineCPU()
		if err != nil || err0 != nil || total1 <= total0 {
			return 0
		}
		return float64(steal1-steal0) / float64(total1-total0)
	}
}
