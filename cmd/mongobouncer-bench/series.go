// Comparisons at several client counts and targets, interleaved round by
// round, with their summary table; idle probes at several counts with theirs.

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/loadgen"
)

// comparison is what compareAll measures: each target against direct
// traffic, at each client count.
type comparison struct {
	cfg     loadgen.Config
	counts  []int
	direct  string
	proxied string
	// sp is the spawned upstream and mongobouncer (-spawn), or nil.
	sp         *spawned
	spawnedPID int
	refNames   []string
	haproxyBin string
}

// compareAll starts the references, compares mongobouncer (when -proxied
// is set) and each reference with direct traffic at every client count,
// prints each comparison's table and, when there is more than one, a
// summary, and stops the references.
func compareAll(ctx context.Context, out *output, w io.Writer, c comparison) error {
	var base []loadgen.Process
	if c.sp != nil {
		// Every process of the comparison, so that the report shows
		// where a proxied operation's CPU goes (see docs/performance.md).
		base = []loadgen.Process{{Name: "bench", PID: 0}, {Name: "upstream", PID: c.sp.fake.cmd.Process.Pid}}
	}
	var targets []target
	if c.proxied != "" {
		t := target{name: "mongobouncer", addr: c.proxied}
		if c.spawnedPID != 0 {
			t.proc, t.procName = c.spawnedPID, "mongobouncer"
		}
		targets = append(targets, t)
	}
	refs, err := startRefs(ctx, c.refNames, c.direct, c.haproxyBin, w)
	if err != nil {
		return err
	}
	defer func() {
		for _, r := range refs {
			r.stop()
		}
	}()
	for _, r := range refs {
		fmt.Fprintf(w, "reference: %s at %s (pid %d; no pool, no inspection, one upstream connection per client)\n", r.name, r.addr, r.proc)
	}
	targets = append(targets, refs...)
	if len(targets) == 0 {
		return errors.New("nothing to compare with direct traffic (no -proxied, and no reference could start)")
	}
	for i, n := range c.counts {
		reps, err := interleave(ctx, c, base, targets, n)
		for j, t := range targets {
			rep := &reps[j]
			if len(rep.Runs) == 0 {
				continue
			}
			fmt.Fprintf(w, "\n== %d clients: direct %s against %s %s\n", n, c.direct, t.name, t.addr)
			_ = rep.WriteTable(w)
			out.Series = append(out.Series, seriesEntry{Clients: n, Target: t.name, Compare: rep})
			if i == 0 {
				if t.name == "mongobouncer" {
					out.Compare = rep
					if cpu, ok := rep.Proxied.ProcessCPU("mongobouncer"); ok {
						out.CPUPerOp = cpu.PerOp
					}
				} else {
					out.References = append(out.References, reference{Relay: loadgen.RelayKind(t.name), Compare: rep})
				}
			}
		}
		if err != nil {
			return err
		}
	}
	if len(out.Series) > 1 {
		return writeSummary(w, out.Series, targets)
	}
	return nil
}

// interleave compares every target with direct traffic at n clients, one
// round at a time: round r runs each target's direct/proxied pair (in the
// order the round's parity gives, as Compare alternates), the targets in an
// order rotated by r, so that a slow stretch of the shared machine hits
// every target alike and their ratios compare with each other, not only
// with direct. It returns each target's merged report, with what was
// measured before an error.
func interleave(ctx context.Context, c comparison, base []loadgen.Process, targets []target, n int) ([]loadgen.Report, error) {
	reps := make([]loadgen.Report, len(targets))
	rounds := max(c.cfg.Rounds, 1)
	for r := range rounds {
		for k := range targets {
			j := (k + r) % len(targets)
			t := targets[j]
			cfg := c.cfg
			cfg.Clients, cfg.Rounds, cfg.RoundOffset = n, 1, r
			cfg.Processes = base
			if t.proc != 0 {
				cfg.Processes = slices.Concat(base, []loadgen.Process{{Name: t.procName, PID: t.proc, ProxiedOnly: true}})
			}
			rep, err := loadgen.Compare(ctx, c.direct, t.addr, cfg)
			if len(rep.Runs) > 0 {
				reps[j].Merge(rep)
			}
			if err != nil {
				return reps, fmt.Errorf("%d clients, %s, round %d: %w", n, t.name, r, err)
			}
		}
	}
	return reps, nil
}

