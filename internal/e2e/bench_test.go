package e2e

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/xdg-go/scram"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// benchPing runs b.N raw ping round trips against addr over conns
// connections, and reports allocations of the whole process (proxy
// included when addr is mongobouncer).
func benchPing(b *testing.B, addr string, conns int) { benchPingAs(b, addr, conns, nil) }

// benchPingAs is benchPing by clients that each run login (when not nil)
// after their hello.
func benchPingAs(b *testing.B, addr string, conns int, login func(*rawClient)) {
	ping := docOf(b, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}})
	clients := make([]net.Conn, conns)
	for i := range clients {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		clients[i] = c
		r := &rawClient{t: b, c: c}
		r.hello()
		if login != nil {
			login(r)
		}
		_ = c.SetDeadline(time.Time{})
	}
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	per := b.N / conns
	for i, c := range clients {
		n := per
		if i == 0 {
			n += b.N % conns
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := wire.AppendMsg(nil, 1, 0, 0, ping)
			var buf []byte
			for j := 0; j < n; j++ {
				if _, err := c.Write(out); err != nil {
					b.Error(err)
					return
				}
				msg, err := wire.ReadMessage(c, buf[:0], wire.DefaultMaxMessageSize)
				if err != nil {
					b.Error(err)
					return
				}
				buf = msg[:0]
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "ops/s")
}

func BenchmarkPing(b *testing.B) {
	oneIO(b) // the shipped configuration
	up := fakemongo.Start(b, fakemongo.Options{})
	_, addr := bouncer(b, up.URI(), mode("statement", 10))
	for _, conns := range []int{1, 100} {
		b.Run("direct/clients="+itoa(conns), func(b *testing.B) { benchPing(b, up.Addr(), conns) })
		b.Run("proxied/clients="+itoa(conns), func(b *testing.B) { benchPing(b, addr, conns) })
	}
}

// BenchmarkPingLoggedIn is issue 19's "an authenticated client's
// operations on the event loop are as fast as before": the same proxied
// pings by clients that did not log in (auth_type = "none"), and by
// clients that logged in with SCRAM first, to a route with no upstream
// login and to a pass-through route (the user's own pool upstream). Run
// the three alternately (-count) and compare.
func BenchmarkPingLoggedIn(b *testing.B) {
	oneIO(b) // the shipped configuration
	up := fakemongo.Start(b, fakemongo.Options{Users: []fakemongo.User{{Name: "app", Password: "app-pw"}}})
	users := filepath.Join(b.TempDir(), "users.txt")
	if err := os.WriteFile(users, []byte(`"app@admin" "app-pw"`+"\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	withAuth := func(pass bool) func(*config.Config) {
		return func(c *config.Config) {
			mode("statement", 10)(c)
			c.Global.AuthType, c.Global.AuthFile = config.AuthSCRAM, users
			r := c.Databases["*"]
			r.PassThrough = &pass
			c.Databases["*"] = r
		}
	}
	_, open := bouncer(b, up.URI(), mode("statement", 10))
	_, gate := bouncer(b, up.URI(), withAuth(false))
	_, pass := bouncer(b, up.URI(), withAuth(true))
	login := func(r *rawClient) {
		cl, err := scram.SHA256.NewClient("app", "app-pw", "")
		if err != nil {
			b.Fatal(err)
		}
		if rep := scramLogin(b, r, cl); okOf(rep) != 1 {
			b.Fatalf("login: %v", rep)
		}
	}
	for _, conns := range []int{1, 100} {
		b.Run("open/clients="+itoa(conns), func(b *testing.B) { benchPingAs(b, open, conns, nil) })
		b.Run("loggedIn/clients="+itoa(conns), func(b *testing.B) { benchPingAs(b, gate, conns, login) })
		b.Run("passThrough/clients="+itoa(conns), func(b *testing.B) { benchPingAs(b, pass, conns, login) })
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestProxiedRequestDoesNotAllocate guards the hot path: a proxied ping,
// with metrics attached, allocates nothing in the whole process beyond
// pooled buffers. The count is process-wide (heartbeats included), so the
// bound is an average well under one allocation per request.
func TestProxiedRequestDoesNotAllocate(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		if raceEnabled {
			t.Skip("allocation counts are meaningless under the race detector")
		}
		up := fakemongo.Start(t, fakemongo.Options{})
		_, addr := bouncer(t, up.URI(), func(c *config.Config) {
			c.Global.PoolMode = "statement"
			c.Global.HeartbeatInterval = time.Minute
		})
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		(&rawClient{t: t, c: c}).hello()
		_ = c.SetDeadline(time.Time{})
		out := wire.AppendMsg(nil, 1, 0, 0, docOf(t, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}}))
		buf := make([]byte, 0, 1024)
		ping := func() {
			if _, err := c.Write(out); err != nil {
				t.Fatal(err)
			}
			if _, err := wire.ReadMessage(c, buf, wire.DefaultMaxMessageSize); err != nil {
				t.Fatal(err)
			}
		}
		for range 200 { // warm the pools
			ping()
		}
		if avg := testing.AllocsPerRun(2000, ping); avg > 0.05 {
			t.Fatalf("%.3f allocations per proxied request, want ~0", avg)
		}
	})
}
