package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"text/tabwriter"
	"time"
)

// ErrNoMeasurement reports a run that completed no measured operation, so
// no ratio can be computed (the address is down, every operation failed,
// or the warm-up used up the whole run).
var ErrNoMeasurement = errors.New("loadgen: run measured no operations")

// Side names used in RunRecord.Side.
const (
	SideDirect  = "direct"
	SideProxied = "proxied"
)

// SideSummary aggregates every round of one side of a comparison.
type SideSummary struct {
	// Addr is the side's address.
	Addr string `json:"addr"`
	// Ops is the total of measured operations over all rounds.
	Ops int64 `json:"ops"`
	// Errors is the total of errors over all rounds.
	Errors int64 `json:"errors"`
	// ErrorSamples holds the first few error messages over all rounds.
	ErrorSamples []string `json:"error_samples,omitempty"`
	// Elapsed is the total measured time over all rounds.
	Elapsed time.Duration `json:"elapsed_ns"`
	// OpsPerSec is Ops / Elapsed.
	OpsPerSec float64 `json:"ops_per_sec"`
	// Latency summarises all rounds' latencies merged.
	Latency Latency `json:"latency"`
	// CPU is the CPU time of each of Config.Processes over this side's
	// runs (empty when none is configured or none could be read).
	CPU []ProcessCPU `json:"cpu,omitempty"`

	hist *Histogram
	// completed counts the operations the runs completed, warm-up
	// included: the denominator of CPU per operation.
	completed int64
}

// add adds one run's figures to s.
func (s *SideSummary) add(r *Result) {
	s.merge(&SideSummary{Ops: r.Ops, Errors: r.Errors, ErrorSamples: r.ErrorSamples, Elapsed: r.Elapsed, hist: r.hist})
}

// RunRecord is one run of a comparison, in the order it ran.
type RunRecord struct {
	// Round numbers the round pair, from 0.
	Round int `json:"round"`
	// Side is SideDirect or SideProxied.
	Side string `json:"side"`
	// Result is what the run measured.
	Result Result `json:"result"`
}

// Report is the outcome of Compare. Durations marshal to JSON as integer
// nanoseconds.
type Report struct {
	// Workload, Clients, Rounds, Duration, Warmup and MaxOps repeat the
	// configuration (Duration and MaxOps are per run).
	Workload string `json:"workload"`
	// Clients is the number of concurrent clients per run.
	Clients int `json:"clients"`
	// Rounds is the number of direct+proxied round pairs (merged ones
	// included).
	Rounds int `json:"rounds"`
	// Duration bounds each run.
	Duration time.Duration `json:"duration_ns"`
	// Warmup is excluded from each run's figures.
	Warmup time.Duration `json:"warmup_ns"`
	// MaxOps bounds each run's operations.
	MaxOps int64 `json:"max_ops"`

	// Direct aggregates the direct side.
	Direct SideSummary `json:"direct"`
	// Proxied aggregates the proxied side.
	Proxied SideSummary `json:"proxied"`

	// ThroughputRatio is Proxied.OpsPerSec / Direct.OpsPerSec.
	ThroughputRatio float64 `json:"throughput_ratio"`
	// RoundRatios are the per-round proxied/direct throughput ratios; their
	// spread shows how noisy the machine was.
	RoundRatios []float64 `json:"round_ratios"`
	// RatioMedian, RatioMin and RatioMax summarise RoundRatios.
	RatioMedian float64 `json:"round_ratio_median"`
	// RatioMin is the smallest per-round ratio.
	RatioMin float64 `json:"round_ratio_min"`
	// RatioMax is the largest per-round ratio.
	RatioMax float64 `json:"round_ratio_max"`
	// AddedP50 is Proxied.Latency.P50 - Direct.Latency.P50.
	AddedP50 time.Duration `json:"added_p50_ns"`
	// AddedP99 is Proxied.Latency.P99 - Direct.Latency.P99.
	AddedP99 time.Duration `json:"added_p99_ns"`
	// CPURatio is Direct.CPUPerOp() / Proxied.CPUPerOp(): the throughput
	// ratio to expect when the processes measured share CPUs they keep
	// busy (0 when CPU was not measured).
	CPURatio float64 `json:"cpu_ratio,omitempty"`
	// Steal is the share of the machine's CPU time that the hypervisor
	// gave to other guests during the comparison (Linux; 0 when unknown).
	// On a shared host this is what makes ratios wander from run to run:
	// a few percent already shows.
	Steal float64 `json:"cpu_steal,omitempty"`

	// Runs lists every run in execution order.
	Runs []RunRecord `json:"runs"`
}

