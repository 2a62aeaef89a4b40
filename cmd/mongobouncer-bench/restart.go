// mongobouncer-bench restart: what an application sees while mongobouncer
// is restarted or upgraded under its load (issue 29 item 9).
//
//	mongobouncer-bench restart -mongobouncer bin/mongobouncer -scenario rolling -uri plain -runs 3
//	mongobouncer-bench restart -mongobouncer bin/mongobouncer -scenario upgrade -tcp-migrate-req 1
//
// rolling: two instances behind HAProxy in TCP mode, health-checked on
// /readyz (as a Kubernetes Service balances pods), each SIGTERMed in turn,
// waited for, started again and waited for until ready. upgrade: one
// address shared with so_reuseport; a new process is started beside the
// running one, waited for until ready, and the old one SIGTERMed. The
// upstream is FerretDB (bin/devmongo); the application is the Go driver
// with its default retry settings (loadgen.StartRestartLoad). Each run
// reports the errors the application saw, the acknowledged writes lost or
// stored twice, the longest time without a successful operation, the
// driver's connections closed, what fresh connections met, and the old
// processes' exit codes; the runs close with their medians.

package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/loadgen"
	"github.com/mongobouncer/mongobouncer/internal/testutil/devmongo"
)

// Scenarios and URI kinds of the restart subcommand.
const (
	scenarioRolling = "rolling"
	scenarioUpgrade = "upgrade"
	uriPlain        = "plain"
	uriLB           = "lb"
)

// restartOpts are the restart subcommand's settings.
type restartOpts struct {
	bin, haproxyBin     string
	scenario, uri       string
	runs, restarts      int
	writers, readers    int
	warmup, settle      time.Duration
	shutdownTimeout     time.Duration
	shutdownDelay       time.Duration
	opTimeout, probeInt time.Duration
	burst               int
	// stuckDir and stuckAfter: where a command unanswered for stuckAfter
	// has the sockets' state dumped (restartstuck.go); "" for nowhere.
	stuckDir   string
	stuckAfter time.Duration
	eventLoop  string    // "", "true" or "false": mongobouncer's event_loop
	log        io.Writer // children's output when -v, else nil
	logger     *slog.Logger
}

// exitInfo is one stopped process.
type exitInfo struct {
	Name string `json:"name"`
	Code int    `json:"exit_code"`
	// Drain is the time from its SIGTERM to its exit.
	Drain  time.Duration `json:"drain_ns"`
	Killed bool          `json:"killed,omitempty"`
}

// restartRun is one run's result.
type restartRun struct {
	Run      int    `json:"run"`
	Scenario string `json:"scenario"`
	URI      string `json:"uri"`
	// Network is where it ran and its tcp_migrate_req.
	Network string `json:"network"`
	// Window is the measured time: from the end of the warm-up to the
	// end of the load.
	Window      time.Duration        `json:"window_ns"`
	OKOps       int                  `json:"ok_ops"`
	ErrorsTotal int                  `json:"errors"`
	Errors      []loadgen.ErrorGroup `json:"error_groups,omitempty"`
	Writes      loadgen.WriteCheck   `json:"writes"`
	Gap         loadgen.Gap          `json:"longest_gap"`
	Conns       loadgen.ConnStats    `json:"driver_connections"`
	Probe       loadgen.DialCounts   `json:"fresh_connections"`
	Exits       []exitInfo           `json:"exits"`
	Error       string               `json:"error,omitempty"`
}

// restartSummary is the medians over the runs that completed.
type restartSummary struct {
	Runs         int           `json:"runs"`
	Errors       int           `json:"errors"`
	Lost         int           `json:"lost"`
	Duplicated   int           `json:"duplicated"`
	AppliedErr   int           `json:"applied_despite_error"`
	Gap          time.Duration `json:"longest_gap_ns"`
	ConnsClosed  int           `json:"driver_connections_closed"`
	PoolCleared  int           `json:"pools_cleared"`
	ProbeFailed  int           `json:"fresh_connections_refused_reset_other"`
	DriverRefRst int           `json:"driver_refused_or_reset"`
	NonZeroExits int           `json:"nonzero_exits_total"`
}

