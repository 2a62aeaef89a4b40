package e2e

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongobouncer/mongobouncer/internal/app"
	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// fileBouncer starts mongobouncer from a TOML file (so that it can be
// reloaded) and returns the app, its client address and the file's path.
func fileBouncer(t *testing.T, toml string) (*app.App, string, string) {
	t.Helper()
	return fileBouncerLogging(t, toml, nil)
}

// fileBouncerLogging is fileBouncer logging from level Info to logs (when
// not nil) instead of warnings to stderr, for tests that wait for an event
// only the log shows.
func fileBouncerLogging(t *testing.T, toml string, logs io.Writer) (*app.App, string, string) {
	t.Helper()
	return fileBouncerLevel(t, toml, logs, slog.LevelInfo)
}

// fileBouncerLevel is fileBouncerLogging from level (to logs, when not nil).
func fileBouncerLevel(t *testing.T, toml string, logs io.Writer, level slog.Level) (*app.App, string, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "mongobouncer.toml")
	if err := os.WriteFile(path, []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	ioModelOf(t).apply(&cfg)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if logs != nil {
		log = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: level}))
	}
	a, err := app.NewWithOptions(cfg, app.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	a.Start()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = a.Close(ctx)
	})
	return a, a.Addrs()[0].String(), path
}

func baseTOML(upstreamURI string, extra string) string {
	return fmt.Sprintf(`[mongobouncer]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
pool_mode = "statement"
max_pool_size = 5
heartbeat_interval = "500ms"
server_selection_timeout = "5s"
%s
[databases."*"]
connection_string = %q
`, extra, upstreamURI)
}

func adminCmd(t *testing.T, c *mongo.Client, cmd bson.D) bson.Raw {
	t.Helper()
	raw, err := c.Database("mongobouncer").RunCommand(ctxT(t, 10*time.Second), cmd).Raw()
	if err != nil {
		t.Fatalf("%v: %v", cmd, err)
	}
	return raw
}

func TestAdminCommandsOverTheWire(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		a, addr, _ := fileBouncer(t, baseTOML(up.URI(), ""))
		waitUsable(t, a, 1)
		c := driver(t, addr, "&appName=ops-test")
		ctx := ctxT(t, 20*time.Second)
		if _, err := c.Database("test").Collection("c").InsertOne(ctx, bson.D{{Key: "x", Value: 1}}); err != nil {
			t.Fatal(err)
		}

		pools := adminCmd(t, c, bson.D{{Key: "showPools", Value: 1}})
		arr, _ := pools.Lookup("pools").ArrayOK()
		vals, _ := arr.Values()
		if len(vals) != 1 {
			t.Fatalf("showPools: %v", pools)
		}
		p := vals[0].Document()
		if r, _ := p.Lookup("route").StringValueOK(); r != "*" {
			t.Fatalf("showPools route: %v", p)
		}
		if m, _ := p.Lookup("maxPoolSize").AsInt64OK(); m != 5 {
			t.Fatalf("showPools maxPoolSize: %v", p)
		}

		clients := adminCmd(t, c, bson.D{{Key: "showClients", Value: 1}})
		if !strings.Contains(clients.String(), "ops-test") {
			t.Fatalf("showClients lacks our appName: %v", clients)
		}
		servers := adminCmd(t, c, bson.D{{Key: "showServers", Value: 1}})
		if !strings.Contains(servers.String(), up.Addr()) {
			t.Fatalf("showServers lacks the upstream: %v", servers)
		}
		stats := adminCmd(t, c, bson.D{{Key: "showStats", Value: 1}})
		if !strings.Contains(stats.String(), "operations") {
			t.Fatalf("showStats: %v", stats)
		}
		cfg := adminCmd(t, c, bson.D{{Key: "showConfig", Value: 1}})
		if !strings.Contains(cfg.String(), up.Addr()) {
			t.Fatalf("showConfig: %v", cfg)
		}
		for _, cmd := range []string{"pause", "resume", "reconnect", "reload"} {
			adminCmd(t, c, bson.D{{Key: cmd, Value: 1}})
		}
		// After reconnect, traffic still flows.
		if _, err := c.Database("test").Collection("c").InsertOne(ctx, bson.D{{Key: "x", Value: 2}}); err != nil {
			t.Fatal(err)
		}
		// An unknown route is a clear error.
		err := c.Database("mongobouncer").RunCommand(ctx, bson.D{{Key: "pause", Value: 1}, {Key: "route", Value: "nope"}}).Err()
		if err == nil || !strings.Contains(err.Error(), "nope") {
			t.Fatalf("pause of unknown route: %v", err)
		}
		adminCmd(t, c, bson.D{{Key: "shutdown", Value: 1}})
		select {
		case <-a.ShutdownRequested():
		case <-time.After(5 * time.Second):
			t.Fatal("shutdown command did not request a shutdown")
		}
	})
}

