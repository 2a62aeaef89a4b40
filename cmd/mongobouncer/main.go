// Command mongobouncer is a connection pooler for MongoDB: drivers connect
// to it as to a mongos, and it multiplexes their commands onto small pools
// of upstream connections.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"

	"github.com/mongobouncer/mongobouncer/internal/app"
	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/sdnotify"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "0.1.0-dev"

// revision is the source revision (the git commit) the binary was built
// from, set at build time with -ldflags "-X main.revision=..." (`make image`
// and the Dockerfile do); empty when unknown, as in a plain `go build`.
var revision = ""

// startProcs is GOMAXPROCS as the runtime chose it (the CPUs the process may
// use, cgroup limits and the GOMAXPROCS variable included), read before run
// changes it.
var startProcs = runtime.GOMAXPROCS(0)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "hash-password" {
		os.Exit(hashPassword(os.Args[2:], os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, nil))
}

// run is main without the process: it returns the exit code. stop, when not
// nil, replaces the termination signals (tests close it to stop the server).
func run(args []string, stdout, stderr io.Writer, stop <-chan struct{}) int {
	fs := flag.NewFlagSet("mongobouncer", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfgPath     = fs.String("config", "", "TOML configuration `file`")
		listen      = fs.String("listen", "", "client listen `address` (host:port or unix socket path); overrides the file")
		upstreamURI = fs.String("upstream", "", "upstream connection string for every database (a \"*\" route); overrides the file's \"*\" route")
		poolMode    = fs.String("pool-mode", "", "pool mode: session, transaction or statement; overrides the file")
		maxPool     = fs.String("max-pool-size", strconv.Itoa(config.Default().Global.MaxPoolSize), "upstream connections per server (0 = unlimited), or \"auto\" for an adaptive limit; overrides the file when given")
		maxClients  = fs.Int("max-client-conn", config.Default().Global.MaxClientConn, "client connection limit (0 = unlimited); overrides the file when given")
		logLevel    = fs.String("log-level", "", "log level: debug, info, warn or error; overrides the file")
		logFormat   = fs.String("log-format", "", "log format: text or json; overrides the file")
		adminListen = fs.String("admin-listen", "", "admin HTTP listen `address` (metrics, health, admin, status page); overrides the file")
		eventLoop   = fs.Bool("event-loop", true, "serve idle clients and plain requests on event-loop threads (Linux); --event-loop=false gives every client a goroutine; overrides the file when given")
		showVersion = fs.Bool("version", false, "print the version and exit")
		check       = fs.Bool("check", false, "parse and validate the configuration (the file with the other flags applied), print \"configuration ok\" and exit 0, or the errors and exit 2; nothing is bound or read besides the file")
	)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "mongobouncer %s: a connection pooler for MongoDB\n\n", version)
		fmt.Fprintf(stderr, "Usage:\n  mongobouncer --config FILE [--check]\n  mongobouncer --listen 127.0.0.1:6432 --upstream mongodb://127.0.0.1:27017/ [--pool-mode statement] [--max-pool-size N]\n  mongobouncer hash-password --user NAME [--db admin] < password\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "mongobouncer: unexpected argument %q (see --help)\n", fs.Arg(0))
		return 2
	}
	if *showVersion {
		if revision != "" {
			fmt.Fprintf(stdout, "mongobouncer %s (revision %s)\n", version, revision)
		} else {
			fmt.Fprintf(stdout, "mongobouncer %s\n", version)
		}
		return 0
	}
	upstream.Version = version

	var cfg config.Config
	if *cfgPath != "" {
		var err error
		if cfg, err = config.Load(*cfgPath); err != nil {
			fmt.Fprintf(stderr, "mongobouncer: invalid configuration:\n%v\n", err)
			return 2
		}
	} else {
		if *upstreamURI == "" {
			fmt.Fprintln(stderr, "mongobouncer: give --config FILE, or --upstream URI (see --help)")
			return 2
		}
		cfg = config.Default()
	}
	// loopThreads is event_loop_threads as resolved at startup (0: the
	// event loop is off); reloads see it in place of a 0 ("auto") so that
	// only a real change is reported as needing a restart.
	var loopThreads int
	// maxPoolSize is --max-pool-size parsed (badPoolSize when it is not a
	// size), applied by overrides only when the flag was given.
	maxPoolSize := parsePoolSize(*maxPool)
	// Flags override the file, now and at every reload.
	overrides := func(c *config.Config) {
		if loopThreads > 0 && c.Global.EventLoopThreads == 0 {
			c.Global.EventLoopThreads = loopThreads
		}
		if *listen != "" {
			c.Global.Listen = *listen
		}
		if *upstreamURI != "" {
			if c.Databases == nil {
				c.Databases = map[string]config.Route{}
			}
			c.Databases[config.CatchAll] = config.Route{ConnectionString: config.URI(*upstreamURI)}
		}
		if *poolMode != "" {
			c.Global.PoolMode = config.PoolMode(*poolMode)
		}
		if *logLevel != "" {
			c.Global.LogLevel = config.LogLevel(*logLevel)
		}
		if *logFormat != "" {
			c.Global.LogFormat = config.LogFormat(*logFormat)
		}
		if *adminListen != "" {
			c.Global.AdminListen = *adminListen
		}
		// Flags whose zero value is meaningful override only when given.
		fs.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "event-loop":
				c.Global.EventLoop = *eventLoop
			case "max-pool-size":
				c.Global.MaxPoolSize = maxPoolSize
			case "max-client-conn":
				c.Global.MaxClientConn = *maxClients
			}
		})
	}
	overrides(&cfg)
	if maxPoolSize == badPoolSize {
		fmt.Fprintf(stderr, "mongobouncer: --max-pool-size %q: want a number of 0 or more, or \"auto\"\n", *maxPool)
		return 2
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "mongobouncer: invalid configuration:\n%v\n", err)
		return 2
	}
	if *check {
		// A deployment's pipeline (or its test, tools/deploytest) checks a
		// configuration without a host to run it on: the listen addresses
		// need not be free, the upstreams need not answer.
		fmt.Fprintln(stdout, "configuration ok")
		return 0
	}
	if loopThreads = reserveLoopProcs(cfg.Global); loopThreads > 0 {
		cfg.Global.EventLoopThreads = loopThreads
	}

	// Signals are handled from before the listeners are bound: the kernel
	// completes connections to a bound listener before the first Accept.
	sigs := make(chan os.Signal, 4)
	if stop == nil {
		signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
		defer signal.Stop(sigs)
	} else {
		returned := make(chan struct{}) // a failed start returns before stop closes
		defer close(returned)
		go func() {
			select {
			case <-stop:
				sigs <- syscall.SIGTERM
			case <-returned:
			}
		}()
	}

	level := new(slog.LevelVar)
	level.Set(cfg.Global.LogLevel.Level())
	log := newLogger(stderr, cfg.Global, level)
	// Under systemd's Type=notify, NOTIFY_SOCKET names its socket; it is
	// left in the environment, as there is no child process to inherit it.
	notify := sdnotify.FromEnv(log)
	if notify != nil {
		log.Debug("systemd notifications on", "socket", notify.Socket())
	}
	a, err := app.NewWithOptions(cfg, app.Options{Logger: log, Level: level, Overrides: overrides, Notify: notify})
	if err != nil {
		fmt.Fprintf(stderr, "mongobouncer: %v\n", err)
		return 1
	}
	a.Start()
	log.Info("mongobouncer started", "version", version, "revision", revision, "pool_mode", string(cfg.Global.PoolMode),
		"event_loop_threads", loopThreads, "gomaxprocs", runtime.GOMAXPROCS(0), "event_loop_io", a.LoopIO())

	code := 0
