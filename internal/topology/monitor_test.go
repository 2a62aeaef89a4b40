package topology

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
	"go.uber.org/goleak"

	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/wait"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// streamOptions monitor with a heartbeat interval far longer than any test:
// whatever happens within a test's bounded waits was pushed by the stream,
// never brought by a heartbeat.
func streamOptions(rec *recorder, hosts ...string) Options {
	o := testOptions(rec, hosts...)
	o.HeartbeatInterval = time.Minute
	o.HeartbeatTimeout = 2 * time.Second
	return o
}

// soon bounds waits that must end far below streamOptions' heartbeat
// interval.
const soon = 5 * time.Second

func within(t testing.TB, what string, cond func() bool) {
	t.Helper()
	wait.Until(t, what, soon, 2*time.Millisecond, cond)
}

// extraHellos counts the hello requests that were not the handshake of a
// new connection: awaitable hellos, RTT probes and polls.
func extraHellos(f *fakemongo.Server) int64 { return f.Requests("hello") - f.Accepted() }

func monitorConns(f *fakemongo.Server) int {
	n := 0
	for _, c := range f.Conns() {
		if c.AppName == monitorApp {
			n++
		}
	}
	return n
}

func topologyCounter(s *Server) int64 {
	if h := s.Hello(); h != nil && h.TopologyVersion != nil {
		return h.TopologyVersion.Counter
	}
	return -1
}

// waitStreaming waits until the monitor's awaitable hello and the RTT
// monitor's first probe have reached the server, over two connections.
func waitStreaming(t testing.TB, f *fakemongo.Server, s *Server) {
	t.Helper()
	within(t, "streaming and RTT connections", func() bool {
		return s.State() == Usable && f.Accepted() == 2 && extraHellos(f) == 2
	})
}

func TestMonitorStreams(t *testing.T) {
	fake := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos, TopologyVersion: true})
	rec := &recorder{}
	topo := newTopology(t, streamOptions(rec, fake.Addr()))
	s := topo.Servers()[0]
	waitStreaming(t, fake, s)

	for i := int64(1); i <= 3; i++ {
		start := time.Now()
		fake.BumpTopologyVersion()
		within(t, "the topology change", func() bool { return topologyCounter(s) == i })
		t.Logf("change %d seen after %v", i, time.Since(start))
	}
	// Three replies to one request: the stream. (The RTT probe is the
	// other extra hello; the next one is due in a minute.)
	if n := extraHellos(fake); n != 2 {
		t.Errorf("%d hello requests besides handshakes, want 2 (one awaitable, one RTT probe)", n)
	}
	if n := fake.Accepted(); n != 2 || monitorConns(fake) != 2 {
		t.Errorf("%d connections accepted, %d monitoring ones open; want 2 and 2", n, monitorConns(fake))
	}
	awaited := 0
	for _, e := range rec.topoEvents(HeartbeatSucceeded, "") {
		if e.Awaited {
			awaited++
		}
	}
	if awaited < 3 {
		t.Errorf("%d awaited heartbeats, want at least 3", awaited)
	}
	if started := len(rec.topoEvents(HeartbeatStarted, "")); started < awaited+1 {
		t.Errorf("%d HeartbeatStarted for %d awaited heartbeats and the handshake", started, awaited)
	}
	if s.State() != Usable || s.Kind() != KindMongos {
		t.Errorf("state %v kind %v", s.State(), s.Kind())
	}
}

// refuseAfterFirst is a MonitorDialer whose first connection works and
// every later dial fails: the RTT monitor never gets a connection.
func refuseAfterFirst(dials *atomic.Int64) *upstream.Dialer {
	var d net.Dialer
	return upstream.NewDialer(upstream.Options{AppName: monitorApp, ConnectTimeout: 2 * time.Second, Logger: testLogger(),
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if dials.Add(1) > 1 {
				return nil, errors.New("test: no second monitoring connection")
			}
			return d.DialContext(ctx, network, addr)
		}})
}