type restartOutput struct {
	Scenario string         `json:"scenario"`
	URI      string         `json:"uri"`
	Binary   string         `json:"mongobouncer"`
	Runs     []restartRun   `json:"runs"`
	Median   restartSummary `json:"median"`
	Error    string         `json:"error,omitempty"`
}

// runRestart is the restart subcommand; args follow "restart".
func runRestart(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("mongobouncer-bench restart", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o restartOpts
	fs.StringVar(&o.bin, "mongobouncer", "", "the mongobouncer `binary` to restart (required)")
	devmongoBin := fs.String("devmongo", "", "the devmongo binary (FerretDB upstream; default: $"+devmongo.EnvBinary+" or bin/devmongo)")
	fs.StringVar(&o.haproxyBin, "haproxy", "", "haproxy binary for -scenario rolling (default: haproxy in PATH, or /usr/sbin/haproxy)")
	fs.StringVar(&o.scenario, "scenario", scenarioRolling, "rolling (two instances behind HAProxy, each restarted in turn) or upgrade (one address, so_reuseport, new process then SIGTERM to the old)")
	fs.StringVar(&o.uri, "uri", uriPlain, "the application's URI: plain, or lb (loadBalanced=true)")
	fs.IntVar(&o.runs, "runs", 3, "runs; the report closes with their medians")
	fs.IntVar(&o.restarts, "restarts", 2, "restarts per run (rolling: instances in turn; upgrade: handovers)")
	fs.IntVar(&o.writers, "writers", loadgen.DefaultRestartWriters, "clients inserting")
	fs.IntVar(&o.readers, "readers", loadgen.DefaultRestartReaders, "clients reading back by _id")
	fs.DurationVar(&o.warmup, "warmup", 3*time.Second, "load before the first restart (not in the gap's window)")
	fs.DurationVar(&o.settle, "settle", 11*time.Second, "load after each restarted instance is ready, before the next step; over the driver's 10 s heartbeat, so that a closed monitoring connection is found in the same step")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 0, "mongobouncer's shutdown_timeout (0: its default, 30s)")
	fs.DurationVar(&o.shutdownDelay, "shutdown-delay", 0, "mongobouncer's shutdown_delay (0: none; behind the balancer, 1s covers its /readyz checks, 500ms apart)")
	fs.DurationVar(&o.opTimeout, "op-timeout", loadgen.DefaultRestartOpTimeout, "each operation's timeout (its context)")
	fs.DurationVar(&o.probeInt, "probe-interval", 10*time.Millisecond, "a fresh connection and hello this often, for refused and reset connections (0: only -probe-burst)")
	fs.IntVar(&o.burst, "probe-burst", 200, "fresh connections (hello) started at once just before each SIGTERM, some of them queued on the listener as it closes (0: none; at most 1000)")
	fs.StringVar(&o.stuckDir, "stuck-dump", "", "a `directory`: a command without a reply after -stuck-after has the state of every TCP socket (ss) and each mongobouncer's /admin/clients written there, to find where a reply waits")
	fs.DurationVar(&o.stuckAfter, "stuck-after", 6*time.Second, "how long a command waits for its reply before -stuck-dump dumps")
	fs.StringVar(&o.eventLoop, "event-loop", "", "mongobouncer's event_loop: true or false (empty: its default)")
	migrate := fs.String("tcp-migrate-req", "host", "host: run in this network namespace as it is; 0 or 1: run in a network namespace of its own (root) with net.ipv4.tcp_migrate_req set so")
	timeout := fs.Duration("timeout", 15*time.Minute, "bound on the whole measurement")
	asJSON := fs.Bool("json", false, "print the results as JSON on stdout (the table then goes to stderr)")
	verbose := fs.Bool("v", false, "log progress and the children's output to stderr")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: mongobouncer-bench restart -mongobouncer BINARY [-scenario rolling|upgrade] [-uri plain|lb] [-runs N] [flags]\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "mongobouncer-bench restart: "+format+"\n", a...)
		return 2
	}
	switch {
	case fs.NArg() > 0:
		return usage("unexpected arguments %q", fs.Args())
	case o.bin == "":
		return usage("-mongobouncer BINARY is required")
	case o.scenario != scenarioRolling && o.scenario != scenarioUpgrade:
		return usage("-scenario: %q, want rolling or upgrade", o.scenario)
	case o.uri != uriPlain && o.uri != uriLB:
		return usage("-uri: %q, want plain or lb", o.uri)
	case o.runs < 1 || o.runs > 100 || o.restarts < 1 || o.restarts > 100:
		return usage("-runs and -restarts must be 1 to 100")
	case o.writers < 1 || o.readers < 0 || o.writers+o.readers > 1000:
		return usage("-writers must be at least 1, and -writers + -readers at most 1000")
	case o.burst < 0 || o.burst > 1000:
		return usage("-probe-burst must be 0 to 1000")
	case o.eventLoop != "" && o.eventLoop != "true" && o.eventLoop != "false":
		return usage("-event-loop: %q, want true or false", o.eventLoop)
	case *migrate != "host" && *migrate != "0" && *migrate != "1":
		return usage("-tcp-migrate-req: %q, want host, 0 or 1", *migrate)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	if *migrate != "host" && os.Getenv(netnsEnv) == "" {
		code, err := reexecInNetns(ctx, args, *migrate, stdout, stderr)
		if err != nil {
			fmt.Fprintf(stderr, "mongobouncer-bench restart: %v\n", err)
			return 1
		}
		return code
	}
	if m := os.Getenv(netnsEnv); m != "" {
		if err := enterNetns(m); err != nil {
			fmt.Fprintf(stderr, "mongobouncer-bench restart: network namespace: %v\n", err)
			return 1
		}
	}
	if *devmongoBin != "" {
		os.Setenv(devmongo.EnvBinary, *devmongoBin)
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelInfo
		o.log = stderr
	}
	o.logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	if _, err := loadgen.RaiseFileLimit(); err != nil {
		o.logger.Warn("could not raise the open-file limit", "err", err)
	}
	table := stdout
	if *asJSON {
		table = stderr
	}
	out := restartOutput{Scenario: o.scenario, URI: o.uri, Binary: o.bin}
	err := measureRestarts(ctx, o, &out, table)
	if err != nil {
		out.Error = err.Error()
		fmt.Fprintf(stderr, "mongobouncer-bench restart: %v\n", err)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if jerr := enc.Encode(out); jerr != nil {
			return 1
		}
	}
	if err != nil {
		return 1
	}
	return 0
}

