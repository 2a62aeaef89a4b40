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
	"syscall"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/app"
	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "0.1.0-dev"

func main() {
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
		maxPool     = fs.Int("max-pool-size", -1, "upstream connections per server (0 = unlimited); overrides the file")
		maxClients  = fs.Int("max-client-conn", -1, "client connection limit (0 = unlimited); overrides the file")
		logLevel    = fs.String("log-level", "", "log level: debug, info, warn or error; overrides the file")
		logFormat   = fs.String("log-format", "", "log format: text or json; overrides the file")
		showVersion = fs.Bool("version", false, "print the version and exit")
	)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "mongobouncer %s: a connection pooler for MongoDB\n\n", version)
		fmt.Fprintf(stderr, "Usage:\n  mongobouncer --config FILE\n  mongobouncer --listen 127.0.0.1:6432 --upstream mongodb://127.0.0.1:27017/ [--pool-mode statement] [--max-pool-size N]\n\nFlags:\n")
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
		fmt.Fprintf(stdout, "mongobouncer %s\n", version)
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
	if *listen != "" {
		cfg.Global.Listen = *listen
	}
	if *upstreamURI != "" {
		if cfg.Databases == nil {
			cfg.Databases = map[string]config.Route{}
		}
		cfg.Databases[config.CatchAll] = config.Route{ConnectionString: config.URI(*upstreamURI)}
	}
	if *poolMode != "" {
		cfg.Global.PoolMode = config.PoolMode(*poolMode)
	}
	if *maxPool >= 0 {
		cfg.Global.MaxPoolSize = *maxPool
	}
	if *maxClients >= 0 {
		cfg.Global.MaxClientConn = *maxClients
	}
	if *logLevel != "" {
		cfg.Global.LogLevel = config.LogLevel(*logLevel)
	}
	if *logFormat != "" {
		cfg.Global.LogFormat = config.LogFormat(*logFormat)
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "mongobouncer: invalid configuration:\n%v\n", err)
		return 2
	}

	log := newLogger(stderr, cfg.Global)
	a, err := app.New(cfg, log)
	if err != nil {
		fmt.Fprintf(stderr, "mongobouncer: %v\n", err)
		return 1
	}
	a.Start()
	log.Info("mongobouncer started", "version", version, "pool_mode", string(cfg.Global.PoolMode))

	sigs := make(chan os.Signal, 2)
	if stop == nil {
		signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
		defer signal.Stop(sigs)
	}
	code := 0
	select {
	case s := <-sigs:
		log.Info("shutting down", "signal", s.String())
	case <-stop:
		log.Info("shutting down")
	case err := <-a.Errors():
		log.Error("listener failed", "error", err)
		code = 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(cfg.Global.ShutdownTimeout, time.Second))
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.Close(ctx) }()
	select {
	case err := <-done:
		if err != nil {
			log.Warn("shutdown incomplete", "error", err)
		}
	case s := <-sigs:
		log.Warn("second signal: exiting at once", "signal", s.String())
		return 1
	}
	log.Info("mongobouncer stopped")
	return code
}

func newLogger(w io.Writer, g config.Global) *slog.Logger {
	opts := &slog.HandlerOptions{Level: g.LogLevel.Level()}
	if g.LogFormat == config.LogFormatJSON {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
