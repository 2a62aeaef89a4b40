// Command mongobouncer-bench measures mongobouncer against a direct
// connection, side by side in one run, and reports ratios (proxied/direct
// throughput, added latency), which are what mean something on a small,
// noisy machine. It can also measure what an idle client connection costs
// the proxy process.
//
//	mongobouncer-bench -direct 127.0.0.1:27017 -proxied 127.0.0.1:27018 -workload ping -clients 16
//	mongobouncer-bench -proxied 127.0.0.1:27018 -idle 5000 -pid $(pidof mongobouncer)
//	mongobouncer-bench -spawn bin/mongobouncer -clients 100 -idle 10000
//
// With -spawn, the tool starts a fast fake upstream (this binary again, in
// a process of its own) and the given mongobouncer binary in front of it, compares the two, probes the
// idle cost against that mongobouncer's PID, and stops both.
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
	"syscall"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/loadgen"
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
	Compare *loadgen.Report     `json:"compare,omitempty"`
	Idle    *loadgen.IdleReport `json:"idle,omitempty"`
	// CPUPerOp is the spawned mongobouncer's CPU time per proxied
	// operation, warm-up included (-spawn only; Compare.Proxied.CPU has
	// every process's).
	CPUPerOp time.Duration `json:"cpu_per_op_ns,omitempty"`
	// References are the reference relays' comparisons (-reference).
	References []reference `json:"references,omitempty"`
	Error      string      `json:"error,omitempty"`
}

// reference is one reference relay's comparison with direct traffic.
type reference struct {
	Relay   loadgen.RelayKind `json:"relay"`
	Compare *loadgen.Report   `json:"compare"`
}