func TestPauseResume(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		a, addr, _ := fileBouncer(t, baseTOML(up.URI(), ""))
		waitUsable(t, a, 1)
		cl := dialRaw(t, addr)
		cl.hello()
		if r := cl.cmd(bson.D{{Key: "pause", Value: 1}, {Key: "$db", Value: "mongobouncer"}}); okOf(r) != 1 {
			t.Fatal(r)
		}
		id := cl.send(0, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}})
		if _, err := cl.tryRecv(300 * time.Millisecond); err == nil {
			t.Fatal("a request completed while the route was paused")
		}
		if err := a.Resume(""); err != nil {
			t.Fatal(err)
		}
		if rep := cl.recv(); rep.header.ResponseTo != id || okOf(rep.body) != 1 {
			t.Fatalf("after resume: %v", rep.body)
		}
	})
}

// load runs a bounded driver workload until stop is closed and counts
// errors.
func load(t *testing.T, c *mongo.Client, workers int, stop <-chan struct{}) (*atomic.Int64, *atomic.Int64, *sync.WaitGroup) {
	var ops, errs atomic.Int64
	var wg sync.WaitGroup
	var firstErr sync.Once
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			coll := c.Database("test").Collection(fmt.Sprintf("load%d", w))
			deadline := time.Now().Add(30 * time.Second)
			for i := 0; time.Now().Before(deadline) && i < 100000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := coll.InsertOne(ctx, bson.D{{Key: "i", Value: i}})
				cancel()
				if err != nil {
					errs.Add(1)
					firstErr.Do(func() { t.Logf("workload error: %v", err) })
				} else {
					ops.Add(1)
				}
			}
		}()
	}
	return &ops, &errs, &wg
}