// Streamed replies are no RTT samples, and the RTT monitor's failures
// change nothing and publish nothing.
func TestRTTMonitorFailuresChangeNothing(t *testing.T) {
	fake := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos, TopologyVersion: true})
	rec := &recorder{}
	o := testOptions(rec, fake.Addr())
	o.HeartbeatInterval = 20 * time.Millisecond // streamed replies and RTT attempts every 20ms
	var dials atomic.Int64
	o.MonitorDialer = refuseAfterFirst(&dials)
	topo := newTopology(t, o)
	s := topo.Servers()[0]
	eventually(t, "server Usable", func() bool { return s.State() == Usable })
	// The handshake's sample was added before the server became Usable;
	// from here on only the RTT monitor could add one.
	s.resetRTT()
	awaited := func() int {
		n := 0
		for _, e := range rec.topoEvents(HeartbeatSucceeded, "") {
			if e.Awaited {
				n++
			}
		}
		return n
	}
	eventually(t, "five streamed replies and five failed RTT dials", func() bool {
		return awaited() >= 5 && dials.Load() >= 6
	})
	if rtt := s.RTT(); rtt != 0 {
		t.Errorf("RTT %v: streamed replies or failed probes were taken as samples", rtt)
	}
	if n := len(rec.topoEvents(HeartbeatFailed, "")); n != 0 || s.State() != Usable {
		t.Errorf("%d HeartbeatFailed, state %v: RTT failures must change nothing", n, s.State())
	}
	if n := extraHellos(fake); n != 1 {
		t.Errorf("%d extra hellos, want the one awaitable hello", n)
	}
}

func TestRTTSamplesWhileStreaming(t *testing.T) {
	fake := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos, TopologyVersion: true})
	rec := &recorder{}
	o := testOptions(rec, fake.Addr())
	o.HeartbeatInterval = 20 * time.Millisecond
	topo := newTopology(t, o)
	s := topo.Servers()[0]
	eventually(t, "RTT monitor connected", func() bool { return s.State() == Usable && fake.Accepted() == 2 })
	// With no redial (checked below), every sample after the reset comes
	// from an RTT probe: streamed replies are none (see
	// TestRTTMonitorFailuresChangeNothing).
	for i := range 3 {
		s.resetRTT()
		eventually(t, "an RTT sample", func() bool { return s.RTT() > 0 })
		t.Logf("sample %d: %v", i, s.RTT())
	}
	if n := fake.Accepted(); n != 2 {
		t.Errorf("%d connections accepted, want the streaming and the RTT one", n)
	}
	// One awaitable hello, the rest are probes.
	if n := extraHellos(fake); n < 4 {
		t.Errorf("%d extra hellos, want the awaitable one and at least 3 probes", n)
	}
}

func TestMonitorPolls(t *testing.T) {
	plain := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos})
	tv := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos, TopologyVersion: true})
	for _, c := range []struct {
		name string
		fake *fakemongo.Server
		mode string
	}{
		{"no topologyVersion, auto", plain, ""},
		{"no topologyVersion, stream", plain, MonitoringStream},
		{"topologyVersion, poll", tv, MonitoringPoll},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.fake.ResetCounters()
			accepted := c.fake.Accepted()
			rec := &recorder{}
			o := testOptions(rec, c.fake.Addr())
			o.HeartbeatInterval = 20 * time.Millisecond
			o.MonitoringMode = c.mode
			topo := newTopology(t, o)
			eventually(t, "five polls", func() bool { return c.fake.Requests("hello") >= 6 })
			if n := c.fake.Accepted() - accepted; n != 1 {
				t.Errorf("%d connections, want the monitoring one only (no RTT connection when polling)", n)
			}
			for _, e := range rec.topoEvents(HeartbeatSucceeded, "") {
				if e.Awaited {
					t.Fatal("an awaited heartbeat while polling")
				}
			}
			if s := topo.Servers()[0]; s.State() != Usable || s.RTT() <= 0 {
				t.Errorf("state %v RTT %v", s.State(), s.RTT())
			}
			topo.Close()
			eventually(t, "monitoring connection closed", func() bool { return monitorConns(c.fake) == 0 })
		})
	}
}