// measureRestarts starts devmongo, runs o.runs runs against it, prints
// each and the medians on table, and fills out.
func measureRestarts(ctx context.Context, o restartOpts, out *restartOutput, table io.Writer) error {
	dm, err := devmongo.StartMain()
	if err != nil {
		return fmt.Errorf("devmongo: %w", err)
	}
	defer func() {
		if err := dm.Stop(); err != nil {
			o.logger.Warn("devmongo stop", "err", err)
		}
	}()
	fmt.Fprintf(table, "restart measurement: %s scenario, %s URI, %d runs, %d restarts each, %d writers + %d readers, mongobouncer %s, upstream devmongo %s, %s\n",
		o.scenario, o.uri, o.runs, o.restarts, o.writers, o.readers, o.bin, dm.Addr(), migrateSetting())
	for i := 1; i <= o.runs; i++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r := oneRun(ctx, o, dm, i)
		out.Runs = append(out.Runs, r)
		printRun(table, r)
	}
	out.Median = summarize(out.Runs)
	printSummary(table, o, out.Median)
	for _, r := range out.Runs {
		if r.Error != "" {
			return fmt.Errorf("run %d: %s", r.Run, r.Error)
		}
	}
	return nil
}

// oneRun sets up the scenario's processes in a temporary directory, runs
// the load through them, restarts them, and tears everything down.
func oneRun(ctx context.Context, o restartOpts, dm *devmongo.Server, n int) restartRun {
	r := restartRun{Run: n, Scenario: o.scenario, URI: o.uri, Network: migrateSetting()}
	dir, err := os.MkdirTemp("", "mongobouncer-restart-")
	if err != nil {
		r.Error = err.Error()
		return r
	}
	defer os.RemoveAll(dir)
	var sc scenario
	if o.scenario == scenarioRolling {
		sc, err = startRolling(ctx, o, dir, dm.URI())
	} else {
		sc, err = startUpgrade(ctx, o, dir, dm.URI())
	}
	if err != nil {
		r.Error = err.Error()
		return r
	}
	defer sc.close()

	uri := "mongodb://" + sc.address() + "/"
	if o.uri == uriLB {
		uri += "?loadBalanced=true"
	}
	coll := fmt.Sprintf("restart_%d_%d", n, time.Now().UnixNano())
	start := time.Now()
	ledger := loadgen.NewLedger(start)
	load, err := loadgen.StartRestartLoad(ctx, loadgen.RestartLoadConfig{URI: uri, Writers: o.writers, Readers: o.readers,
		OpTimeout: o.opTimeout, Database: "bench", Collection: coll, Logger: o.logger,
		OnStuck: stuckDumper(o, sc), StuckAfter: o.stuckAfter}, ledger)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	probe := loadgen.StartDialProbe(ctx, sc.address(), o.probeInt)
	beforeTerm := func() {
		probe.Burst(o.burst)
		ledger.Signal(time.Now())
	}
	sleepCtx(ctx, o.warmup)
	from := ledger.Since(time.Now())
	for i := range o.restarts {
		if ctx.Err() != nil {
			break
		}
		o.logger.Info("restart", "step", i+1, "of", o.restarts)
		ex, err := sc.restart(ctx, i, beforeTerm)
		if ex.Name != "" {
			r.Exits = append(r.Exits, ex)
		}
		if err != nil {
			r.Error = err.Error()
			break
		}
		sleepCtx(ctx, o.settle)
	}
	to := ledger.Since(time.Now())
	r.Probe = probe.Stop()
	r.Conns = load.Stop()
	snap := ledger.Snapshot()
	r.Window = to - from
	r.OKOps = len(snap.Successes)
	r.ErrorsTotal = len(snap.Errors)
	r.Errors = loadgen.GroupErrors(snap.Errors, snap.Signals)
	r.Gap = loadgen.LongestGap(snap.Successes, from, to, snap.Signals)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	stored, err := loadgen.ReadBackWrites(rctx, dm.URI(), "bench", coll)
	if err != nil && r.Error == "" {
		r.Error = err.Error()
	}
	r.Writes = loadgen.CheckWrites(snap.Acked, snap.Failed, snap.Cut, stored)
	return r
}