// run parses args, runs what they ask for and returns the exit status:
// 0 on success, 1 when a measurement failed, 2 on bad usage.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("mongobouncer-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg      loadgen.Config
		direct   = fs.String("direct", "", "address of the server without the proxy (host:port; a mongodb:// URI for -workload driver)")
		proxied  = fs.String("proxied", "", "address of mongobouncer in front of the same server")
		idle     = fs.Int("idle", 0, "open this many idle client connections to -proxied and report the RSS growth of -pid (0: skip)")
		pid      = fs.Int("pid", 0, "process whose RSS the -idle probe measures (the proxy)")
		settle   = fs.Duration("settle", loadgen.DefaultIdleSettle, "how long idle connections sit before RSS is read again")
		asJSON   = fs.Bool("json", false, "print the results as JSON on stdout (the table then goes to stderr)")
		verbose  = fs.Bool("v", false, "log progress to stderr")
		maxOps   = fs.Int64("max-ops", loadgen.DefaultMaxOps, "maximum operations per run (each side of each round)")
		poolSize = fs.Uint64("pool", loadgen.DefaultMaxPoolSize, "driver maxPoolSize (-workload driver)")
		spawnBin = fs.String("spawn", "", "start a fake upstream here and this mongobouncer `binary` in front of it, and measure them")
		bPool    = fs.Int("bouncer-pool", 100, "max_pool_size of the spawned mongobouncer (its default)")
		bMode    = fs.String("bouncer-mode", "transaction", "pool_mode of the spawned mongobouncer (its default)")
		bLoop    = fs.Bool("bouncer-event-loop", true, "run the spawned mongobouncer with --event-loop=true (its default on Linux) or false")
		refs     = fs.Bool("reference", false, "with -spawn: also measure two reference relays in front of the same upstream (a goroutine per client, and epoll event loops), which copy messages and do nothing else: the floor of what relaying costs on this machine")
	)
	fs.StringVar(&cfg.Workload, "workload", loadgen.WorkloadPing, "ping (raw OP_MSG, one connection per client) or driver (insert/find/update through the Go driver)")
	fs.IntVar(&cfg.Clients, "clients", loadgen.DefaultClients, "concurrent clients")
	fs.DurationVar(&cfg.Duration, "duration", loadgen.DefaultDuration, "length of each run (each side of each round), warm-up included")
	fs.DurationVar(&cfg.Warmup, "warmup", 200*time.Millisecond, "leading part of each run excluded from the figures")
	fs.IntVar(&cfg.Rounds, "rounds", loadgen.DefaultRounds, "direct+proxied round pairs, alternated to cancel machine noise")
	fs.DurationVar(&cfg.OpTimeout, "op-timeout", loadgen.DefaultOpTimeout, "timeout of each operation")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: mongobouncer-bench -direct ADDR -proxied ADDR [flags]\n"+
			"       mongobouncer-bench -proxied ADDR -idle K -pid PID [flags]\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *refs && *spawnBin == "" {
		fmt.Fprintln(stderr, "mongobouncer-bench: -reference needs -spawn")
		return 2
	}
	spawnedPID := 0
	var sp *spawned
	if *spawnBin != "" {
		if *direct != "" || *proxied != "" || *pid != 0 {
			fmt.Fprintln(stderr, "mongobouncer-bench: -spawn sets -direct, -proxied and -pid itself")
			return 2
		}
		var err error
		sp, err = spawn(*spawnBin, *bPool, *bMode, fmt.Sprintf("--event-loop=%v", *bLoop))
		if err != nil {
			fmt.Fprintf(stderr, "mongobouncer-bench: %v\n", err)
			return 1
		}
		defer sp.stop()
		if *refs {
			if err := sp.spawnRelays(sp.direct); err != nil {
				fmt.Fprintf(stderr, "mongobouncer-bench: %v\n", err)
				return 1
			}
		}
		spawnedPID = sp.pid()
		*direct, *proxied = sp.direct, sp.proxied
		if *idle > 0 {
			*pid = sp.pid()
		}
		io := "goroutine per client"
		if *bLoop {
			io = "event loop"
		}
		fmt.Fprintf(stderr, "spawned: fake upstream %s, mongobouncer %s (pid %d, pool %d, %s mode, %s)\n",
			sp.direct, sp.proxied, sp.pid(), *bPool, *bMode, io)
	}
	compare := *direct != "" || *proxied != "" && *idle == 0
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "mongobouncer-bench: unexpected arguments %q\n", fs.Args())
		return 2
	case compare && (*direct == "" || *proxied == ""):
		fmt.Fprintln(stderr, "mongobouncer-bench: a comparison needs both -direct and -proxied")
		return 2
	case !compare && *idle == 0:
		fs.Usage()
		return 2
	case *idle < 0 || *idle > 0 && (*pid <= 0 || *proxied == ""):
		fmt.Fprintln(stderr, "mongobouncer-bench: -idle K needs -proxied and the proxy's -pid")
		return 2
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
	var err error
	if compare {
		var procs []loadgen.Process
		mcfg := cfg
		if sp != nil {
			// Every process of the comparison, so that the report shows
			// where a proxied operation's CPU goes (see docs/performance.md).
			procs = []loadgen.Process{{Name: "bench", PID: 0}, {Name: "upstream", PID: sp.fake.cmd.Process.Pid}}
			mcfg.Processes = slices.Concat(procs, []loadgen.Process{{Name: "mongobouncer", PID: spawnedPID, ProxiedOnly: true}})
		}
		var rep loadgen.Report
		rep, err = loadgen.Compare(ctx, *direct, *proxied, mcfg)
		if len(rep.Runs) > 0 {
			out.Compare = &rep
			_ = rep.WriteTable(table)
		}
		if c, ok := rep.Proxied.ProcessCPU("mongobouncer"); ok {
			out.CPUPerOp = c.PerOp
		}
		if err == nil && sp != nil && len(sp.relays) > 0 {
			summary := fmt.Sprintf("proxied/direct throughput (CPU ratio): mongobouncer %.3f (%.3f)", rep.ThroughputRatio, rep.CPURatio)
			for _, r := range sp.relays {
				fmt.Fprintf(table, "\nreference: %s relay at %s (no pool, no inspection)\n", r.kind, r.addr)
				rcfg := cfg
				rcfg.Processes = slices.Concat(procs, []loadgen.Process{{Name: string(r.kind) + "-relay", PID: r.proc.cmd.Process.Pid, ProxiedOnly: true}})
				var rrep loadgen.Report
				rrep, err = loadgen.Compare(ctx, *direct, r.addr, rcfg)
				if len(rrep.Runs) > 0 {
					_ = rrep.WriteTable(table)
					out.References = append(out.References, reference{Relay: r.kind, Compare: &rrep})
				}
				if err != nil {
					break
				}
				summary += fmt.Sprintf(", %s relay %.3f (%.3f)", r.kind, rrep.ThroughputRatio, rrep.CPURatio)
			}
			fmt.Fprintf(table, "\n%s\n", summary)
		}
	}
	if err == nil && *idle > 0 {
		var rep loadgen.IdleReport
		rep, err = loadgen.ProbeIdle(ctx, *proxied, loadgen.IdleConfig{Conns: *idle, PID: *pid, Settle: *settle, DialTimeout: cfg.OpTimeout, Logger: logger})
		if err == nil {
			out.Idle = &rep
			_ = rep.WriteTable(table)
		}
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
