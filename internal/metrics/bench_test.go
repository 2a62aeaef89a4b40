package metrics

import (
	"context"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/pool"
)

// steadyPool returns a monitor that has seen a pool with one connection.
func steadyPool(m *Metrics) pool.Monitor {
	mon := m.PoolMonitor("app")
	mon.HandleEvent(poolCreated("db:27017", 100))
	mon.HandleEvent(pool.Event{Type: pool.ConnectionCreated, Address: "db:27017", ConnectionID: 1, Counts: pool.Counts{Total: 1, Pending: 1}})
	mon.HandleEvent(pool.Event{Type: pool.ConnectionReady, Address: "db:27017", ConnectionID: 1, Counts: pool.Counts{Total: 1, Pending: 1}})
	return mon
}

var (
	evStarted = pool.Event{Type: pool.ConnectionCheckOutStarted, Address: "db:27017", Counts: pool.Counts{Total: 1, Available: 1}}
	evOut     = pool.Event{Type: pool.ConnectionCheckedOut, Address: "db:27017", ConnectionID: 1, Duration: 40 * time.Microsecond, Counts: pool.Counts{Total: 1, InUse: 1}}
	evIn      = pool.Event{Type: pool.ConnectionCheckedIn, Address: "db:27017", ConnectionID: 1, Counts: pool.Counts{Total: 1, InUse: 1}}
)

// The proxy's and the pool's steady state allocate nothing.
func TestHotPathsDoNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	m := New()
	mon := steadyPool(m)
	m.Request("app", "find", 100, 200, time.Millisecond, true)
	m.UpstreamError("app", 11000)
	cases := map[string]func(){
		"Request":       func() { m.Request("app", "find", 100, 200, time.Millisecond, false) },
		"UpstreamError": func() { m.UpstreamError("app", 11000) },
		"Clients":       func() { m.ClientConnected(); m.ClientDisconnected() },
		"CheckoutCycle": func() { mon.HandleEvent(evStarted); mon.HandleEvent(evOut); mon.HandleEvent(evIn) },
	}
	for name, f := range cases {
		if n := testing.AllocsPerRun(1000, f); n != 0 {
			t.Errorf("%s: %v allocs per run, want 0", name, n)
		}
	}
}

func BenchmarkRequest(b *testing.B) {
	m := New()
	m.Request("app", "find", 100, 200, time.Millisecond, true)
	b.ReportAllocs()
	for b.Loop() {
		m.Request("app", "find", 100, 200, time.Millisecond, true)
	}
}

func BenchmarkRequestParallel(b *testing.B) {
	m := New()
	m.Request("app", "find", 100, 200, time.Millisecond, true)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.Request("app", "find", 100, 200, time.Millisecond, true)
		}
	})
}

func BenchmarkUpstreamError(b *testing.B) {
	m := New()
	m.UpstreamError("app", 11000)
	b.ReportAllocs()
	for b.Loop() {
		m.UpstreamError("app", 11000)
	}
}

// BenchmarkHandleEvent is one event of a checkout cycle (started, checked
// out, checked in), averaged: what the monitor adds under the pool's lock.
func BenchmarkHandleEvent(b *testing.B) {
	m := New()
	mon := steadyPool(m)
	evs := [...]pool.Event{evStarted, evOut, evIn}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		mon.HandleEvent(evs[i%3])
		i++
	}
}

// cycleOnce is one checkout and check-in on p.
func cycleOnce(ctx context.Context, p *pool.Pool) error {
	c, err := p.CheckOut(ctx)
	if err != nil {
		return err
	}
	return p.CheckIn(c)
}

// benchCycle runs run on a ready real pool, without a monitor and with the
// metrics monitor, as two sub-benchmarks.
func benchCycle(b *testing.B, run func(b *testing.B, p *pool.Pool)) {
	for _, withMetrics := range []bool{false, true} {
		name := "nomonitor"
		if withMetrics {
			name = "metrics"
		}
		b.Run(name, func(b *testing.B) {
			o := pool.DefaultOptions()
			o.MaintenanceInterval = -1
			if withMetrics {
				o.Monitor = New().PoolMonitor("app")
			}
			p, err := pool.New("db:27017", &mockConnector{}, o)
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			if err := p.Ready(); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			run(b, p)
		})
	}
}

// BenchmarkPoolCheckoutCycle is a real pool's CheckOut+CheckIn fast path
// with and without the metrics monitor.
func BenchmarkPoolCheckoutCycle(b *testing.B) {
	benchCycle(b, func(b *testing.B, p *pool.Pool) {
		ctx := b.Context()
		for b.Loop() {
			if err := cycleOnce(ctx, p); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkPoolCheckoutCycleParallel is BenchmarkPoolCheckoutCycle from
// every P at once, as the proxy's loop threads run it: what the monitor's
// shared cache lines cost when they move between cores.
func BenchmarkPoolCheckoutCycleParallel(b *testing.B) {
	benchCycle(b, func(b *testing.B, p *pool.Pool) {
		ctx := b.Context()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := cycleOnce(ctx, p); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

func BenchmarkStats(b *testing.B) {
	m := New()
	for i := range 10000 {
		m.queryHist.record(time.Duration(i) * time.Microsecond)
		m.waitHist.record(time.Duration(i) * time.Microsecond)
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = m.Stats()
	}
}