// A dropped stream marks the server Unknown and clears its pool, as the
// specification says, and the server, known before, is checked again at
// once on a new connection: Usable again at once. When that fails too, it
// stays Unknown.
func TestStreamDeathRecheckedAtOnce(t *testing.T) {
	fake := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos, TopologyVersion: true})
	rec := &recorder{}
	topo := newTopology(t, streamOptions(rec, fake.Addr()))
	s := topo.Servers()[0]
	waitStreaming(t, fake, s)

	fake.CloseAllConns() // the server stays up
	within(t, "a new streaming connection", func() bool {
		return fake.Accepted() == 3 && extraHellos(fake) == 3 && s.State() == Usable
	})
	failed := rec.topoEvents(HeartbeatFailed, "")
	if len(failed) != 1 || !failed[0].Awaited || !upstream.IsNetworkError(failed[0].Err) {
		t.Fatalf("HeartbeatFailed %+v, want one awaited network error", failed)
	}
	if n := len(rec.topoEvents(ServerChanged, "")); n != 3 {
		t.Errorf("%d server changes, want Unknown>Usable, Usable>Unknown, Unknown>Usable", n)
	}
	eventually(t, "PoolCleared", func() bool { return len(rec.poolEvents(pool.PoolCleared, "")) == 1 })

	fake.Kill() // now the re-check fails too
	within(t, "server Unknown", func() bool { return s.State() == Unknown })
	eventually(t, "the re-check failed", func() bool { return len(rec.topoEvents(HeartbeatFailed, "")) >= 3 })
	failed = rec.topoEvents(HeartbeatFailed, "")
	if !failed[1].Awaited || failed[2].Awaited || !errors.As(failed[2].Err, new(*upstream.ConnectError)) {
		t.Errorf("HeartbeatFailed %+v, want the stream's and the re-check's dial error", failed)
	}
	if err := s.Description().LastError; !errors.As(err, new(*upstream.ConnectError)) {
		t.Errorf("LastError %v, want the re-check's", err)
	}
}

// An application network error cancels the streaming check: the server is
// checked again on a new connection after MinHeartbeatInterval instead of
// staying Unknown until the stream's next reply. A state-change error does
// not: the stream reports the change.
func TestApplicationErrorCancelsStream(t *testing.T) {
	fake := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos, TopologyVersion: true})
	rec := &recorder{}
	topo := newTopology(t, streamOptions(rec, fake.Addr()))
	s := topo.Servers()[0]
	waitStreaming(t, fake, s)
	c := checkOut(t, s)
	accepted := fake.Accepted()

	s.HandleError(&upstream.CommandError{Code: 10107, CodeName: "NotWritablePrimary"}, c)
	if s.State() != Unknown {
		t.Fatal("not Unknown after NotWritablePrimary")
	}
	fake.BumpTopologyVersion()
	within(t, "Usable from the stream", func() bool { return s.State() == Usable })
	if n := fake.Accepted(); n != accepted {
		t.Errorf("a state-change error made the monitor reconnect (%d connections, want %d)", n, accepted)
	}
	if n := len(rec.topoEvents(HeartbeatFailed, "")); n != 0 {
		t.Errorf("%d failed heartbeats", n)
	}

	s.HandleError(&upstream.NetworkError{Addr: fake.Addr(), Op: "read", Err: io.EOF}, c)
	if s.State() != Unknown {
		t.Fatal("not Unknown after a network error")
	}
	within(t, "Usable again from a new monitoring connection", func() bool { return s.State() == Usable })
	failed := rec.topoEvents(HeartbeatFailed, "")
	if len(failed) != 1 || !failed[0].Awaited || !errors.Is(failed[0].Err, errCheckCancelled) {
		t.Errorf("HeartbeatFailed %+v, want the cancelled streaming check", failed)
	}
	if n := fake.Accepted(); n != accepted+1 {
		t.Errorf("%d connections, want one more (the new monitoring connection)", n)
	}
	c.MarkErrored(io.EOF)
	_ = s.Pool().CheckIn(c)
}

