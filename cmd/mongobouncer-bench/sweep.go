// The pool-size sweep (issue 30 item 2): one mongobouncer per pool size,
// fixed sizes and "auto", each in turn in front of the same upstream
// through a relay that can slow it down mid-run, and for "auto" the
// adaptive limit over time, scraped from mongobouncer's /metrics and drawn
// as a PNG.

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/loadgen"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// limitMetric is the adaptive limit's series in mongobouncer's /metrics.
const limitMetric = "mongobouncer_pool_limit"

// sweep is what runSweep measures.
type sweep struct {
	cfg    loadgen.Config
	counts []int
	sizes  []string // "2", "4", ..., "auto", "auto-NAME"
	bin    string   // the mongobouncer binary
	// autoBins are the binaries of "auto-NAME" sizes, by NAME: builds
	// whose "auto" uses another algorithm (-auto-bin).
	autoBins map[string]string
	upstream string // host:port of the upstream (FerretDB)
	mode     string
	loop     bool
	// The slowdown: from slowAt after a run's start, for slowFor, the
	// relay holds every reply back by slowDelay (0: no slowdown).
	slowDelay, slowAt, slowFor time.Duration
	// slowWorkers, with the capacity model, is the other slowdown: a
	// background job takes this many of its workers for the same span.
	slowWorkers int
	model       *fakemongo.Server // the -model upstream, nil with -upstream
	plot        string            // PNG path ("": none); one per count, suffixed with it when several
	rotate      int               // start the size order at this index (alternates repeated runs)
	// reverse runs the rotated order backwards: a run and its reverse put
	// every size at the same mean position (sweepOrder).
	reverse bool
	// pause is the idle time before each size's run (sweepOne).
	pause  time.Duration
	scrape time.Duration
}

// sweepOrder is the order a run measures sizes in: rotated to start at
// index rotate, and backwards when reverse is set.
//
// Why both: FerretDB's throughput drifts within a run (its SQLite WAL
// grows while readers never leave it, and each size's leftovers add to
// the next), so the later a size runs the less it gets: 116 ops/s first
// and 77 last in one 1,000-client run (docs/performance.md, session 14).
// Rotation alone moves the first place around, but over fewer runs than
// sizes some size is always late (in session 13's five runs of eight
// sizes, "auto" ran at places 2-6, 32 at 0-4). A run and its reverse
// put each size at places i and n-1-i, the same mean for all, so a drift
// that is linear in the place falls on every size alike.
func sweepOrder(sizes []string, rotate int, reverse bool) []string {
	n := len(sizes)
	out := make([]string, n)
	for i := range n {
		out[i] = sizes[((i+rotate)%n+n)%n]
	}
	if reverse {
		slices.Reverse(out)
	}
	return out
}

// sweepRow is one size's run at one client count.
type sweepRow struct {
	Clients int            `json:"clients"`
	Size    string         `json:"size"`
	Result  loadgen.Result `json:"result"`
	// Limit is the adaptive limit over time ("auto" only), from the run's
	// start.
	Limit []loadgen.Point `json:"limit,omitempty"`
}

// isAuto reports whether a -sweep size is adaptive ("auto" or
// "auto-NAME").
func isAuto(size string) bool { return size == "auto" || strings.HasPrefix(size, "auto-") }

// parseSizes parses -sweep: pool sizes of 1 or more, "auto", or
// "auto-NAME" (auto with the -auto-bin binary called NAME).
func parseSizes(s string) ([]string, error) {
	var out []string
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if n, err := strconv.Atoi(part); !isAuto(part) && (err != nil || n < 1) {
			return nil, fmt.Errorf("bad pool size %q (want a number of 1 or more, or auto)", part)
		}
		out = append(out, part)
	}
	if len(out) == 0 {
		return nil, errors.New("no pool size")
	}
	return out, nil
}

