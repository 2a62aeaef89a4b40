package e2e

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.uber.org/goleak"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// A route's client_idle_timeout applies to clients whose most recent
// request went to that route, and to every client of the route's own
// listener; other clients keep the global one (here: none).
func TestRouteClientIdleTimeout(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		ignore := goleak.IgnoreCurrent()
		t.Cleanup(func() { goleak.VerifyNone(t, ignore) })

		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		short := 400 * time.Millisecond
		a, addr := bouncer(t, up.URI(), func(c *config.Config) {
			c.Databases["brief"] = config.Route{ConnectionString: config.URI(up.URI()), Overrides: config.Overrides{ClientIdleTimeout: &short}}
			c.Databases["kiosk"] = config.Route{ConnectionString: config.URI(up.URI()), Listen: "127.0.0.1:0", Overrides: config.Overrides{ClientIdleTimeout: &short}}
		})
		ping := func(db string) bson.D { return bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: db}} }

		brief := dialRaw(t, addr) // its last request goes to "brief"
		brief.hello()
		if body := brief.cmd(ping("other")); okOf(body) != 1 {
			t.Fatalf("ping: %v", body)
		}
		if body := brief.cmd(ping("brief")); okOf(body) != 1 {
			t.Fatalf("ping: %v", body)
		}
		back := dialRaw(t, addr) // used "brief", then another route
		back.hello()
		for _, db := range []string{"brief", "other"} {
			if body := back.cmd(ping(db)); okOf(body) != 1 {
				t.Fatalf("ping %s: %v", db, body)
			}
		}
		var kioskAddr string
		for _, ad := range a.Addrs()[1:] {
			kioskAddr = ad.String()
		}
		kiosk := dialRaw(t, kioskAddr) // the route's own listener, no request
		start := time.Now()

		for _, c := range []*rawClient{brief, kiosk} {
			if !c.closed(10 * time.Second) {
				t.Fatalf("a client of route brief/kiosk still connected 10s into its 400ms client_idle_timeout")
			}
		}
		if d := time.Since(start); d < 300*time.Millisecond {
			t.Fatalf("closed after %v, before the route's client_idle_timeout", d)
		}
		// The global timeout is none: the client whose last request went to
		// another route stays.
		if back.closed(time.Second) {
			t.Fatal("a client whose last request went to a route without client_idle_timeout was closed")
		}
		if body := back.cmd(ping("other")); okOf(body) != 1 {
			t.Fatalf("ping after the others were closed: %v", body)
		}
	})
}

// A route's max_message_size bounds the requests sent to it: over it, an
// error reply naming the route and the limit; the client stays connected
// and other routes take the same message.
func TestRouteMaxMessageSize(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		ignore := goleak.IgnoreCurrent()
		t.Cleanup(func() { goleak.VerifyNone(t, ignore) })

		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		small := 32 * 1024
		_, addr := bouncer(t, up.URI(), func(c *config.Config) {
			c.Databases["small"] = config.Route{ConnectionString: config.URI(up.URI()), Overrides: config.Overrides{MaxMessageSize: &small}}
		})
		r := dialRaw(t, addr)
		r.hello()
		insert := func(db string, id, size int) bson.D {
			return bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{bson.D{{Key: "_id", Value: id}, {Key: "s", Value: strings.Repeat("x", size)}}}}, {Key: "$db", Value: db}}
		}
		if body := r.cmd(insert("small", 1, 1000)); okOf(body) != 1 {
			t.Fatalf("small insert: %v", body)
		}
		body := r.cmd(insert("small", 2, 2*small))
		malCheckError(t, body, 10334, `route "small"'s max_message_size of 32768 bytes`)
		if body := r.cmd(insert("other", 3, 2*small)); okOf(body) != 1 {
			t.Fatalf("the same size to another route: %v", body)
		}
		if body := r.cmd(insert("small", 4, 1000)); okOf(body) != 1 {
			t.Fatalf("after the refused message: %v", body)
		}
		if docs := up.Collection("small", "c"); len(docs) != 2 {
			t.Fatalf("upstream holds %d documents in small.c, want 2", len(docs))
		}
	})
}

// A reload that gives a route a client_idle_timeout applies it to the
// clients already connected (with the event loop, which owns idle
// clients), and the reload reports it. Not with a goroutine per client: a
// client waiting in a read since before the reload gets the new value at
// its next command (docs/operations.md, SIGHUP).
func TestReloadRouteClientIdleTimeout(t *testing.T) {
	loopIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		route := func(extra string) string {
			return baseTOML(up.URI(), "") + fmt.Sprintf("\n[databases.brief]\nconnection_string = %q\n%s", up.URI(), extra)
		}
		a, addr, path := fileBouncer(t, route(""))
		c := dialRaw(t, addr)
		c.hello()
		if body := c.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "brief"}}); okOf(body) != 1 {
			t.Fatalf("ping: %v", body)
		}
		if c.closed(700 * time.Millisecond) {
			t.Fatal("closed with no client_idle_timeout")
		}
		if err := os.WriteFile(path, []byte(route(`client_idle_timeout = "300ms"`)), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := a.Reload(); err != nil {
			t.Fatal(err)
		}
		if !c.closed(10 * time.Second) {
			t.Fatal("still connected 10s after a reload set its route's client_idle_timeout to 300ms")
		}
	})
}
