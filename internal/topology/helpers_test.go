package topology

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/testutil/wait"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Application names let fail points tell monitoring connections from pool
// connections.
const (
	poolApp    = "topology-test-pool"
	monitorApp = "topology-test-monitor"
)

// testLogger discards logs unless TOPOLOGY_TEST_LOG is set.
func testLogger() *slog.Logger {
	if os.Getenv("TOPOLOGY_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// recorder collects pool and topology events.
type recorder struct {
	mu   sync.Mutex
	pool []pool.Event // guarded by mu
	topo []Event      // guarded by mu
}

func (r *recorder) HandleEvent(e pool.Event) {
	r.mu.Lock()
	r.pool = append(r.pool, e)
	r.mu.Unlock()
}

func (r *recorder) onEvent(e Event) {
	r.mu.Lock()
	r.topo = append(r.topo, e)
	r.mu.Unlock()
}

func (r *recorder) poolEvents(typ pool.EventType, addr string) []pool.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []pool.Event
	for _, e := range r.pool {
		if e.Type == typ && (addr == "" || e.Address == addr) {
			out = append(out, e)
		}
	}
	return out
}

func (r *recorder) topoEvents(typ EventType, addr string) []Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Event
	for _, e := range r.topo {
		if e.Type == typ && (addr == "" || e.Address == addr) {
			out = append(out, e)
		}
	}
	return out
}

// testOptions are fast-heartbeat options for hosts. Tests adjust them.
func testOptions(rec *recorder, hosts ...string) Options {
	po := pool.DefaultOptions()
	po.Monitor = rec
	return Options{
		Hosts:                  hosts,
		Pool:                   po,
		Dialer:                 upstream.NewDialer(upstream.Options{AppName: poolApp, ConnectTimeout: 2 * time.Second, Logger: testLogger()}),
		MonitorDialer:          upstream.NewDialer(upstream.Options{AppName: monitorApp, ConnectTimeout: 2 * time.Second, Logger: testLogger()}),
		HeartbeatInterval:      100 * time.Millisecond,
		MinHeartbeatInterval:   10 * time.Millisecond,
		HeartbeatTimeout:       time.Second,
		ServerSelectionTimeout: 5 * time.Second,
		LocalThreshold:         -1, // loopback RTTs jitter on a busy machine
		OnEvent:                rec.onEvent,
		Logger:                 testLogger(),
	}
}

func newTopology(t testing.TB, o Options) *Topology {
	t.Helper()
	topo, err := New("test", o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(topo.Close)
	return topo
}

// eventually polls cond every few milliseconds for up to 10s (a generous
// bound: the conditions normally hold within a few heartbeats).
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	wait.Until(t, what, 10*time.Second, 5*time.Millisecond, cond)
}

func ctxTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// deadAddr returns a loopback address where nothing listens.
func deadAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

func mustSelect(t testing.TB, topo *Topology) *Server {
	t.Helper()
	s, err := topo.SelectServer(ctxTimeout(t, 10*time.Second), Criteria{})
	if err != nil {
		t.Fatalf("SelectServer: %v", err)
	}
	return s
}

func checkOut(t testing.TB, s *Server) *pool.Conn {
	t.Helper()
	c, err := s.Pool().CheckOut(ctxTimeout(t, 10*time.Second))
	if err != nil {
		t.Fatalf("CheckOut: %v", err)
	}
	return c
}