wait:
	for {
		select {
		case s := <-sigs:
			if s == syscall.SIGHUP {
				if err := a.Reload(); err != nil {
					log.Error("reload failed", "error", err)
				}
				continue
			}
			log.Info("shutting down", "signal", s.String())
			break wait
		case <-a.ShutdownRequested():
			log.Info("shutting down", "reason", "shutdown command")
			break wait
		case err := <-a.Errors():
			log.Error("listener failed", "error", err)
			code = 1
			break wait
		}
	}
	// shutdown_delay comes first, then the drain's shutdown_timeout.
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Global.ShutdownDelay+cfg.Global.ShutdownTimeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.GracefulClose(ctx) }()
	for {
		select {
		case err := <-done:
			if err != nil {
				log.Warn("shutdown incomplete", "error", err)
			}
			log.Info("mongobouncer stopped")
			return code
		case s := <-sigs:
			if s == syscall.SIGHUP {
				continue
			}
			log.Warn("second signal: exiting at once", "signal", s.String())
			return 1
		}
	}
}

// reserveLoopProcs resolves event_loop_threads and runs the process with one
// P more than that: a loop thread blocked in epoll_wait is in a system call,
// and with as many Ps as loop threads the runtime's sysmon keeps taking their
// Ps back and handing them to spinning threads, while goroutine work (accepts,
// monitors, clients served by their goroutine, the garbage collector) waits
// for a loop to let go of one. Measured in docs/performance.md. It returns
// the number of loop threads, or 0 when the event loop is off or not
// available (not Linux), in which case GOMAXPROCS is left alone.
func reserveLoopProcs(g config.Global) int {
	if !g.EventLoop || runtime.GOOS != "linux" {
		return 0
	}
	n := g.EventLoopThreads
	if n == 0 {
		n = startProcs
	}
	runtime.GOMAXPROCS(n + 1)
	return n
}

func newLogger(w io.Writer, g config.Global, level *slog.LevelVar) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if g.LogFormat == config.LogFormatJSON {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// badPoolSize marks a --max-pool-size that is neither a size nor "auto".
const badPoolSize = -1 << 31

// parsePoolSize parses --max-pool-size: a number of 0 or more, or "auto"
// (config.PoolSizeAuto).
func parsePoolSize(v string) int {
	if v == "auto" {
		return config.PoolSizeAuto
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return badPoolSize
	}
	return n
}
