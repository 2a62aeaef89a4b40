package app

// shutdown_delay: a graceful shutdown first serves as usual with /readyz
// failing, so that a balancer takes the instance out before its drain.

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/wait"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// delayApp is readyApp with shutdown_delay = d, started.
func delayApp(t *testing.T, uri string, d time.Duration) *App {
	t.Helper()
	a, _ := readyApp(t, uri, func(c *config.Config) { c.Global.ShutdownDelay = d })
	a.Start()
	return a
}

// pingOnce sends one ping on a new connection and returns the reply's ok
// and code.
func pingOnce(t *testing.T, addr string) (ok float64, code int32) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial during the shutdown delay: %v", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	body, _ := bson.Marshal(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "test"}})
	if _, err := c.Write(wire.AppendMsg(nil, 1, 0, 0, body)); err != nil {
		t.Fatal(err)
	}
	reply, err := wire.ReadMessage(c, nil, wire.DefaultMaxMessageSize)
	if err != nil {
		t.Fatalf("no reply during the shutdown delay: %v", err)
	}
	m, err := wire.ParseMsg(reply)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		OK   float64 `bson:"ok"`
		Code int32   `bson:"code"`
	}
	if err := bson.Unmarshal(m.Body, &doc); err != nil {
		t.Fatal(err)
	}
	return doc.OK, doc.Code
}

// During shutdown_delay /readyz says 503 while new connections and
// requests are served as usual (no drain, no 91); the drain follows.
func TestShutdownDelayServesWithReadyzDown(t *testing.T) {
	up := fakemongo.Start(t, fakemongo.Options{})
	a := delayApp(t, up.URI(), 1500*time.Millisecond)
	if code, body := readyzOf(t, a); code != http.StatusOK {
		t.Fatalf("precondition: /readyz %d %q", code, body)
	}
	start := time.Now()
	done := startGracefulClose(a)
	wait.Until(t, "/readyz to fail", 5*time.Second, 5*time.Millisecond, func() bool {
		code, _ := readyzOf(t, a)
		return code == http.StatusServiceUnavailable
	})
	if _, body := readyzOf(t, a); !strings.Contains(body, "shutting down") {
		t.Errorf("/readyz during the delay: %q, want it to say shutting down", body)
	}
	if a.server.Draining() {
		t.Fatal("the drain began before shutdown_delay ended")
	}
	if ok, code := pingOnce(t, a.Addrs()[0].String()); ok != 1 {
		t.Errorf("a new client's ping during the delay: ok %v code %d, want ok 1", ok, code)
	}
	wait.Until(t, "the drain to begin", 10*time.Second, 5*time.Millisecond, a.server.Draining)
	if el := time.Since(start); el < 1400*time.Millisecond {
		t.Errorf("the drain began %v after GracefulClose, want shutdown_delay (1.5 s) first", el)
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

// The delay ends with the shutdown's context (a bounded stop, or a second
// signal's exit): it never holds the process beyond it.
func TestShutdownDelayEndsWithItsContext(t *testing.T) {
	up := fakemongo.Start(t, fakemongo.Options{})
	a := delayApp(t, up.URI(), time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_ = a.GracefulClose(ctx)
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("GracefulClose took %v with a 200 ms context and shutdown_delay = 1m", el)
	}
}