// Compare runs cfg's workload against directAddr and proxiedAddr in
// cfg.Rounds round pairs and reports both sides and their ratios. The
// order alternates ABBA-style (direct, proxied, then proxied, direct, ...)
// so slow drifts in machine load hit both sides alike. Each run is bounded
// by cfg.Duration and cfg.MaxOps, so the whole comparison takes at most
// about 2 * Rounds * Duration.
//
// It returns an error, with the rounds completed so far in the Report,
// when ctx is cancelled or a run measures no operation (ErrNoMeasurement).
func Compare(ctx context.Context, directAddr, proxiedAddr string, cfg Config) (rep Report, err error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return Report{}, err
	}
	rep = Report{
		Workload: cfg.Workload, Clients: cfg.Clients, Rounds: cfg.Rounds,
		Duration: cfg.Duration, Warmup: cfg.Warmup, MaxOps: cfg.MaxOps,
		Direct:  SideSummary{Addr: directAddr},
		Proxied: SideSummary{Addr: proxiedAddr},
	}
	stolen := startSteal()
	defer func() { rep.Steal = stolen() }()
	for round := cfg.RoundOffset; round < cfg.RoundOffset+cfg.Rounds; round++ {
		order := []string{SideDirect, SideProxied}
		if round%2 == 1 {
			order = []string{SideProxied, SideDirect}
		}
		var perSide [2]float64
		for _, side := range order {
			addr, sum, idx := directAddr, &rep.Direct, 0
			if side == SideProxied {
				addr, sum, idx = proxiedAddr, &rep.Proxied, 1
			}
			// Start each run from a collected heap, so garbage left by
			// the previous run (the driver workload makes plenty) is not
			// billed to this one.
			runtime.GC()
			cpu0 := sampleCPU(cfg.Processes)
			res, err := Run(ctx, addr, cfg)
			cpu1 := sampleCPU(cfg.Processes)
			rep.Runs = append(rep.Runs, RunRecord{Round: round, Side: side, Result: res})
			sum.add(&res)
			sum.addCPU(cfg.Processes, side == SideProxied, cpu0, cpu1, res.Ops+res.WarmupOps)
			rep.finish()
			cfg.Logger.Info("loadgen: run done", "round", round, "side", side, "addr", addr,
				"ops", res.Ops, "errors", res.Errors, "ops_per_sec", int64(res.OpsPerSec),
				"p50", res.Latency.P50, "p99", res.Latency.P99)
			if err != nil {
				return rep, err
			}
			if res.Ops == 0 {
				why := fmt.Sprintf("no error, %d operations during the warm-up: the server stalled or the run is too short", res.WarmupOps)
				if len(res.ErrorSamples) > 0 {
					why = fmt.Sprintf("%d errors, first: %s", res.Errors, res.ErrorSamples[0])
				}
				return rep, fmt.Errorf("%w: %s side %s, round %d: %s", ErrNoMeasurement, side, addr, round, why)
			}
			perSide[idx] = res.OpsPerSec
		}
		rep.RoundRatios = append(rep.RoundRatios, perSide[1]/perSide[0])
		rep.finish()
	}
	return rep, nil
}

// Merge adds the rounds of o, a comparison of the same addresses with the
// same configuration run separately, to r: a tool that interleaves several
// comparisons round by round (so that the machine's drift hits them alike)
// runs each one round at a time (Config.RoundOffset) and merges them. A
// zero r becomes o.
func (r *Report) Merge(o Report) {
	if len(r.Runs) == 0 && r.Rounds == 0 {
		*r = o
		return
	}
	if n, m := float64(r.Rounds), float64(o.Rounds); n+m > 0 {
		r.Steal = (r.Steal*n + o.Steal*m) / (n + m)
	}
	r.Rounds += o.Rounds
	r.Runs = append(r.Runs, o.Runs...)
	r.RoundRatios = append(r.RoundRatios, o.RoundRatios...)
	r.Direct.merge(&o.Direct)
	r.Proxied.merge(&o.Proxied)
	r.finish()
}

