package e2e

// Awaitable hello and quiesce seen by real drivers (internal/hello, proxy/hello.go):
// the Go driver streams its monitoring and hears of a drain at once; in
// poll mode its monitor still works; an insert caught by a drain is
// retried on another mongobouncer, not surfaced; a streaming monitor
// outlives client_login_timeout.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// sdamWatch records what a driver's topology says of its servers.
type sdamWatch struct {
	mu       sync.Mutex
	unknown  time.Time // the first change to Unknown after arm
	armed    bool
	awaited  atomic.Int64 // streamed heartbeats
	polled   atomic.Int64 // polled heartbeats
	failed   atomic.Int64
	lastFail atomic.Value
}

func (w *sdamWatch) monitor() *event.ServerMonitor {
	return &event.ServerMonitor{
		ServerDescriptionChanged: func(e *event.ServerDescriptionChangedEvent) {
			w.mu.Lock()
			defer w.mu.Unlock()
			if w.armed && w.unknown.IsZero() && e.NewDescription.Kind == "Unknown" {
				w.unknown = time.Now()
			}
		},
		ServerHeartbeatSucceeded: func(e *event.ServerHeartbeatSucceededEvent) {
			if e.Awaited {
				w.awaited.Add(1)
			} else {
				w.polled.Add(1)
			}
		},
		ServerHeartbeatFailed: func(e *event.ServerHeartbeatFailedEvent) {
			w.failed.Add(1)
			w.lastFail.Store(e.Failure.Error())
		},
	}
}

func (w *sdamWatch) arm() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.armed = true
}

func (w *sdamWatch) unknownAt() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.unknown
}

// With serverMonitoringMode=stream and a heartbeat of 10s, the driver's
// topology marks mongobouncer Unknown within a second of the drain's start,
// before any request of the application: the streaming hello returns at
// once with the quiesce reply. With polling, the monitor works as before
// (it needs no topologyVersion) and hears of the drain at its next check.
func TestDriverSeesDrainAtOnce(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		a, addr := bouncer(t, up.URI(), mode("transaction", 2))
		var w sdamWatch
		cl := driverWith(t, addr, "&heartbeatFrequencyMS=10000", func(o *options.ClientOptions) {
			// Go driver v2.9.3 parses serverMonitoringMode in a URI but
			// does not apply it: set it here.
			o.SetServerMonitoringMode(options.ServerMonitoringModeStream)
			o.SetServerMonitor(w.monitor())
		})
		if err := cl.Ping(ctxT(t, 10*time.Second), nil); err != nil {
			t.Fatal(err)
		}
		// The monitor's handshake gave a topologyVersion: it streams.
		waitFor(t, "the driver's streaming hello", func() bool { return a.Server().HellosWaiting() >= 1 })
		w.arm()
		began := time.Now()
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			done <- a.GracefulClose(ctx)
		}()
		waitFor(t, "the driver to mark mongobouncer Unknown", func() bool { return !w.unknownAt().IsZero() })
		if d := w.unknownAt().Sub(began); d > time.Second {
			t.Errorf("the driver saw the drain %v after it began, want under 1s (heartbeat 10s)", d)
		} else {
			t.Logf("the driver saw the drain %v after it began", d)
		}
		if err := <-done; err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
}

// serverMonitoringMode=poll: plain hellos every heartbeat, answered ok
// with the topologyVersion; nothing waits.
func TestDriverPollsWithTopologyVersion(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		a, addr := bouncer(t, up.URI(), mode("transaction", 2))
		var w sdamWatch
		cl := driverWith(t, addr, "&heartbeatFrequencyMS=500", func(o *options.ClientOptions) {
			o.SetServerMonitoringMode(options.ServerMonitoringModePoll)
			o.SetServerMonitor(w.monitor())
		})
		if err := cl.Ping(ctxT(t, 10*time.Second), nil); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "3 polled heartbeats", func() bool { return w.polled.Load() >= 3 })
		if n, f := w.awaited.Load(), w.failed.Load(); n != 0 || f != 0 || a.Server().HellosWaiting() != 0 {
			t.Errorf("poll mode: %d streamed, %d failed (%v), %d waiting hellos; want 0", n, f, w.lastFail.Load(), a.Server().HellosWaiting())
		}
		if err := cl.Ping(ctxT(t, 10*time.Second), nil); err != nil {
			t.Fatal(err)
		}
	})
}

// An insert that a drain answers 91 is retried by the driver (the reply
// carries RetryableWriteError, as a server's does) on the other
// mongobouncer, not surfaced to the application. The drain is held open
// by a transaction, and the driver polls every 10s, so the first insert
// sent to the draining instance meets the 91 itself.
func TestInsertDuringDrainIsRetried(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		a, addrA := bouncer(t, up.URI(), mode("transaction", 4))
		_, addrB := bouncer(t, up.URI(), mode("transaction", 4))
		var got91 atomic.Int64
		cl := driverWith(t, addrA+","+addrB, "&heartbeatFrequencyMS=10000&localThresholdMS=1000", func(o *options.ClientOptions) {
			o.SetServerMonitoringMode(options.ServerMonitoringModePoll)
			o.SetMonitor(&event.CommandMonitor{Failed: func(_ context.Context, e *event.CommandFailedEvent) {
				if strings.Contains(e.Failure.Error(), "ShutdownInProgress") {
					got91.Add(1)
				}
			}})
		})
		coll := cl.Database("test").Collection("drain")
		for i := range 20 {
			if _, err := coll.InsertOne(ctxT(t, 10*time.Second), bson.D{{Key: "n", Value: i}}); err != nil {
				t.Fatal(err)
			}
		}
		// An open transaction on A holds its drain.
		raw := dialRaw(t, addrA)
		raw.hello()
		lsid := newLSID(0x29)
		if r := raw.cmd(txnCmd("insert", lsid, 1, true)); okOf(r) != 1 {
			t.Fatalf("start: %v", r)
		}
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			done <- a.GracefulClose(ctx)
		}()
		waitDraining(t, a, addrA)
		var surfaced []error
		for i := range 40 {
			if _, err := coll.InsertOne(ctxT(t, 10*time.Second), bson.D{{Key: "n", Value: 100 + i}}); err != nil {
				surfaced = append(surfaced, err)
			}
			if got91.Load() > 0 && i >= 20 {
				break
			}
		}
		if r := raw.cmd(txnCmd("commitTransaction", lsid, 1, false)); okOf(r) != 1 {
			t.Errorf("commit: %v", r)
		}
		if err := <-done; err != nil {
			t.Errorf("shutdown: %v", err)
		}
		if got91.Load() == 0 {
			t.Fatal("no insert met the drain's 91: the test did not exercise the retry")
		}
		if len(surfaced) > 0 {
			t.Fatalf("%d inserts failed in the application during the drain, want 0 (retried): first %v", len(surfaced), surfaced[0])
		}
	})
}