// A stream that stops answering fails after HeartbeatTimeout +
// HeartbeatInterval: a timeout, which interrupts in-use connections.
func TestStreamTimeout(t *testing.T) {
	fake := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos, TopologyVersion: true})
	// Awaitable hellos go unanswered; the rest as usual.
	fake.Handle("hello", func(req *fakemongo.Request) fakemongo.Reply {
		if _, ok := req.Lookup("topologyVersion").DocumentOK(); ok {
			return fakemongo.Reply{NoReply: true}
		}
		return fake.Builtin(req)
	})
	rec := &recorder{}
	o := testOptions(rec, fake.Addr())
	o.HeartbeatInterval = 100 * time.Millisecond
	o.HeartbeatTimeout = 200 * time.Millisecond
	topo := newTopology(t, o)
	s := topo.Servers()[0]
	eventually(t, "PoolCleared", func() bool { return len(rec.poolEvents(pool.PoolCleared, "")) > 0 })
	if ev := rec.poolEvents(pool.PoolCleared, "")[0]; !ev.InterruptInUseConnections {
		t.Errorf("stream timeout cleared with %+v, want InterruptInUseConnections", ev)
	}
	f := rec.topoEvents(HeartbeatFailed, "")[0]
	if !f.Awaited || !isTimeout(f.Err) || f.Duration < 300*time.Millisecond {
		t.Errorf("HeartbeatFailed %+v: want an awaited timeout after 300ms", f)
	}
	if !strings.Contains(f.Err.Error(), "maxAwaitTime") {
		t.Errorf("error %q does not explain the timeout", f.Err)
	}
	// The known server was checked again at once, and the new connection's
	// handshake made it Usable again.
	eventually(t, "Usable again", func() bool { return s.State() == Usable })
}

// A streamed ok:0 is a failed check: Unknown and cleared, no immediate retry.
func TestStreamCommandError(t *testing.T) {
	fake := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos, TopologyVersion: true})
	var failed atomic.Bool
	fake.Handle("hello", func(req *fakemongo.Request) fakemongo.Reply {
		if _, ok := req.Lookup("topologyVersion").DocumentOK(); ok && failed.CompareAndSwap(false, true) {
			return fakemongo.Error(91, "ShutdownInProgress", "shutting down")
		}
		return fake.Builtin(req)
	})
	rec := &recorder{}
	topo := newTopology(t, streamOptions(rec, fake.Addr()))
	s := topo.Servers()[0]
	within(t, "server Unknown", func() bool { return s.State() == Unknown && s.Checked() })
	var ce *upstream.CommandError
	if err := s.Description().LastError; !errors.As(err, &ce) || ce.Code != 91 {
		t.Fatalf("LastError %v", err)
	}
	// The description is published before the pool is cleared.
	eventually(t, "PoolCleared", func() bool { return len(rec.poolEvents(pool.PoolCleared, "")) > 0 })
	if ev := rec.poolEvents(pool.PoolCleared, ""); len(ev) != 1 || ev[0].InterruptInUseConnections {
		t.Errorf("PoolCleared %+v, want one without interruption", ev)
	}
	// A requested check (as selection makes) brings it back.
	s.RequestCheck()
	within(t, "Usable again", func() bool { return s.State() == Usable })
}