// merge adds o's runs to s.
func (s *SideSummary) merge(o *SideSummary) {
	if s.hist == nil {
		s.hist = NewHistogram()
	}
	s.Ops += o.Ops
	s.Errors += o.Errors
	for _, m := range o.ErrorSamples {
		if len(s.ErrorSamples) < maxErrorSamples {
			s.ErrorSamples = append(s.ErrorSamples, m)
		}
	}
	s.Elapsed += o.Elapsed
	if s.Elapsed > 0 {
		s.OpsPerSec = float64(s.Ops) / s.Elapsed.Seconds()
	}
	if o.hist != nil {
		s.hist.Merge(o.hist)
	}
	s.Latency = s.hist.Summary()
	s.completed += o.completed
	for _, c := range o.CPU {
		j := slices.IndexFunc(s.CPU, func(x ProcessCPU) bool { return x.Name == c.Name })
		if j < 0 {
			s.CPU = append(s.CPU, ProcessCPU{Name: c.Name})
			j = len(s.CPU) - 1
		}
		s.CPU[j].Total += c.Total
	}
	for k := range s.CPU {
		if s.completed > 0 {
			s.CPU[k].PerOp = s.CPU[k].Total / time.Duration(s.completed)
		}
	}
}

// finish recomputes the derived figures from the sides and round ratios.
func (r *Report) finish() {
	if r.Direct.OpsPerSec > 0 {
		r.ThroughputRatio = r.Proxied.OpsPerSec / r.Direct.OpsPerSec
	}
	r.AddedP50 = r.Proxied.Latency.P50 - r.Direct.Latency.P50
	r.AddedP99 = r.Proxied.Latency.P99 - r.Direct.Latency.P99
	if d, p := r.Direct.CPUPerOp(), r.Proxied.CPUPerOp(); d > 0 && p > 0 {
		r.CPURatio = float64(d) / float64(p)
	}
	if n := len(r.RoundRatios); n > 0 {
		s := slices.Sorted(slices.Values(r.RoundRatios))
		r.RatioMin, r.RatioMax = s[0], s[n-1]
		r.RatioMedian = s[n/2]
		if n%2 == 0 {
			r.RatioMedian = (s[n/2-1] + s[n/2]) / 2
		}
	}
}

// us formats d in microseconds, the unit of loopback round trips; the
// decimal only matters for small values.
func us(d time.Duration) string {
	if v := float64(d) / 1e3; v > -100 && v < 100 {
		return fmt.Sprintf("%.1fµs", v)
	}
	return fmt.Sprintf("%.0fµs", float64(d)/1e3)
}

// WriteTable prints the report as a human-readable table.
func (r *Report) WriteTable(w io.Writer) error {
	if _, err := fmt.Fprintf(w, "workload %s, %d clients, %d rounds x 2 sides x %v (warm-up %v, max %d ops per run)\n",
		r.Workload, r.Clients, r.Rounds, r.Duration, r.Warmup, r.MaxOps); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "side\taddr\tops\terrors\tops/s\tp50\tp90\tp99\tmax\t")
	for _, s := range []struct {
		name string
		s    *SideSummary
	}{{SideDirect, &r.Direct}, {SideProxied, &r.Proxied}} {
		l := s.s.Latency
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%.0f\t%s\t%s\t%s\t%s\t\n",
			s.name, s.s.Addr, s.s.Ops, s.s.Errors, s.s.OpsPerSec, us(l.P50), us(l.P90), us(l.P99), us(l.Max))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "proxied/direct throughput %.3f (per-round median %.3f, range %.3f-%.3f); added p50 %s, added p99 %s\n",
		r.ThroughputRatio, r.RatioMedian, r.RatioMin, r.RatioMax, us(r.AddedP50), us(r.AddedP99))
	if err != nil {
		return err
	}
	if err := r.writeCPU(w); err != nil {
		return err
	}
	if r.Steal > 0 {
		if _, err := fmt.Fprintf(w, "CPU steal %.1f%% during the runs (time the hypervisor gave other guests): ratios move with it\n", 100*r.Steal); err != nil {
			return err
		}
	}
	for _, s := range []*SideSummary{&r.Direct, &r.Proxied} {
		for _, m := range s.ErrorSamples {
			if _, err := fmt.Fprintf(w, "error (%s): %s\n", s.Addr, m); err != nil {
				return err
			}
		}
	}
	return nil
}
