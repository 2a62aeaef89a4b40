package app

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/wait"
	"github.com/mongobouncer/mongobouncer/internal/topology"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// readyApp builds an App with one "*" route to uri, each edit applied to
// its configuration. The heartbeat is long so that, after the first check,
// no check changes the server or its pool behind the test's back.
func readyApp(t *testing.T, uri string, edits ...func(*config.Config)) (*App, *topology.Server) {
	t.Helper()
	cfg := config.Default()
	cfg.Global.Listen = "127.0.0.1:0"
	cfg.Global.AdminListen = "127.0.0.1:0"
	cfg.Global.HeartbeatInterval = time.Hour
	cfg.Databases = map[string]config.Route{"*": {ConnectionString: config.URI(uri)}}
	for _, edit := range edits {
		edit(&cfg)
	}
	a, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeApp(a) })
	srvs := a.Topologies()[0].Servers()
	if len(srvs) != 1 {
		t.Fatalf("%d servers, want 1", len(srvs))
	}
	wait.Until(t, "the first check", 10*time.Second, 5*time.Millisecond, srvs[0].Checked)
	return a, srvs[0]
}

// A usable server whose pool is not ready (cleared, not yet made ready by
// a check) does not make the route ready.
func TestReadyNeedsAReadyPool(t *testing.T) {
	up := fakemongo.Start(t, fakemongo.Options{})
	a, srv := readyApp(t, up.URI())
	if ok, why := a.Ready(); !ok {
		t.Fatalf("precondition: not ready with a usable upstream: %v", why)
	}
	srv.Pool().Clear(false)
	if srv.State() != topology.Usable {
		t.Fatal("precondition: clearing the pool changed the server's state")
	}
	want := `route "*": no primary: ` + srv.Address() + ` standalone (pool paused)`
	if ok, why := a.Ready(); ok || len(why) != 1 || why[0] != want {
		t.Fatalf("Ready() = %v, %q with the server's pool paused; want not ready, %q", ok, why, want)
	}
	if err := srv.Pool().Ready(); err != nil {
		t.Fatal(err)
	}
	if ok, why := a.Ready(); !ok {
		t.Fatalf("not ready once the pool is ready again: %v", why)
	}
}

// A ready pool on a server that is not usable does not make the route
// ready either.
func TestReadyNeedsAUsableServer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	a, srv := readyApp(t, "mongodb://"+dead+"/?directConnection=true")
	if srv.State() == topology.Usable {
		t.Fatal("precondition: an unreachable server is usable")
	}
	if err := srv.Pool().Ready(); err != nil {
		t.Fatal(err)
	}
	if ok, why := a.Ready(); ok || len(why) != 1 || !strings.Contains(why[0], `route "*"`) {
		t.Fatalf("Ready() = %v, %q with the only server unknown; want not ready for route \"*\"", ok, why)
	}
}

// /readyz answers 503 "shutting down" while a graceful shutdown drains,
// though every route is still ready, so that a load balancer stops sending
// new clients before the process exits.
func TestReadyzUnavailableWhileDraining(t *testing.T) {
	up := fakemongo.Start(t, fakemongo.Options{})
	release := make(chan struct{})
	up.Handle("ping", func(req *fakemongo.Request) fakemongo.Reply {
		select {
		case <-release:
		case <-time.After(30 * time.Second):
		}
		return up.Builtin(req)
	})
	a, _ := readyApp(t, up.URI())
	a.Start()
	if code, body := readyzOf(t, a); code != http.StatusOK {
		t.Fatalf("precondition: /readyz %d %q before the shutdown", code, body)
	}

	// A request in flight keeps the drain going until release.
	nc := pingInFlight(t, a, up)
	done := startGracefulClose(a)
	wait.Until(t, "the drain to begin", 10*time.Second, 5*time.Millisecond, a.server.Draining)
	code, text := readyzOf(t, a)
	close(release)
	if code != http.StatusServiceUnavailable || !strings.Contains(text, "shutting down") {
		t.Errorf("/readyz during the drain: %d %q, want 503 with \"shutting down\"", code, text)
	}
	if _, err := wire.ReadMessage(nc, nil, wire.DefaultMaxMessageSize); err != nil {
		t.Errorf("the request in flight got no reply during the drain: %v", err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("GracefulClose: %v", err)
		}
	case <-time.After(25 * time.Second):
		t.Fatal("GracefulClose did not return")
	}
}

// pingInFlight sends a ping through a's first listener on a connection of
// its own (closed with the test) and returns once up has it: the request
// is in flight, holding a drain open until up's handler lets it go.
func pingInFlight(t *testing.T, a *App, up *fakemongo.Server) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", a.Addrs()[0].String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	body, err := bson.Marshal(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "test"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(wire.AppendMsg(nil, 1, 0, 0, body)); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, "the ping to reach the upstream", 10*time.Second, 5*time.Millisecond, func() bool {
		return up.Requests("ping") == 1
	})
	return c
}

// readyzOf is a's /readyz: its status code and body.
func readyzOf(t *testing.T, a *App) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + a.AdminAddr().String() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// startGracefulClose runs a.GracefulClose (bounded by 20 s) on a
// goroutine of its own; its result arrives on the channel.
func startGracefulClose(a *App) <-chan error {
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		done <- a.GracefulClose(ctx)
	}()
	return done
}
