package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/app"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/logbuf"
	"github.com/mongobouncer/mongobouncer/internal/testutil/wait"
)

// drainBouncer is fileBouncer with its logs (info and up) in logs.
func drainBouncer(t *testing.T, toml string, logs *logbuf.Buffer) (*app.App, string, string) {
	t.Helper()
	return fileBouncerLogging(t, toml, logs)
}

// drainTOML is a session-mode configuration whose "orders" route goes to
// ordersURI when withOrders. upstream_command_timeout is short: it bounds
// how long Shutdown waits for clients stuck upstream once the drain is over.
func drainTOML(upURI, ordersURI, shutdownTimeout string, withOrders bool) string {
	s := strings.Replace(baseTOML(upURI, fmt.Sprintf("shutdown_timeout = %q\nupstream_command_timeout = \"1s\"", shutdownTimeout)),
		`pool_mode = "statement"`, `pool_mode = "session"`, 1)
	if withOrders {
		s += fmt.Sprintf("\n[databases.orders]\nconnection_string = %q\n", ordersURI)
	}
	return s
}

func reloadWith(t *testing.T, a *app.App, path, toml string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
}

// A route removed by a reload while a client still holds one of its
// connections is closed after shutdown_timeout, not after at least 30s.
func TestRouteDrainHonoursShutdownTimeout(t *testing.T) {
	oneIO(t) // session mode: a client goroutine on every model; the drain is the app's
	up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
	orders := fakemongo.Start(t, fakemongo.Options{InMemory: true})
	var logs logbuf.Buffer
	a, addr, path := drainBouncer(t, drainTOML(up.URI(), orders.URI(), "300ms", true), &logs)
	waitUsable(t, a, 2)
	pinned := dialRaw(t, addr) // session mode: holds its orders connection
	pinned.hello()
	if r := pinned.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "orders"}}); okOf(r) != 1 {
		t.Fatal(r)
	}
	start := time.Now()
	reloadWith(t, a, path, drainTOML(up.URI(), orders.URI(), "300ms", false))
	wait.Until(t, "the removed route's drain to time out", 10*time.Second, 10*time.Millisecond, func() bool {
		return strings.Contains(logs.String(), "route drain timed out")
	})
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("drain timed out after %v, before shutdown_timeout (300ms)", d)
	}
	if !strings.Contains(logs.String(), "shutdown_timeout=300ms") {
		t.Errorf("drain log does not name its bound:\n%s", logs.String())
	}
}

// Closing the App ends a reload's drain at once, even when the drain's own
// bound (shutdown_timeout at the reload) is longer: a graceful shutdown is
// bounded by its own context (plus upstream_command_timeout), not by a
// route that a request still holds.
func TestGracefulCloseEndsRouteDrains(t *testing.T) {
	oneIO(t) // session mode: a client goroutine on every model; the drain is the app's
	up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
	orders := fakemongo.Start(t, fakemongo.Options{InMemory: true})
	// The ping never gets an answer until the fake closes (test cleanup):
	// its connection stays held through the drain and the shutdown.
	orders.Handle("ping", func(*fakemongo.Request) fakemongo.Reply { return fakemongo.Reply{Delay: time.Hour} })
	var logs logbuf.Buffer
	a, addr, path := drainBouncer(t, drainTOML(up.URI(), orders.URI(), "1h", true), &logs)
	t.Cleanup(orders.Kill) // before the App's Close: lets the stuck client go
	waitUsable(t, a, 2)
	stuck := dialRaw(t, addr)
	stuck.hello()
	stuck.send(0, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "orders"}})
	wait.Until(t, "the ping to reach the orders upstream", 10*time.Second, 5*time.Millisecond, func() bool {
		return orders.Requests("ping") == 1
	})
	reloadWith(t, a, path, drainTOML(up.URI(), orders.URI(), "1h", false))

	done := make(chan error, 1)
	start := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		done <- a.GracefulClose(ctx)
	}()
	// Shutdown's own bounds: 100ms, then upstream_command_timeout + 1s
	// for the client stuck upstream.
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("GracefulClose still waiting after 20s: the route drain (shutdown_timeout 1h) holds it\n%s", logs.String())
	}
	took := time.Since(start)
	if !strings.Contains(logs.String(), "closing a draining route at shutdown") {
		t.Errorf("no log of the drain cut short (took %v):\n%s", took, logs.String())
	}
	t.Logf("GracefulClose took %v", took)
}