func TestReloadUnderLoad(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		orders := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		a, addr, path := fileBouncer(t, baseTOML(up.URI(), ""))
		waitUsable(t, a, 1)
		c := driver(t, addr, "")
		stop := make(chan struct{})
		ops, errs, wg := load(t, c, 8, stop)
		// The reloads happen while the workload runs: each waits for it to
		// make progress first.
		progress := func(what string) {
			t.Helper()
			n := ops.Load() + 50
			waitFor(t, "50 more operations "+what, func() bool { return ops.Load() >= n || errs.Load() > 0 })
		}
		progress("before the reload")

		// Pool size changed and a route added, under load.
		next := strings.Replace(baseTOML(up.URI(), ""), "max_pool_size = 5", "max_pool_size = 3", 1) +
			fmt.Sprintf("\n[databases.orders]\nconnection_string = %q\n", orders.URI())
		if err := os.WriteFile(path, []byte(next), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := a.Reload(); err != nil {
			t.Fatal(err)
		}
		progress("after the reload")
		for _, p := range a.Pools() {
			if p.Route == "*" && p.MaxPoolSize != 3 {
				t.Fatalf("max_pool_size not applied live: %+v", p)
			}
		}
		ctx := ctxT(t, 20*time.Second)
		if _, err := c.Database("orders").Collection("o").InsertOne(ctx, bson.D{{Key: "o", Value: 1}}); err != nil {
			t.Fatal(err)
		}
		if len(orders.Collection("orders", "o")) != 1 {
			t.Fatal("the added route did not get its database")
		}
		// An invalid file keeps the running configuration.
		if err := os.WriteFile(path, []byte(next+"\nbogus_key = 1\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		err := a.Reload()
		if err == nil || !strings.Contains(err.Error(), "mongobouncer.toml:") {
			t.Fatalf("invalid reload: %v", err)
		}
		progress("after the invalid reload")
		close(stop)
		wg.Wait()
		if errs.Load() != 0 || ops.Load() == 0 {
			t.Fatalf("workload during reloads: %d ops, %d errors", ops.Load(), errs.Load())
		}
		if n := up.MaxOpen(); n > 5+1 {
			t.Fatalf("upstream saw %d connections", n)
		}
	})
}

func TestMetricsAndHealthEndpoints(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		a, addr, _ := fileBouncer(t, baseTOML(up.URI(), ""))
		waitUsable(t, a, 1)
		base := "http://" + a.AdminAddr().String()
		get := func(p string) (int, string) {
			resp, err := http.Get(base + p)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		if code, _ := get("/healthz"); code != 200 {
			t.Fatalf("/healthz %d", code)
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			code, body := get("/readyz")
			if code == 200 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("/readyz %d: %s", code, body)
			}
			time.Sleep(50 * time.Millisecond)
		}
		_, before := get("/metrics")
		cl := dialRaw(t, addr)
		cl.hello()
		const n = 25
		for range n {
			cl.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}})
		}
		for range 3 {
			cl.cmd(bson.D{{Key: "noSuchCommand", Value: 1}, {Key: "$db", Value: "admin"}})
		}
		_, after := get("/metrics")
		if v := metricValue(after, `mongobouncer_upstream_errors_total{code="59",route="*"}`); v != 3 {
			t.Fatalf("upstream errors with code 59: %v, want 3", v)
		}
		series := `mongobouncer_operations_total{command="ping",route="*"}`
		if d := metricValue(after, series) - metricValue(before, series); d != n {
			t.Fatalf("%s grew by %v, want %d\n%s", series, d, n, after)
		}
		for _, name := range []string{"mongobouncer_pool_connections", "mongobouncer_pool_checkout_duration_seconds",
			"mongobouncer_client_connections", "mongobouncer_pool_connections_created_total", "mongobouncer_pool_wait_queue_length"} {
			if !strings.Contains(after, name) {
				t.Fatalf("no %s in /metrics", name)
			}
		}
		// The upstream going away makes /readyz fail.
		up.Kill()
		deadline = time.Now().Add(10 * time.Second)
		for {
			code, _ := get("/readyz")
			if code == 503 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("/readyz stayed 200 with the upstream dead")
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}

// metricValue finds one series in Prometheus text output; 0 when absent.
func metricValue(text, series string) float64 {
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, series+" ") {
			var v float64
			fmt.Sscanf(strings.TrimPrefix(line, series+" "), "%g", &v)
			return v
		}
	}
	return 0
}

func TestGracefulShutdownUnderLoad(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		// The slow requests are answered once the transaction has
		// committed: they are in flight for the whole test.
		hold := make(chan struct{})
		release := sync.OnceFunc(func() { close(hold) })
		t.Cleanup(release)
		up.Handle("slow", func(*fakemongo.Request) fakemongo.Reply {
			select {
			case <-hold:
			case <-time.After(10 * time.Second):
			}
			return fakemongo.OK()
		})
		a, addr, _ := fileBouncer(t, baseTOML(up.URI(), `shutdown_timeout = "10s"`))
		waitUsable(t, a, 1)
		// In flight when the shutdown starts.
		var inflight []*rawClient
		var ids []int32
		for range 3 {
			c := dialRaw(t, addr)
			c.hello()
			ids = append(ids, c.send(0, bson.D{{Key: "slow", Value: 1}, {Key: "$db", Value: "test"}}))
			inflight = append(inflight, c)
		}
		// A transaction open when the shutdown starts may finish.
		tx := dialRaw(t, addr)
		tx.hello()
		lsid := newLSID(9)
		tx.cmd(txnCmd("insert", lsid, 1, true))
		idle := dialRaw(t, addr)
		idle.hello()
		waitFor(t, "the slow requests to reach the upstream", func() bool { return up.Requests("slow") == 3 })

		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			done <- a.GracefulClose(ctx)
		}()
		waitDraining(t, a, addr)
		// New requests get ShutdownInProgress.
		if r := idle.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}}); codeOf(r) != 91 {
			t.Fatalf("new request during shutdown: %v", r)
		}
		// The transaction goes on and commits.
		if r := tx.cmd(txnCmd("insert", lsid, 1, false)); okOf(r) != 1 {
			t.Fatalf("transaction command during shutdown: %v", r)
		}
		if r := tx.cmd(txnCmd("commitTransaction", lsid, 1, false)); okOf(r) != 1 {
			t.Fatalf("commit during shutdown: %v", r)
		}
		release()
		for i, c := range inflight {
			rep := c.recv()
			if rep.header.ResponseTo != ids[i] || okOf(rep.body) != 1 {
				t.Fatalf("in-flight request %d: %v", i, rep.body)
			}
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("shutdown: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Fatal("shutdown did not finish")
		}
		if txs := up.Transactions(); len(txs) != 1 || txs[0].State != fakemongo.TxnCommitted {
			t.Fatalf("transaction: %+v", txs)
		}
	})
}

