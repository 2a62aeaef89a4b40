// Command mongobouncer-bench measures mongobouncer against a direct
// connection, side by side in one run, and reports ratios (proxied/direct
// throughput, added latency), which are what mean something on a small,
// noisy machine. It can also measure what an idle client connection costs
// the proxy process.
//
//	mongobouncer-bench -direct 127.0.0.1:27017 -proxied 127.0.0.1:27018 -workload ping -clients 16
//	mongobouncer-bench -proxied 127.0.0.1:27018 -idle 5000 -pid $(pidof mongobouncer)
//	mongobouncer-bench -spawn bin/mongobouncer -clients 100 -idle 10000
//	mongobouncer-bench -spawn bin/mongobouncer -ref haproxy,relay-epoll -clients 1,10,100,1000
//	mongobouncer-bench -spawn bin/mongobouncer -idle 1000,5000,10000,19000 -idle-repeat 3
//	mongobouncer-bench restart -mongobouncer bin/mongobouncer -scenario rolling|upgrade -uri plain|lb -runs 3
//	mongobouncer-bench -sweep 2,4,8,16,32,64,auto -bouncer bin/mongobouncer -upstream 127.0.0.1:27017 \
//	    -workload find-insert -clients 10,100,1000 -slow-delay 5ms -slow-at 10s -slow-for 10s -plot limit.png
//	mongobouncer-bench -sweep 8,16,auto,auto-gradient2 -bouncer bin/mongobouncer -auto-bin gradient2=/tmp/mb-g2 \
//	    -model 8,5ms,0.3 -clients 100 -slow-workers 6 -slow-at 10s -slow-for 10s
//
// With -sweep, the tool starts one mongobouncer per pool size in turn
// (fixed sizes and "auto"), each in front of -upstream through a relay of
// its own that can slow every reply down for part of the run, measures
// the workload through it, and prints each size's throughput and p99
// against the best fixed size's; for "auto" it records the adaptive limit
// from mongobouncer's /metrics and draws it over time as a PNG (-plot).
// -model replaces -upstream with fakemongo's capacity model in this
// process (k workers of a fixed service time), where the right size is
// known; -auto-bin adds builds whose "auto" uses another algorithm.
//
// With -spawn, the tool starts a fast fake upstream (this binary again, in
// a process of its own) and the given mongobouncer binary in front of it,
// compares the two, probes the idle cost against that mongobouncer's PID,
// and stops both. -ref adds references in front of the same upstream
// (-direct), each compared with direct traffic in the same run: HAProxy in
// TCP mode (started here on a configuration written here) and the
// project's copy-only relays. With several -clients counts a summary table
// closes the output.
//
// The restart subcommand (restart.go) measures what an application sees
// while mongobouncer instances are restarted under its load, or upgraded
// in place.
//
// The logic lives in internal/loadgen; this is flag parsing and printing.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/loadgen"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