// A streaming monitor never logs in and sends nothing after its first
// awaitable hello: with client authentication on and client_login_timeout
// 1s, a heartbeat of 2s streams without a failed heartbeat.
func TestStreamingMonitorOutlivesLoginTimeout(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		a, addr, _ := authSetupWith(t, up.URI(), nil, loginTimeoutTOML)
		waitUsable(t, a, 1)
		var w sdamWatch
		// The application logs in; its monitor, as every driver's, does not.
		cl := driverWith(t, addr, "&heartbeatFrequencyMS=2000", func(o *options.ClientOptions) {
			o.SetServerMonitoringMode(options.ServerMonitoringModeStream)
			o.SetServerMonitor(w.monitor())
			o.SetAuth(options.Credential{AuthSource: "admin", Username: "app", Password: authUsers["app"]})
		})
		if err := cl.Ping(ctxT(t, 10*time.Second), nil); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Second)
		if n := w.failed.Load(); n != 0 {
			t.Fatalf("%d heartbeats failed (last: %v), want 0", n, w.lastFail.Load())
		}
		if n := w.awaited.Load(); n < 2 {
			t.Fatalf("%d streamed heartbeats in 5s at 2s, want at least 2", n)
		}
		if err := cl.Ping(ctxT(t, 10*time.Second), nil); err != nil {
			t.Fatal(err)
		}
	})
}

// A streaming monitor gets a reply each heartbeat, for as long as it
// streams, in stream mode and in the default (auto) mode.
func TestDriverStreamsHeartbeats(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		a, addr := bouncer(t, up.URI(), mode("transaction", 2))
		for _, m := range []string{options.ServerMonitoringModeStream, options.ServerMonitoringModeAuto} {
			var w sdamWatch
			cl := driverWith(t, addr, "&heartbeatFrequencyMS=500", func(o *options.ClientOptions) {
				o.SetServerMonitoringMode(m)
				o.SetServerMonitor(w.monitor())
			})
			if err := cl.Ping(ctxT(t, 10*time.Second), nil); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "5 streamed heartbeats", func() bool { return w.awaited.Load() >= 5 })
			if f := w.failed.Load(); f != 0 {
				t.Errorf("%s: %d heartbeats failed (%v)", m, f, w.lastFail.Load())
			}
			if a.Server().HellosWaiting() < 1 {
				t.Errorf("%s: no hello streaming", m)
			}
		}
	})
}

// The Node driver streams its monitoring too (serverMonitoringMode
// stream, heartbeat 10s), and marks mongobouncer Unknown within a second of
// the drain's start.
func TestNodeDriverSeesDrainAtOnce(t *testing.T) {
	modules := nodeModulesPath(t)
	script, err := filepath.Abs(filepath.Join("testdata", "node_drain.js"))
	must(t, err)
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		a, addr := bouncer(t, up.URI(), mode("transaction", 2))
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, "node", script, "mongodb://"+addr+"/test", "stream")
		home := t.TempDir()
		cmd.Env = append(os.Environ(), "HOME="+home, "NODE_PATH="+modules)
		cmd.Dir = home
		cmd.WaitDelay = 5 * time.Second
		var stderr strings.Builder
		cmd.Stderr = &stderr
		stdin, err := cmd.StdinPipe()
		must(t, err)
		stdout, err := cmd.StdoutPipe()
		must(t, err)
		must(t, cmd.Start())
		defer func() { _ = cmd.Wait() }()
		lines := bufio.NewScanner(stdout)
		if !lines.Scan() || lines.Text() != "ready" {
			t.Fatalf("node: %q, want ready; stderr:\n%s", lines.Text(), stderr.String())
		}
		waitFor(t, "the Node driver's streaming hello", func() bool { return a.Server().HellosWaiting() >= 1 })
		_, err = io.WriteString(stdin, "go\n")
		must(t, err)
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			done <- a.GracefulClose(ctx)
		}()
		if !lines.Scan() {
			t.Fatalf("node ended without a line; stderr:\n%s", stderr.String())
		}
		var ms, awaited int
		if _, err := fmt.Sscanf(lines.Text(), "unknown %d awaited %d", &ms, &awaited); err != nil || ms < 0 || ms > 1000 {
			t.Errorf("node: %q (%v), want the server Unknown within 1000ms of the drain", lines.Text(), err)
		}
		t.Logf("node: %s", lines.Text())
		if err := <-done; err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
}