// sleepCtx sleeps for d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// summarize takes the medians over the runs without a set-up error.
func summarize(runs []restartRun) restartSummary {
	var errs, lost, dup, applied, closed, cleared, probe, drv, nonzero []int
	var gaps []time.Duration
	for _, r := range runs {
		if r.Error != "" {
			continue
		}
		errs = append(errs, r.ErrorsTotal)
		lost = append(lost, r.Writes.Lost)
		dup = append(dup, r.Writes.Duplicated)
		applied = append(applied, r.Writes.AppliedDespiteError)
		closed = append(closed, r.Conns.ClosedTotal)
		cleared = append(cleared, r.Conns.PoolCleared)
		probe = append(probe, r.Probe.Failed())
		drv = append(drv, r.Conns.Refused+r.Conns.Reset)
		gaps = append(gaps, r.Gap.Length)
		nz := 0
		for _, e := range r.Exits {
			if e.Code != 0 {
				nz++
			}
		}
		nonzero = append(nonzero, nz)
	}
	return restartSummary{Runs: len(errs), Errors: loadgen.Median(errs), Lost: loadgen.Median(lost),
		Duplicated: loadgen.Median(dup), AppliedErr: loadgen.Median(applied), Gap: loadgen.Median(gaps),
		ConnsClosed: loadgen.Median(closed), PoolCleared: loadgen.Median(cleared), ProbeFailed: loadgen.Median(probe),
		DriverRefRst: loadgen.Median(drv), NonZeroExits: loadgen.Median(nonzero)}
}