// runSweep measures every size at every client count, prints a table per
// count and writes the plots.
func runSweep(ctx context.Context, s sweep, w io.Writer) ([]sweepRow, error) {
	var rows []sweepRow
	for _, n := range s.counts {
		var these []sweepRow
		for _, size := range sweepOrder(s.sizes, s.rotate, s.reverse) {
			row, err := sweepOne(ctx, s, n, size)
			if err != nil {
				return rows, fmt.Errorf("%d clients, pool %s: %w", n, size, err)
			}
			these = append(these, row)
		}
		writeSweepTable(w, n, s, these)
		rows = append(rows, these...)
		if s.plot != "" {
			path := s.plot
			if len(s.counts) > 1 {
				ext := filepath.Ext(path)
				path = strings.TrimSuffix(path, ext) + "-" + strconv.Itoa(n) + ext
			}
			if err := writeSweepPlot(path, s, n, these); err != nil {
				return rows, err
			}
			fmt.Fprintf(w, "limit over time: %s\n", path)
		}
	}
	return rows, nil
}

// sweepOne runs the workload against a fresh mongobouncer of one size,
// in front of a fresh relay to the upstream.
func sweepOne(ctx context.Context, s sweep, clients int, size string) (sweepRow, error) {
	// The upstream finishes what the last size left queued first, and
	// FerretDB's WAL restarts once no reader holds it; without the pause
	// each size began where the last one's load left the upstream.
	if s.pause > 0 {
		if sleepCtx(ctx, s.pause); ctx.Err() != nil {
			return sweepRow{}, ctx.Err()
		}
	}
	relay, err := loadgen.ListenRelay("127.0.0.1:0", s.upstream, loadgen.RelayGoroutine)
	if err != nil {
		return sweepRow{}, err
	}
	defer relay.Close()
	bin, poolSize := s.bin, size
	if name, ok := strings.CutPrefix(size, "auto-"); ok {
		if bin, ok = s.autoBins[name]; !ok {
			return sweepRow{}, fmt.Errorf("no -auto-bin for %q", name)
		}
		poolSize = "auto"
	}
	b, err := startSweepBouncer(bin, relay.Addr(), poolSize, s.mode, s.loop)
	if err != nil {
		return sweepRow{}, err
	}
	defer b.child.stop()

	cfg := s.cfg
	cfg.Clients = clients
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var limit chan []loadgen.Point
	cfg.OnStart = func(start time.Time) {
		if isAuto(size) {
			limit = make(chan []loadgen.Point, 1)
			go func() {
				limit <- loadgen.WatchMetric(runCtx, "http://"+b.admin+"/metrics", limitMetric, start, s.scrape)
			}()
		}
		switch {
		case s.slowWorkers > 0 && s.model != nil:
			var release func()
			go during(runCtx, start, s.slowAt, s.slowFor,
				func() { release = s.model.Occupy(runCtx, s.slowWorkers) }, func() { release() })
		case s.slowDelay > 0:
			go during(runCtx, start, s.slowAt, s.slowFor,
				func() { relay.SetDelay(s.slowDelay) }, func() { relay.SetDelay(0) })
		}
	}
	res, err := loadgen.Run(ctx, b.listen, cfg)
	cancel()
	row := sweepRow{Clients: clients, Size: size, Result: res}
	if limit != nil {
		row.Limit = <-limit
	}
	return row, err
}

// during calls on at at after start and off at at+dur (or when ctx ends,
// if on was called).
func during(ctx context.Context, start time.Time, at, dur time.Duration, on, off func()) {
	sleepUntil := func(t time.Time) bool {
		timer := time.NewTimer(time.Until(t))
		defer timer.Stop()
		select {
		case <-ctx.Done():
			return false
		case <-timer.C:
			return true
		}
	}
	if !sleepUntil(start.Add(at)) {
		return
	}
	on()
	defer off()
	sleepUntil(start.Add(at + dur))
}

// sweepBouncer is a spawned mongobouncer with its admin HTTP listener.
type sweepBouncer struct {
	child  *child
	listen string
	admin  string
}