func main() {
	if len(os.Args) == 2 && os.Args[1] == fakeUpstreamFlag {
		os.Exit(serveFake())
	}
	if len(os.Args) == 4 && os.Args[1] == relayFlag {
		os.Exit(serveRelay(os.Args[2], os.Args[3]))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// output is what -json prints.
type output struct {
	// Compare is mongobouncer's comparison at the first -clients count.
	Compare *loadgen.Report `json:"compare,omitempty"`
	// Idle is the last idle probe (-idle); IdleRuns has every one.
	Idle *loadgen.IdleReport `json:"idle,omitempty"`
	// IdleRuns are every idle probe, by count and repetition.
	IdleRuns []loadgen.IdleReport `json:"idle_runs,omitempty"`
	// CPUPerOp is the spawned mongobouncer's CPU time per proxied
	// operation at the first -clients count, warm-up included (-spawn
	// only; Compare.Proxied.CPU has every process's).
	CPUPerOp time.Duration `json:"cpu_per_op_ns,omitempty"`
	// References are the references' comparisons at the first -clients
	// count.
	References []reference `json:"references,omitempty"`
	// Series has every comparison, by client count and target.
	Series []seriesEntry `json:"series,omitempty"`
	// Sweep has every run of -sweep, by client count and pool size.
	Sweep []sweepRow `json:"sweep,omitempty"`
	Error string     `json:"error,omitempty"`
}

// reference is one reference's comparison with direct traffic.
type reference struct {
	// Relay names the reference: "haproxy" or a relay kind.
	Relay   loadgen.RelayKind `json:"relay"`
	Compare *loadgen.Report   `json:"compare"`
}

// seriesEntry is one target's comparison at one client count.
type seriesEntry struct {
	Clients int             `json:"clients"`
	Target  string          `json:"target"`
	Compare *loadgen.Report `json:"compare"`
}

// run parses args, runs what they ask for and returns the exit status:
// 0 on success, 1 when a measurement failed, 2 on bad usage.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "restart" {
		return runRestart(ctx, args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("mongobouncer-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg        loadgen.Config
		direct     = fs.String("direct", "", "address of the server without the proxy (host:port; a mongodb:// URI for -workload driver)")
		proxied    = fs.String("proxied", "", "address of mongobouncer in front of the same server")
		clientsArg = fs.String("clients", strconv.Itoa(loadgen.DefaultClients), "concurrent clients; a comma-separated list (1,10,100,1000) measures each count in turn and closes with a summary table; 0: no comparison")
		idleArg    = fs.String("idle", "0", "open this many idle client connections to -proxied and report the RSS growth of -pid; a comma-separated list probes each count (0: skip)")
		idleRepeat = fs.Int("idle-repeat", 1, "probe each -idle count this many times and report the median per client")
		pid        = fs.Int("pid", 0, "process whose RSS the -idle probe measures (the proxy)")
		settle     = fs.Duration("settle", loadgen.DefaultIdleSettle, "how long idle connections sit before RSS is read again")
		sources    = fs.String("source", loadgen.DefaultSourceAddrs, "local addresses the ping and idle connections come from, round-robin, when the target is a loopback IP (a range FIRST-LAST or a list; \"\": the kernel picks): one address holds at most ~28,000 connections to one port")
		asJSON     = fs.Bool("json", false, "print the results as JSON on stdout (the table then goes to stderr)")
		verbose    = fs.Bool("v", false, "log progress to stderr")
		maxOps     = fs.Int64("max-ops", loadgen.DefaultMaxOps, "maximum operations per run (each side of each round)")
		poolSize   = fs.Uint64("pool", loadgen.DefaultMaxPoolSize, "driver maxPoolSize (-workload driver)")
		spawnBin   = fs.String("spawn", "", "start a fake upstream here and this mongobouncer `binary` in front of it, and measure them")
		bPool      = fs.Int("bouncer-pool", 100, "max_pool_size of the spawned mongobouncer (its default)")
		bMode      = fs.String("bouncer-mode", "transaction", "pool_mode of the spawned mongobouncer (its default)")
		bLoop      = fs.Bool("bouncer-event-loop", true, "run the spawned mongobouncer with --event-loop=true (its default on Linux) or false")
		refsArg    = fs.String("ref", "", "references to measure beside mongobouncer, in front of -direct, each in a process of its own: a comma-separated list of haproxy (Debian's HAProxy in TCP mode; skipped with a message when not installed), relay-goroutine, relay-epoll, relay-uring, or relays (every project relay)")
		refsAll    = fs.Bool("reference", false, "shorthand for -ref relays: the project's copy-only relays, the floor of what relaying costs on this machine")
		haproxyBin = fs.String("haproxy", "", "haproxy binary for -ref haproxy (default: haproxy in PATH, or /usr/sbin/haproxy)")
		sweepArg   = fs.String("sweep", "", "pool sizes to sweep, comma-separated, \"auto\" included (2,4,8,16,32,64,auto): one mongobouncer (-bouncer) per size in front of -upstream, at each -clients count")
		sweepBin   = fs.String("bouncer", "", "mongobouncer `binary` that -sweep starts")
		upstream   = fs.String("upstream", "", "host:port of the upstream -sweep measures against (FerretDB)")
		slowDelay  = fs.Duration("slow-delay", 0, "-sweep: hold every upstream reply back this long from -slow-at for -slow-for (0: no slowdown)")
		slowAt     = fs.Duration("slow-at", 0, "-sweep: when the slowdown starts, from each run's start")
		slowFor    = fs.Duration("slow-for", 0, "-sweep: how long the slowdown lasts")
		plotPath   = fs.String("plot", "", "-sweep: write the adaptive limit over time to this PNG (suffixed -N per client count when there are several)")
		rotate     = fs.Int("sweep-rotate", 0, "-sweep: start the size order at this index, so that repeated runs alternate which size goes first")
		reverse    = fs.Bool("sweep-reverse", false, "-sweep: run the (rotated) size order backwards; a run and its reverse put every size at the same mean place, so a drift over the run (FerretDB's) falls on all alike")
		pause      = fs.Duration("sweep-pause", 5*time.Second, "-sweep: idle time before each size, so that the upstream has finished the last size's queued work")
		modelArg   = fs.String("model", "", "-sweep against a capacity model in this process instead of -upstream: WORKERS,SERVICE[,CONTENTION] (8,5ms,0.3: 8 commands served at once, 5 ms each, each 30 % slower per 8 commands beyond 8 in the server)")
		slowWork   = fs.Int("slow-workers", 0, "-sweep -model: the other slowdown, a background job taking this many of the model's workers from -slow-at for -slow-for")
		autoBinArg = fs.String("auto-bin", "", "-sweep: NAME=PATH,... mongobouncer builds for sizes auto-NAME (another limiter algorithm, linked in with -ldflags -X)")
		scrape     = fs.Duration("scrape", 250*time.Millisecond, "-sweep: how often the adaptive limit is read from /metrics")
	)
	fs.StringVar(&cfg.Workload, "workload", loadgen.WorkloadPing, "ping (raw OP_MSG, one connection per client), driver (insert/find/update through the Go driver) or find-insert (80 % findOne by _id, 20 % insertOne, through the Go driver)")
	fs.DurationVar(&cfg.Duration, "duration", loadgen.DefaultDuration, "length of each run (each side of each round), warm-up included")
	fs.DurationVar(&cfg.Warmup, "warmup", 200*time.Millisecond, "leading part of each run excluded from the figures")
	fs.IntVar(&cfg.Rounds, "rounds", loadgen.DefaultRounds, "direct+proxied round pairs, alternated to cancel machine noise")
	fs.DurationVar(&cfg.OpTimeout, "op-timeout", loadgen.DefaultOpTimeout, "timeout of each operation")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: mongobouncer-bench -direct ADDR -proxied ADDR [flags]\n"+
			"       mongobouncer-bench -proxied ADDR -idle K -pid PID [flags]\n"+
			"       mongobouncer-bench -spawn BINARY [-ref haproxy,relays] [flags]\n"+
			"       mongobouncer-bench restart -mongobouncer BINARY [-scenario rolling|upgrade] [-uri plain|lb] [flags] (restart -h)\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	usage := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "mongobouncer-bench: "+format+"\n", a...)
		return 2
	}
	clientCounts, err := parseCounts(*clientsArg)
	if err != nil {
		return usage("-clients: %v", err)
	}
	if *sweepArg != "" {
		sizes, err := parseSizes(*sweepArg)
		switch {
		case err != nil:
			return usage("-sweep: %v", err)
		case *sweepBin == "" || (*upstream == "") == (*modelArg == ""):
			return usage("-sweep needs -bouncer and one of -upstream and -model")
		case (*slowDelay > 0 || *slowWork > 0) && (*slowFor <= 0 || *slowAt+*slowFor > cfg.Duration):
			return usage("-slow-delay and -slow-workers need -slow-for > 0 and the slowdown within -duration")
		case *slowWork > 0 && *modelArg == "":
			return usage("-slow-workers needs -model")
		}
		autoBins, err := parseAutoBins(*autoBinArg)
		if err != nil {
			return usage("-auto-bin: %v", err)
		}
		var model *fakemongo.Server
		if *modelArg != "" {
			c, err := parseModel(*modelArg)
			if err != nil {
				return usage("-model: %v", err)
			}
			m, err := startModel(c)
			if err != nil {
				fmt.Fprintf(stderr, "mongobouncer-bench: %v\n", err)
				return 1
			}
			defer m.Close()
			*upstream, model = m.Addr(), m
		}
		level := slog.LevelWarn
		if *verbose {
			level = slog.LevelInfo
		}
		cfg.MaxOps, cfg.MaxPoolSize = *maxOps, *poolSize
		cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
		if _, err := loadgen.RaiseFileLimit(); err != nil {
			cfg.Logger.Warn("could not raise the open-file limit", "err", err)
		}
		table := stdout
		if *asJSON {
			table = stderr
		}
		var out output
		out.Sweep, err = runSweep(ctx, sweep{cfg: cfg, counts: slices.DeleteFunc(clientCounts, func(n int) bool { return n == 0 }),
			sizes: sizes, bin: *sweepBin, autoBins: autoBins, model: model, slowWorkers: *slowWork, upstream: *upstream, mode: *bMode, loop: *bLoop, slowDelay: *slowDelay,
			slowAt: *slowAt, slowFor: *slowFor, plot: *plotPath, rotate: *rotate, reverse: *reverse, pause: *pause, scrape: *scrape}, table)
		if err != nil {
			out.Error = err.Error()
			fmt.Fprintf(stderr, "mongobouncer-bench: %v\n", err)
		}
		if *asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			_ = enc.Encode(out)
		}
		if err != nil {
			return 1
		}
		return 0
	}
	// -clients 0: no comparison (with -spawn, an idle probe alone).
	clientCounts = slices.DeleteFunc(clientCounts, func(n int) bool { return n == 0 })
	idleCounts, err := parseCounts(*idleArg)
	if err != nil {
		return usage("-idle: %v", err)
	}
	idleCounts = slices.DeleteFunc(idleCounts, func(n int) bool { return n == 0 })
	if *refsAll {
		*refsArg += ",relays"
	}
	refNames, err := parseRefs(*refsArg)
	if err != nil {
		return usage("-ref: %v", err)
	}
	if cfg.SourceAddrs, err = loadgen.ParseSourceAddrs(*sources); err != nil {
		return usage("-source: %v", err)
	}
	if *idleRepeat < 1 {
		return usage("-idle-repeat must be at least 1")
	}
	if len(refNames) > 0 && *spawnBin == "" && (*direct == "" || strings.Contains(*direct, "://")) {
		return usage("-ref and -reference need -spawn, or -direct as host:port for the references to relay to")
	}
	spawnedPID := 0
	var sp *spawned
	if *spawnBin != "" {
		if *direct != "" || *proxied != "" || *pid != 0 {
			return usage("-spawn sets -direct, -proxied and -pid itself")
		}
		var err error
		sp, err = spawn(*spawnBin, *bPool, *bMode, fmt.Sprintf("--event-loop=%v", *bLoop))
		if err != nil {
			fmt.Fprintf(stderr, "mongobouncer-bench: %v\n", err)
			return 1
		}
		defer sp.stop()
		spawnedPID = sp.pid()
		*direct, *proxied = sp.direct, sp.proxied
		if len(idleCounts) > 0 {
			*pid = sp.pid()
		}
		io := "goroutine per client"
		if *bLoop {
			io = "event loop"
		}
		fmt.Fprintf(stderr, "spawned: fake upstream %s, mongobouncer %s (pid %d, pool %d, %s mode, %s)\n",
			sp.direct, sp.proxied, sp.pid(), *bPool, *bMode, io)
	}
	compare := (*direct != "" || *proxied != "" && len(idleCounts) == 0) && len(clientCounts) > 0
	switch {
	case fs.NArg() > 0:
		return usage("unexpected arguments %q", fs.Args())
	case compare && *direct == "":
		return usage("a comparison needs -direct")
	case compare && *proxied == "" && len(refNames) == 0:
		return usage("a comparison needs both -direct and -proxied (or -ref)")
	case !compare && len(idleCounts) == 0:
		fs.Usage()
		return 2
	case len(idleCounts) > 0 && (*pid <= 0 || *proxied == ""):
		return usage("-idle K needs -proxied and the proxy's -pid")
	}
	level := slog.LevelWarn
	if *verbose {
		level = slog.LevelInfo
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	cfg.MaxOps, cfg.MaxPoolSize, cfg.Logger = *maxOps, *poolSize, logger
	// Every ping client holds a socket; many clients would otherwise hit a
	// low default soft limit and show up as dial errors.
	if _, err := loadgen.RaiseFileLimit(); err != nil {
		logger.Warn("could not raise the open-file limit", "err", err)
	}

	table := stdout
	if *asJSON {
		table = stderr
	}
	var out output
	if compare {
		err = compareAll(ctx, &out, table, comparison{cfg: cfg, counts: clientCounts, direct: *direct, proxied: *proxied,
			sp: sp, spawnedPID: spawnedPID, refNames: refNames, haproxyBin: *haproxyBin})
	}
	if err == nil && len(idleCounts) > 0 {
		var fresh func() (idleTarget, error)
		if sp != nil {
			fresh = func() (idleTarget, error) {
				s, err := spawn(*spawnBin, *bPool, *bMode, fmt.Sprintf("--event-loop=%v", *bLoop))
				if err != nil {
					return idleTarget{}, err
				}
				return idleTarget{addr: s.proxied, pid: s.pid(), stop: s.stop}, nil
			}
		}
		err = probeIdleAll(ctx, &out, table, idleCounts, *idleRepeat, loadgen.IdleConfig{PID: *pid, Settle: *settle,
			DialTimeout: cfg.OpTimeout, SourceAddrs: cfg.SourceAddrs, Logger: logger}, *proxied, fresh)
	}
	if err != nil {
		out.Error = err.Error()
		fmt.Fprintf(stderr, "mongobouncer-bench: %v\n", err)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if jerr := enc.Encode(out); jerr != nil {
			fmt.Fprintf(stderr, "mongobouncer-bench: writing JSON: %v\n", jerr)
			return 1
		}
	}
	if err != nil {
		if errors.Is(err, loadgen.ErrInvalidConfig) {
			return 2
		}
		return 1
	}
	return 0
}