// writeSummary prints one row per client count and target: the target's
// throughput against direct's in the same comparison, its latency, and its
// own CPU per operation.
func writeSummary(w io.Writer, series []seriesEntry, targets []target) error {
	fmt.Fprintf(w, "\nsummary (each row: that target against direct traffic, alternated in the same run)\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "clients\ttarget\tops/s\tdirect ops/s\t×direct\tp50\tp99\tdirect p50\tdirect p99\tadded p50\tproxy CPU/op\tCPU ratio\tsteal\t")
	for _, s := range series {
		r := s.Compare
		cpu := "-"
		for _, t := range targets {
			if t.name == s.Target && t.procName != "" {
				if c, ok := r.Proxied.ProcessCPU(t.procName); ok {
					cpu = fmtDur(c.PerOp)
				}
			}
		}
		cpuRatio := "-"
		if r.CPURatio > 0 {
			cpuRatio = fmt.Sprintf("%.3f", r.CPURatio)
		}
		fmt.Fprintf(tw, "%d\t%s\t%.0f\t%.0f\t%.3f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f%%\t\n", s.Clients, s.Target,
			r.Proxied.OpsPerSec, r.Direct.OpsPerSec, r.ThroughputRatio,
			fmtDur(r.Proxied.Latency.P50), fmtDur(r.Proxied.Latency.P99), fmtDur(r.Direct.Latency.P50), fmtDur(r.Direct.Latency.P99),
			fmtDur(r.AddedP50), cpu, cpuRatio, 100*r.Steal)
	}
	return tw.Flush()
}

// fmtDur prints a latency in the unit that suits it.
func fmtDur(d time.Duration) string {
	switch a := max(d, -d); {
	case a < time.Millisecond:
		return fmt.Sprintf("%.1fµs", float64(d)/1e3)
	case a < time.Second:
		return fmt.Sprintf("%.1fms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

// idleTarget is a process to probe: its address and PID, and how to stop
// it when it was started for the probe.
type idleTarget struct {
	addr string
	pid  int
	stop func()
}

// probeIdleAll probes each idle count repeat times and prints every probe
// and a summary: the median cost per client at each count, and what that
// makes at 100,000. With fresh set (-spawn), every probe runs against a
// newly started mongobouncer: a Go process keeps the heap it grew, so a
// second probe of the same process would reuse the first one's memory and
// read too low.
func probeIdleAll(ctx context.Context, out *output, w io.Writer, counts []int, repeat int, cfg loadgen.IdleConfig,
	addr string, fresh func() (idleTarget, error)) error {
	type row struct {
		count           int
		perClient       []float64
		rssBefore, rssA []int64
	}
	var rows []row
	for _, n := range counts {
		r := row{count: n}
		for range repeat {
			t := idleTarget{addr: addr, pid: cfg.PID}
			if fresh != nil {
				var err error
				if t, err = fresh(); err != nil {
					return err
				}
			}
			pc := cfg
			pc.Conns, pc.PID = n, t.pid
			rep, err := loadgen.ProbeIdle(ctx, t.addr, pc)
			if t.stop != nil {
				t.stop()
			}
			if err != nil {
				return err
			}
			_ = rep.WriteTable(w)
			out.Idle = &rep
			out.IdleRuns = append(out.IdleRuns, rep)
			r.perClient = append(r.perClient, rep.BytesPerConn)
			r.rssBefore = append(r.rssBefore, rep.RSSBefore)
			r.rssA = append(r.rssA, rep.RSSAfter)
		}
		rows = append(rows, r)
	}
	if len(rows) < 2 && repeat < 2 {
		return nil
	}
	fmt.Fprintf(w, "\nidle summary (median of %d probe(s) per count; every client answered a ping afterwards)\n", repeat)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "idle clients\tRSS before\tRSS after\tbytes per client\trange\t")
	var last row
	for _, r := range rows {
		fmt.Fprintf(tw, "%d\t%.1f MiB\t%.1f MiB\t%.0f\t%.0f – %.0f\t\n", r.count, mib(median(r.rssBefore)), mib(median(r.rssA)),
			median(r.perClient), slices.Min(r.perClient), slices.Max(r.perClient))
		last = r
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	per := median(last.perClient)
	_, err := fmt.Fprintf(w, "extrapolated to 100,000 idle clients: %.1f MiB before + 100,000 × %.0f bytes = %.0f MiB\n",
		mib(median(last.rssBefore)), per, mib(median(last.rssBefore))+per*100_000/(1<<20))
	return err
}

func mib[T int64 | float64](b T) float64 { return float64(b) / (1 << 20) }

// median of a non-empty slice (the mean of the middle two for an even
// length).
func median[T int64 | float64](v []T) T {
	s := slices.Sorted(slices.Values(v))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
