package e2e

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongobouncer/mongobouncer/internal/app"
	"github.com/mongobouncer/mongobouncer/internal/config"
)

// bouncer starts a whole mongobouncer with one "*" route to upstreamURI
// (plus any extra routes) and returns its address.
func bouncer(t testing.TB, upstreamURI string, tweak func(*config.Config)) (*app.App, string) {
	t.Helper()
	level := slog.LevelWarn
	if os.Getenv("MONGOBOUNCER_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	a := newBouncer(t, upstreamURI, tweak, level)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := a.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return a, a.Addrs()[0].String()
}

// newBouncer builds and starts the app of bouncer, logging at level; the
// caller closes it.
func newBouncer(t testing.TB, upstreamURI string, tweak func(*config.Config), level slog.Level) *app.App {
	t.Helper()
	cfg := config.Default()
	cfg.Global.Listen = "127.0.0.1:0"
	cfg.Global.HeartbeatInterval = 500 * time.Millisecond
	cfg.Global.ServerSelectionTimeout = 5 * time.Second
	cfg.Global.WaitQueueTimeout = 10 * time.Second
	cfg.Databases = map[string]config.Route{"*": {ConnectionString: config.URI(upstreamURI)}}
	ioModelOf(t).apply(&cfg)
	if tweak != nil {
		tweak(&cfg)
	}
	a, err := app.New(cfg, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})))
	if err != nil {
		t.Fatal(err)
	}
	a.Start()
	return a
}

// driver connects the Go driver to addr as to a mongos.
func driver(t testing.TB, addr string, extra string) *mongo.Client {
	t.Helper()
	return driverWith(t, addr, extra, nil)
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// waitDraining waits until a's graceful shutdown has begun: the server is
// draining and has closed its listener at addr, after which it checks
// whether its clients are drained.
func waitDraining(t *testing.T, a *app.App, addr string) {
	t.Helper()
	waitFor(t, "the shutdown to begin", func() bool {
		if !a.Server().Draining() {
			return false
		}
		c := dialRawNoFail(addr)
		if c != nil {
			c.Close()
		}
		return c == nil
	})
}

// waitForGoroutineIn waits until a goroutine's stack has fn in it: how a
// test sees that a request is blocked where nothing else shows it (at a
// paused route's gate).
func waitForGoroutineIn(t *testing.T, fn string) {
	t.Helper()
	waitFor(t, "a goroutine in "+fn, func() bool {
		var b bytes.Buffer
		_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
		return strings.Contains(b.String(), fn)
	})
}