// A server that answers awaitable hellos at once does not get one more
// than every MinHeartbeatInterval.
func TestAwaitableHelloRateLimited(t *testing.T) {
	fake := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos, TopologyVersion: true})
	var awaitable atomic.Int64
	fake.Handle("hello", func(req *fakemongo.Request) fakemongo.Reply {
		if _, ok := req.Lookup("topologyVersion").DocumentOK(); ok {
			awaitable.Add(1)
		}
		return fake.Builtin(req) // answers at once, without streaming
	})
	o := streamOptions(&recorder{}, fake.Addr())
	o.MinHeartbeatInterval = 50 * time.Millisecond
	start := time.Now()
	newTopology(t, o)
	within(t, "five awaitable hellos", func() bool { return awaitable.Load() >= 5 })
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Errorf("five awaitable hellos within %v: not rate-limited to one per 50ms", d)
	}
}

// Close interrupts a streaming check at once rather than after the
// server's next reply, and closes both monitoring connections.
func TestCloseStopsStreaming(t *testing.T) {
	fake := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos, TopologyVersion: true})
	before := goleak.IgnoreCurrent()
	topo, err := New("closing", streamOptions(&recorder{}, fake.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	waitStreaming(t, fake, topo.Servers()[0])
	start := time.Now()
	topo.Close()
	if d := time.Since(start); d > soon {
		t.Errorf("Close took %v", d)
	}
	within(t, "monitoring connections closed", func() bool { return monitorConns(fake) == 0 })
	// The monitor, its watcher and the RTT goroutine are gone, and so are
	// the fake's goroutines serving the two connections.
	goleak.VerifyNone(t, before)
}

func TestMonitoringModeOption(t *testing.T) {
	o := testOptions(&recorder{}, "127.0.0.1:27017")
	d, err := o.withDefaults()
	if err != nil || d.MonitoringMode != MonitoringAuto {
		t.Fatalf("default mode %q, %v", d.MonitoringMode, err)
	}
	for _, m := range []string{MonitoringAuto, MonitoringStream, MonitoringPoll} {
		o.MonitoringMode = m
		if _, err := o.withDefaults(); err != nil {
			t.Errorf("%s: %v", m, err)
		}
	}
	o.MonitoringMode = "streaming"
	if _, err := o.withDefaults(); err == nil || !strings.Contains(err.Error(), "monitoring mode") {
		t.Errorf("unknown mode: %v", err)
	}
}

// A server that stops sending topologyVersion (replaced by one without
// awaitable hello) is polled from its next connection on, and the RTT
// connection goes away.
func TestStreamFallsBackToPolling(t *testing.T) {
	fake := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos, TopologyVersion: true})
	var plain atomic.Bool
	fake.Handle("hello", func(req *fakemongo.Request) fakemongo.Reply {
		r := fake.Builtin(req)
		if !plain.Load() {
			if _, ok := req.Lookup("topologyVersion").DocumentOK(); ok {
				return fakemongo.Reply{NoReply: true} // no stream needed before the switch
			}
			return r
		}
		b := bsoncore.NewDocumentBuilder()
		elems, _ := r.Docs[0].Elements()
		for _, e := range elems {
			if e.Key() != "topologyVersion" {
				b.AppendValue(e.Key(), e.Value())
			}
		}
		return fakemongo.Reply{Docs: []bsoncore.Document{b.Build()}}
	})
	rec := &recorder{}
	o := streamOptions(rec, fake.Addr())
	topo := newTopology(t, o)
	s := topo.Servers()[0]
	waitStreaming(t, fake, s)

	plain.Store(true)
	fake.CloseAllConns()
	within(t, "polled on one connection", func() bool {
		return s.State() == Usable && s.Hello().TopologyVersion == nil && fake.Accepted() == 3 && monitorConns(fake) == 1
	})
	// Polled: a requested check is one more hello on the same connection.
	n := fake.Requests("hello")
	s.RequestCheck()
	within(t, "a polled hello", func() bool { return fake.Requests("hello") == n+1 })
	for _, e := range rec.topoEvents(HeartbeatSucceeded, "") {
		if e.Awaited {
			t.Fatal("an awaited heartbeat") // the stream never answered
		}
	}
	if fake.Accepted() != 3 {
		t.Errorf("%d connections, want no new one after the switch", fake.Accepted())
	}
}