func TestReloadReplacesAndRemovesRoutesWithoutDroppingClients(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		oldUp := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		newUp := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		reports := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		toml := func(star string, withReports bool) string {
			s := strings.Replace(baseTOML(star, ""), `pool_mode = "statement"`, `pool_mode = "session"`, 1)
			if withReports {
				s += fmt.Sprintf("\n[databases.reports]\nconnection_string = %q\n", reports.URI())
			}
			return s
		}
		a, addr, path := fileBouncer(t, toml(oldUp.URI(), true))
		waitUsable(t, a, 2)
		ins := func(c *rawClient, db string) {
			t.Helper()
			if r := c.cmd(bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{bson.D{{Key: "x", Value: 1}}}}, {Key: "$db", Value: db}}); okOf(r) != 1 {
				t.Fatalf("insert into %s: %v", db, r)
			}
		}
		pinned := dialRaw(t, addr)
		pinned.hello()
		ins(pinned, "test")    // pins a connection of the old "*" upstream
		ins(pinned, "reports") // and one of reports

		if err := os.WriteFile(path, []byte(toml(newUp.URI(), false)), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := a.Reload(); err != nil {
			t.Fatal(err)
		}
		// The same client, still connected, now reaches the new upstream; the
		// removed route's database falls to "*".
		ins(pinned, "test")
		ins(pinned, "reports")
		if len(newUp.Collection("test", "c")) != 1 || len(newUp.Collection("reports", "c")) != 1 {
			t.Fatal("requests after the reload did not reach the new upstream")
		}
		// The old pools drain (the client gave its pins back) and close.
		deadline := time.Now().Add(10 * time.Second)
		for oldUp.Open() > 0 || reports.Open() > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("old upstreams still have %d and %d connections", oldUp.Open(), reports.Open())
			}
			time.Sleep(50 * time.Millisecond)
		}
		for _, p := range a.Pools() {
			if p.Route == "reports" || p.Server == oldUp.Addr() {
				t.Fatalf("old pool still listed: %+v", p)
			}
		}
	})
}

// Settings that take a restart keep their running values across a reload
// that changes them (the reload itself succeeds and logs a warning).
func TestReloadKeepsRestartOnlySettings(t *testing.T) {
	oneIO(t) // no client: the configuration read back
	up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
	a, _, path := fileBouncer(t, baseTOML(up.URI(), "event_loop_threads = 2"))
	if got := a.Config()["event_loop_threads"]; got != 2 {
		t.Fatalf("event_loop_threads %v, want 2", got)
	}
	if err := os.WriteFile(path, []byte(baseTOML(up.URI(), "event_loop_threads = 3\nmax_client_conn = 7")), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	cfg := a.Config()
	if cfg["event_loop_threads"] != 2 || cfg["max_client_conn"] != 7 {
		t.Fatalf("after reload: event_loop_threads %v (want the running 2), max_client_conn %v (want the new 7)", cfg["event_loop_threads"], cfg["max_client_conn"])
	}
}