// printRun prints one run, readable.
func printRun(w io.Writer, r restartRun) {
	fmt.Fprintf(w, "\nrun %d (%s, %s URI, %s): %.1f s measured, %d successful operations\n",
		r.Run, r.Scenario, r.URI, r.Network, r.Window.Seconds(), r.OKOps)
	if r.Error != "" {
		fmt.Fprintf(w, "  FAILED: %s\n", r.Error)
		if r.OKOps == 0 && len(r.Exits) == 0 {
			return // failed before the load: nothing measured
		}
	}
	fmt.Fprintf(w, "  application errors: %d\n", r.ErrorsTotal)
	for _, g := range r.Errors {
		fmt.Fprintf(w, "    %5d x %s   (%+d to %+d ms from the nearest SIGTERM)\n", g.Count, g.Text,
			g.FirstOffset.Milliseconds(), g.LastOffset.Milliseconds())
	}
	c := r.Writes
	fmt.Fprintf(w, "  writes: %d acknowledged, %d failed, %d stored; lost %d, duplicated %d, applied despite an error %d, unexpected %d\n",
		c.Acked, c.Failed, c.Stored, c.Lost, c.Duplicated, c.AppliedDespiteError, c.Unexpected)
	fmt.Fprintf(w, "  longest gap without a successful operation: %.3f s (starting %+d ms from the nearest SIGTERM)\n",
		r.Gap.Length.Seconds(), r.Gap.Start.Milliseconds())
	k := r.Conns
	fmt.Fprintf(w, "  driver connections: %d created, %d closed %s, %d pool clears, %d heartbeats failed, %d refused, %d reset\n",
		k.Created, k.ClosedTotal, reasons(k.Closed), k.PoolCleared, k.HeartbeatFailed, k.Refused, k.Reset)
	if len(k.CommandsFailed) > 0 {
		fmt.Fprintf(w, "  commands failed on the wire (retried by the driver or among the errors above):\n")
		keys := slices.Sorted(maps.Keys(k.CommandsFailed))
		for _, t := range keys {
			fmt.Fprintf(w, "    %5d x %s\n", k.CommandsFailed[t], t)
		}
	}
	if len(k.CheckOutFailed) > 0 {
		fmt.Fprintf(w, "  driver check-outs failed: %s\n", reasons(k.CheckOutFailed))
	}
	p := r.Probe
	fmt.Fprintf(w, "  fresh connections (hello): %d ok, %d ShutdownInProgress, %d refused, %d reset, %d other%s\n",
		p.OK, p.ShutdownInProgress, p.Refused, p.Reset, p.Other, firstOther(p.FirstOther))
	var exits []string
	for _, e := range r.Exits {
		s := fmt.Sprintf("%s exit %d after %.2f s", e.Name, e.Code, e.Drain.Seconds())
		if e.Killed {
			s += " (killed)"
		}
		exits = append(exits, s)
	}
	fmt.Fprintf(w, "  stopped: %s\n", strings.Join(exits, "; "))
}

func firstOther(s string) string {
	if s == "" {
		return ""
	}
	return " (first other: " + s + ")"
}

// reasons prints a by-reason count map in a stable order.
func reasons(m map[string]int) string {
	if len(m) == 0 {
		return "()"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// printSummary prints the medians as one table row.
func printSummary(w io.Writer, o restartOpts, s restartSummary) {
	if s.Runs == 0 {
		fmt.Fprintf(w, "\nno run completed: no medians\n")
		return
	}
	fmt.Fprintf(w, "\nmedian of %d runs:\n", s.Runs)
	fmt.Fprintf(w, "| scenario | URI | errors | lost | duplicated | applied despite error | longest gap | driver conns closed | pool clears | fresh conns refused/reset/other | driver refused/reset | non-zero exits |\n")
	fmt.Fprintf(w, "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	fmt.Fprintf(w, "| %s | %s | %d | %d | %d | %d | %.2f s | %d | %d | %d | %d | %d |\n", o.scenario, o.uri, s.Errors, s.Lost,
		s.Duplicated, s.AppliedErr, s.Gap.Seconds(), s.ConnsClosed, s.PoolCleared, s.ProbeFailed, s.DriverRefRst, s.NonZeroExits)
}
