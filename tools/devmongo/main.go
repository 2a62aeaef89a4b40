// Command devmongo runs an embedded FerretDB (SQLite backend) as a disposable
// MongoDB-compatible server for development and tests.
//
// It lives in its own module so that FerretDB and its dependencies never enter
// mongobouncer's go.mod. When it is ready to serve it prints exactly one line,
// "devmongo listening on HOST:PORT", on stdout; tests wait for that line.
// It exits cleanly on SIGINT or SIGTERM.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/FerretDB/FerretDB/ferretdb"
)

func main() {
	os.Exit(run())
}

func run() int {
	listen := flag.String("listen", "127.0.0.1:0", "TCP address to listen on; port 0 picks a free port")
	unix := flag.String("unix", "", "also listen on this Unix socket path")
	dir := flag.String("dir", "", "SQLite state directory; default: a temporary directory removed on exit")
	level := flag.String("log-level", "warn", "log level: debug, info, warn or error")
	flag.Parse()

	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*level)); err != nil {
		fmt.Fprintf(os.Stderr, "devmongo: bad -log-level %q: %v\n", *level, err)
		return 2
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))

	stateDir := *dir
	if stateDir == "" {
		tmp, err := os.MkdirTemp("", "devmongo-")
		if err != nil {
			logger.Error("creating state directory", "err", err)
			return 1
		}
		defer os.RemoveAll(tmp)
		stateDir = tmp
	} else if err := os.MkdirAll(stateDir, 0o700); err != nil {
		logger.Error("creating state directory", "err", err)
		return 1
	}
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		logger.Error("resolving state directory", "err", err)
		return 1
	}

	// FerretDB's SQLite backend wants a file: URI naming a directory with a
	// trailing slash.
	f, err := ferretdb.New(&ferretdb.Config{
		Listener:  ferretdb.ListenerConfig{TCP: *listen, Unix: *unix},
		Logger:    logger,
		Handler:   "sqlite",
		SQLiteURL: (&url.URL{Scheme: "file", Path: filepath.ToSlash(abs) + "/"}).String(),
	})
	if err != nil {
		logger.Error("starting FerretDB", "err", err)
		return 1
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()

	// The listeners are bound by ferretdb.New, so the URI (and with it the
	// real port when 0 was asked for) is known before Run has accepted anything.
	u, err := url.Parse(f.MongoDBURI())
	if err != nil {
		logger.Error("parsing FerretDB URI", "err", err)
		stop()
		<-done
		return 1
	}
	host := u.Host
	if *listen != "" {
		if h, p, err := net.SplitHostPort(u.Host); err == nil {
			host = net.JoinHostPort(h, p)
		}
	}
	fmt.Printf("devmongo listening on %s\n", host)

	if err := <-done; err != nil {
		logger.Error("FerretDB stopped", "err", err)
		return 1
	}
	return 0
}