// startSweepBouncer starts bin in front of upstream with max_pool_size size
// and an admin listener for /metrics, and waits until it accepts clients.
func startSweepBouncer(bin, upstream, size, mode string, loop bool) (*sweepBouncer, error) {
	listen, err := freeAddr()
	if err != nil {
		return nil, err
	}
	admin, err := freeAddr()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--listen", listen, "--upstream", "mongodb://"+upstream+"/", "--pool-mode", mode,
		"--max-pool-size", size, "--max-client-conn", "0", "--log-level", "warn", "--admin-listen", admin,
		fmt.Sprintf("--event-loop=%v", loop))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	c, err := startChild(cmd)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case err := <-c.exited:
			return nil, fmt.Errorf("%s exited at start: %v", bin, err)
		default:
		}
		if conn, err := net.DialTimeout("tcp", listen, 200*time.Millisecond); err == nil {
			conn.Close()
			return &sweepBouncer{child: c, listen: listen, admin: admin}, nil
		}
		if time.Now().After(deadline) {
			c.stop()
			return nil, errors.New("mongobouncer did not start listening within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// writeSweepTable prints one count's rows with each size's throughput and
// p99 against the best fixed size's (highest throughput).
func writeSweepTable(w io.Writer, clients int, s sweep, rows []sweepRow) {
	best := -1
	for i, r := range rows {
		if !isAuto(r.Size) && (best < 0 || r.Result.OpsPerSec > rows[best].Result.OpsPerSec) {
			best = i
		}
	}
	slow := "none"
	if s.slowWorkers > 0 {
		slow = fmt.Sprintf("%d workers taken from %v to %v", s.slowWorkers, s.slowAt, s.slowAt+s.slowFor)
	} else if s.slowDelay > 0 {
		slow = fmt.Sprintf("+%v per reply from %v to %v", s.slowDelay, s.slowAt, s.slowAt+s.slowFor)
	}
	fmt.Fprintf(w, "\n== %d clients, %s workload, %v per size, slowdown %s\n", clients, s.cfg.Workload, s.cfg.Duration, slow)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "pool\tops/s\t× best\tp50\tp99\tp99 × best\terrors\tlimit min–max\tsteal\t")
	for _, r := range rows {
		rel, relP99 := "–", "–"
		if best >= 0 && rows[best].Result.OpsPerSec > 0 {
			rel = fmt.Sprintf("%.2f", r.Result.OpsPerSec/rows[best].Result.OpsPerSec)
			if p := rows[best].Result.Latency.P99; p > 0 {
				relP99 = fmt.Sprintf("%.2f", float64(r.Result.Latency.P99)/float64(p))
			}
		}
		lim := "–"
		if len(r.Limit) > 0 {
			lo, hi := r.Limit[0].Value, r.Limit[0].Value
			for _, p := range r.Limit {
				lo, hi = min(lo, p.Value), max(hi, p.Value)
			}
			lim = fmt.Sprintf("%g–%g", lo, hi)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%v\t%v\t%s\t%d\t%s\t%.1f%%\t\n", r.Size, r.Result.OpsPerSec, rel,
			r.Result.Latency.P50.Round(time.Microsecond), r.Result.Latency.P99.Round(time.Microsecond), relP99, r.Result.Errors, lim,
			100*r.Result.Steal)
	}
	_ = tw.Flush()
	if best >= 0 {
		fmt.Fprintf(w, "best fixed size: %s\n", rows[best].Size)
	}
}

// writeSweepPlot draws the "auto" runs' limit over time, the slowdown
// shaded.
func writeSweepPlot(path string, s sweep, clients int, rows []sweepRow) error {
	p := loadgen.Plot{Title: fmt.Sprintf("adaptive pool limit, %d clients, %s", clients, s.cfg.Workload)}
	if s.slowWorkers > 0 {
		p.Title += fmt.Sprintf(", %d workers taken (shaded)", s.slowWorkers)
		p.Shade = [][2]time.Duration{{s.slowAt, s.slowAt + s.slowFor}}
	} else if s.slowDelay > 0 {
		p.Title += fmt.Sprintf(", +%v per reply (shaded)", s.slowDelay)
		p.Shade = [][2]time.Duration{{s.slowAt, s.slowAt + s.slowFor}}
	}
	for _, r := range rows {
		if len(r.Limit) > 0 {
			p.Series = append(p.Series, loadgen.PlotSeries{Name: r.Size, Points: r.Limit, Color: loadgen.PlotColors[len(p.Series)%len(loadgen.PlotColors)]})
		}
	}
	if len(p.Series) == 0 {
		return nil
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := p.WritePNG(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
