// Command mongobouncer-demo runs mongobouncer for real on this machine and
// shows, side by side, what it changes: it starts the embedded FerretDB dev
// server, mongobouncer in front of it with a small pool, and HAProxy (a
// plain TCP relay, when installed) in front of it too; then it drives the
// same driver workload (80 % findOne by _id, 20 % insertOne) directly, through
// mongobouncer and through HAProxy, at 100 clients and at 10, and prints for
// each the client and upstream connections, ops/s, p50 and p99. Every run
// is bounded; the whole demo takes about a minute and a quarter.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/loadgen"
	"github.com/mongobouncer/mongobouncer/internal/testutil/devmongo"
)

func main() {
	args, err := parseArgs(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mongobouncer-demo:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = run(ctx, args, os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}

// demoArgs are the demo's settings.
type demoArgs struct {
	bin      string
	clients  []int
	pool     int
	duration time.Duration
	warmup   time.Duration
	mode     string
	haproxy  string
	// noHAProxy leaves HAProxy out even where it is installed.
	noHAProxy bool
}

// Bounds of the demo's settings: it must stay a demo.
const (
	maxDemoClients  = 1000
	minDemoDuration = 2 * time.Second
	maxDemoDuration = 60 * time.Second
)

// parseArgs parses and checks the command line.
func parseArgs(args []string, stderr io.Writer) (demoArgs, error) {
	fs := flag.NewFlagSet("mongobouncer-demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var a demoArgs
	fs.StringVar(&a.bin, "mongobouncer", "bin/mongobouncer", "mongobouncer binary")
	clients := fs.String("clients", "100,10", "driver clients of each round, comma-separated: each count runs direct, through mongobouncer and through HAProxy")
	fs.IntVar(&a.pool, "pool", 10, "mongobouncer max_pool_size")
	fs.DurationVar(&a.duration, "duration", 6*time.Second, "length of each run, warm-up included (each target runs twice per client count)")
	fs.StringVar(&a.mode, "pool-mode", "transaction", "mongobouncer pool mode (session, transaction or statement)")
	fs.StringVar(&a.haproxy, "haproxy", "", "haproxy binary (default: haproxy in PATH, or /usr/sbin/haproxy)")
	fs.BoolVar(&a.noHAProxy, "no-haproxy", false, "leave HAProxy out")
	if err := fs.Parse(args); err != nil {
		return a, err
	}
	if fs.NArg() > 0 {
		return a, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for part := range strings.SplitSeq(*clients, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(part))
		if err != nil || n < 1 || n > maxDemoClients {
			return a, fmt.Errorf("-clients: %q is not a count in [1, %d]", part, maxDemoClients)
		}
		a.clients = append(a.clients, n)
	}
	switch {
	case a.pool < 1:
		return a, fmt.Errorf("-pool %d: must be at least 1", a.pool)
	case a.duration < minDemoDuration || a.duration > maxDemoDuration:
		return a, fmt.Errorf("-duration %v: must be in [%v, %v]", a.duration, minDemoDuration, maxDemoDuration)
	case !slices.Contains([]string{"session", "transaction", "statement"}, a.mode):
		return a, fmt.Errorf("-pool-mode %q: want session, transaction or statement", a.mode)
	}
	// A quarter of each run warms up (connections, FerretDB's caches) and
	// is left out of the figures.
	a.warmup = a.duration / 4
	return a, nil
}

// demoTarget is one way to reach devmongo: directly, through mongobouncer
// or through HAProxy.
type demoTarget struct {
	name string
	addr string
	// pid holds the upstream connections (0: the demo itself, direct).
	pid int
}

// result is one run's figures.
type result struct {
	target   demoTarget
	res      loadgen.Result
	err      error
	clientsN int
	upN      int
}

func run(ctx context.Context, a demoArgs, w io.Writer) error {
	fmt.Fprintln(w, "== starting devmongo (embedded FerretDB, SQLite) ...")
	dm, err := devmongo.StartMain()
	if err != nil {
		return fmt.Errorf("devmongo: %w", err)
	}
	defer dm.Stop()
	fmt.Fprintln(w, "   devmongo listening on", dm.Addr())

	listen, err := freeAddr()
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "== starting mongobouncer on %s (pool_mode=%s, max_pool_size=%d) ...\n", listen, a.mode, a.pool)
	cmd := exec.Command(a.bin, "--listen", listen, "--upstream", "mongodb://"+dm.Addr()+"/",
		"--pool-mode", a.mode, "--max-pool-size", strconv.Itoa(a.pool), "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = w, os.Stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start mongobouncer: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	defer func() {
		if !stopped {
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	if err := waitListening(listen, 10*time.Second, exited); err != nil {
		return err
	}
	targets := []demoTarget{
		{name: "direct", addr: dm.Addr()},
		{name: fmt.Sprintf("mongobouncer (pool of %d)", a.pool), addr: listen, pid: cmd.Process.Pid},
	}
	if !a.noHAProxy {
		h, err := loadgen.StartHAProxy(ctx, loadgen.HAProxyOptions{Binary: a.haproxy, Upstream: dm.Addr()})
		switch {
		case errors.Is(err, loadgen.ErrNoHAProxy):
			fmt.Fprintln(w, "   HAProxy is not installed: its column is skipped (as root: make haproxy)")
		case err != nil:
			fmt.Fprintln(w, "   HAProxy did not start, its column is skipped:", err)
		default:
			defer h.Stop()
			fmt.Fprintf(w, "== started HAProxy on %s (TCP mode, one upstream connection per client)\n", h.Addr())
			targets = append(targets, demoTarget{name: "HAProxy (TCP relay)", addr: h.Addr(), pid: h.PID()})
		}
	}

	_, dmPortS, _ := net.SplitHostPort(dm.Addr())
	dmPort, _ := strconv.Atoi(dmPortS)
	// A first, unreported run against devmongo: a cold FerretDB (SQLite
	// pages, query plans) would otherwise slow whichever target runs first.
	fmt.Fprintf(w, "== warming devmongo up (%v, not reported) ...\n", a.warmup)
	warm := a
	warm.duration, warm.warmup = a.warmup, 0
	_ = measure(ctx, warm, targets[0], a.clients[0], dmPort)
	var failures []string
	for i, n := range a.clients {
		fmt.Fprintf(w, "\n== %d driver clients, 80 %% findOne by _id / 20 %% insertOne, %d runs of %v per target in mirrored orders (first %v of each left out) ...\n",
			n, passes, a.duration, a.warmup)
		rows := make([]result, len(targets))
		ran := make([]bool, len(targets))
		for _, j := range runOrder(len(targets), i) {
			r := measure(ctx, a, targets[j], n, dmPort)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if ran[j] {
				rows[j].merge(r)
			} else {
				rows[j], ran[j] = r, true
			}
		}
		writeTable(w, rows)
		failures = append(failures, check(a, rows)...)
	}

	fmt.Fprintln(w, "\n== stopping mongobouncer (SIGTERM) ...")
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		stopped = true
		if err != nil {
			return fmt.Errorf("mongobouncer exited: %w", err)
		}
		fmt.Fprintln(w, "   mongobouncer exited cleanly")
	case <-time.After(40 * time.Second):
		return errors.New("mongobouncer did not stop within 40s")
	}
	if len(failures) > 0 {
		return errors.New(strings.Join(failures, "; "))
	}
	return nil
}

// passes is how many times each target runs at each client count.
const passes = 2

// runOrder is the order in which the targets run at the i-th client count:
// each target twice, in an order and then in its mirror (direct,
// mongobouncer, HAProxy, HAProxy, mongobouncer, direct), the first order
// reversed at every other count. FerretDB's speed here drifts by a factor
// of two within a minute, and whichever target ran last in a block gained
// the most from it: with one pass per target, direct ran first at 100
// clients and last at 10, and its ratios moved with that. Mirrored passes
// give every target the same mean position, which cancels a steady drift.
func runOrder(targets, i int) []int {
	out := make([]int, 0, passes*targets)
	for k := range targets {
		if i%2 == 1 {
			k = targets - 1 - k
		}
		out = append(out, k)
	}
	for k := targets - 1; k >= 0; k-- {
		out = append(out, out[k])
	}
	return out
}

// measure runs the workload against t with n clients, counting the
// demo's connections to t and t's connections to devmongo during the
// measured window (after the warm-up, before the run's end).
func measure(ctx context.Context, a demoArgs, t demoTarget, n, dmPort int) result {
	_, portS, _ := net.SplitHostPort(t.addr)
	port, _ := strconv.Atoi(portS)
	clientSampler := startConnSampler(0, port)
	upSampler := startConnSampler(t.pid, dmPort)
	rctx, cancel := context.WithTimeout(ctx, a.duration+time.Minute)
	defer cancel()
	res, err := loadgen.Run(rctx, t.addr, loadgen.Config{
		Workload:    loadgen.WorkloadFindInsert,
		Clients:     n,
		Duration:    a.duration,
		Warmup:      a.warmup,
		MaxOps:      50_000_000,
		MaxPoolSize: uint64(n),
		// FerretDB's tail under 100 clients reaches seconds: an operation
		// is a slow success, not a timeout, up to the run's end.
		OpTimeout: 30 * time.Second,
		Database:  "demo",
	})
	from, to := res.Start.Add(a.warmup), res.Start.Add(a.duration)
	return result{target: t, res: res, err: err, clientsN: clientSampler.stop(from, to), upN: upSampler.stop(from, to)}
}

// merge adds another run of the same target: its figures add up (see
// loadgen.Result.Merge), and the connection counts are the larger of the
// two, which the check holds to the pool's bound.
func (r *result) merge(o result) {
	r.res.Merge(&o.res)
	if r.err == nil {
		r.err = o.err
	}
	r.clientsN = max(r.clientsN, o.clientsN)
	r.upN = max(r.upN, o.upN)
}

// writeTable prints one row per target, ratios against the first (direct).
func writeTable(w io.Writer, rows []result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "target\tclient conns\tupstream conns\tops/s\t×direct\tp50\tp99\terrors\t")
	base := rows[0].res.OpsPerSec
	for _, r := range rows {
		ratio := "-"
		if base > 0 {
			ratio = fmt.Sprintf("%.2f", r.res.OpsPerSec/base)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%s\t%s\t%s\t%d\t\n", r.target.name, r.clientsN, r.upN, r.res.OpsPerSec, ratio,
			fmtLatency(r.res.Latency.P50), fmtLatency(r.res.Latency.P99), r.res.Errors)
	}
	_ = tw.Flush()
	for _, r := range rows {
		if r.err != nil {
			fmt.Fprintf(w, "   %s: %v\n", r.target.name, r.err)
		}
		for _, e := range r.res.ErrorSamples {
			fmt.Fprintf(w, "   %s error: %s\n", r.target.name, e)
		}
	}
	if len(rows) > 1 && base > 0 && rows[1].res.OpsPerSec > 0 {
		d, m := rows[0], rows[1]
		fmt.Fprintf(w, "   mongobouncer served %d client connections over %d upstream ones: %.2f× direct throughput, p99 %s against %s direct.\n",
			m.clientsN, m.upN, m.res.OpsPerSec/base, fmtLatency(m.res.Latency.P99), fmtLatency(d.res.Latency.P99))
	}
}

// check returns what makes the demo fail: errors or a failed run through
// mongobouncer, or more upstream connections than its pool and monitoring
// allow. Direct and HAProxy rows are shown, not judged.
func check(a demoArgs, rows []result) []string {
	var out []string
	if len(rows) < 2 {
		return nil
	}
	m := rows[1]
	// The pool, plus a server's two monitoring connections.
	if m.upN > a.pool+2 {
		out = append(out, fmt.Sprintf("%s held %d upstream connections, more than its pool of %d and 2 monitoring", m.target.name, m.upN, a.pool))
	}
	if m.err != nil || m.res.Errors > 0 || m.res.Ops == 0 {
		out = append(out, fmt.Sprintf("%s: %d operations, %d errors, %v", m.target.name, m.res.Ops, m.res.Errors, m.err))
	}
	return out
}

// fmtLatency prints a latency in ms, or s from one second.
func fmtLatency(d time.Duration) string {
	if d >= time.Second {
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
	return fmt.Sprintf("%.1f ms", float64(d)/1e6)
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func waitListening(addr string, d time.Duration, exited <-chan error) error {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return fmt.Errorf("mongobouncer exited early: %v", err)
		default:
		}
		if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("mongobouncer not listening on %s after %v", addr, d)
}
