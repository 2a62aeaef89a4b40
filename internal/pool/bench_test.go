package pool_test

import (
	"context"
	"io"
	"log/slog"
	"runtime"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/pool"
)

// benchPool returns a ready pool with one established, available connection.
func benchPool(tb testing.TB, o pool.Options) *pool.Pool {
	tb.Helper()
	p, err := pool.New("127.0.0.1:27017", &mockConnector{}, o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Close)
	if err := p.Ready(); err != nil {
		tb.Fatal(err)
	}
	c, err := p.CheckOut(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	if err := p.CheckIn(c); err != nil {
		tb.Fatal(err)
	}
	return p
}

func cycle(tb testing.TB, p *pool.Pool, ctx context.Context) {
	c, err := p.CheckOut(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	if err := p.CheckIn(c); err != nil {
		tb.Fatal(err)
	}
}

var noopMonitor = pool.MonitorFunc(func(pool.Event) {})

// disabledLogger has Debug disabled, as in production.
var disabledLogger = slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))

// The uncontended checkout/check-in cycle allocates nothing, with no monitor, with a
// subscriber that does nothing, and with the spec logger at a level that drops Debug.
func TestCheckOutCheckInDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	for name, o := range map[string]pool.Options{
		"no monitor":      pool.DefaultOptions(),
		"noop monitor":    func() pool.Options { o := pool.DefaultOptions(); o.Monitor = noopMonitor; return o }(),
		"logger disabled": func() pool.Options { o := pool.DefaultOptions(); o.Logger = disabledLogger; return o }(),
		"maxIdleTime":     func() pool.Options { o := pool.DefaultOptions(); o.MaxIdleTime = time.Minute; return o }(),
		"share":           shareOptions(),
		"adaptive":        adaptiveBenchOptions(),
	} {
		p := benchPool(t, o)
		ctx := context.Background()
		if n := testing.AllocsPerRun(1000, func() { cycle(t, p, ctx) }); n != 0 {
			t.Errorf("%s: %v allocations per checkout/check-in", name, n)
		}
	}
}

// BenchmarkCheckOutCheckIn: uncontended, one available connection, no monitor.
func BenchmarkCheckOutCheckIn(b *testing.B) {
	benchCycle(b, pool.DefaultOptions())
}

// BenchmarkCheckOutCheckInShare: BenchmarkCheckOutCheckIn in a pool with a
// Share (max_db_connections, as every topology pool has), which a checkout
// from the available stack touches only through two atomics.
func BenchmarkCheckOutCheckInShare(b *testing.B) {
	benchCycle(b, shareOptions())
}

// BenchmarkCheckOutCheckInAdaptive: BenchmarkCheckOutCheckIn with
// max_pool_size = "auto": the clock read at hand-out and check-in, the
// limiter's sample, and its probe check at every hand-out.
func BenchmarkCheckOutCheckInAdaptive(b *testing.B) {
	benchCycle(b, adaptiveBenchOptions())
}

// adaptiveBenchOptions are the default options with the adaptive limit.
func adaptiveBenchOptions() pool.Options {
	o := pool.DefaultOptions()
	o.Adaptive = true
	return o
}

// shareOptions are the default options with a Share capped at 100.
func shareOptions() pool.Options {
	o := pool.DefaultOptions()
	o.Share, _ = pool.NewShare(100)
	return o
}

// BenchmarkCheckOutCheckInNoopMonitor: the cost of events when a subscriber exists
// (it receives 3 events per cycle) but does nothing.
func BenchmarkCheckOutCheckInNoopMonitor(b *testing.B) {
	o := pool.DefaultOptions()
	o.Monitor = noopMonitor
	benchCycle(b, o)
}

// BenchmarkCheckOutCheckInLoggerDisabled: the spec logger attached, Debug disabled.
func BenchmarkCheckOutCheckInLoggerDisabled(b *testing.B) {
	o := pool.DefaultOptions()
	o.Logger = disabledLogger
	benchCycle(b, o)
}

// BenchmarkCheckOutCheckInLoggerEnabled: the spec logger writing Debug text to
// io.Discard (diagnostic mode).
func BenchmarkCheckOutCheckInLoggerEnabled(b *testing.B) {
	o := pool.DefaultOptions()
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelDebug}))
	benchCycle(b, o)
}

func benchCycle(b *testing.B, o pool.Options) {
	p := benchPool(b, o)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		cycle(b, p, ctx)
	}
}

// BenchmarkCheckOutCheckInParallel: 100 goroutines share a pool of at most 10
// connections, so most checkouts wait in the queue and are handed a connection by
// another goroutine's check-in.
func BenchmarkCheckOutCheckInParallel(b *testing.B) {
	benchParallel(b, 10, 100)
}

// BenchmarkCheckOutCheckInParallelUncapped: 100 goroutines, maxPoolSize 100 (no
// waiting once warm): the cost of the shared mutex alone.
func BenchmarkCheckOutCheckInParallelUncapped(b *testing.B) {
	benchParallel(b, 100, 100)
}

// BenchmarkCheckOutCheckInParallelWaitQueueTimeout is BenchmarkCheckOutCheckInParallel
// with a WaitQueueTimeout, as the proxy always has one: what a wait's timeout
// costs on top of the hand-off.
func BenchmarkCheckOutCheckInParallelWaitQueueTimeout(b *testing.B) {
	benchParallel(b, 10, 100, 30*time.Second)
}

func benchParallel(b *testing.B, maxPoolSize, goroutines int, wqt ...time.Duration) {
	o := pool.DefaultOptions()
	o.MaxPoolSize = maxPoolSize
	if len(wqt) > 0 {
		o.WaitQueueTimeout = wqt[0]
	}
	p := benchPool(b, o)
	procs := runtime.GOMAXPROCS(0)
	b.SetParallelism((goroutines + procs - 1) / procs)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			c, err := p.CheckOut(ctx)
			if err != nil {
				b.Error(err)
				return
			}
			if err := p.CheckIn(c); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "ops/s")
}

// BenchmarkCheckOutFuncHandOff: the event loop's wait, without a goroutine. One
// connection is held; each iteration queues a CheckOutFunc and checks the held
// connection in, which hands it to the queued checkout through its callback.
func BenchmarkCheckOutFuncHandOff(b *testing.B) { benchHandOff(b, 0) }

// BenchmarkCheckOutFuncHandOffWaitQueueTimeout is BenchmarkCheckOutFuncHandOff with
// the proxy's default WaitQueueTimeout: every wait has a timeout to keep.
func BenchmarkCheckOutFuncHandOffWaitQueueTimeout(b *testing.B) { benchHandOff(b, 30*time.Second) }

func benchHandOff(b *testing.B, wqt time.Duration) {
	o := pool.DefaultOptions()
	o.MaxPoolSize = 1
	o.WaitQueueTimeout = wqt
	p := benchPool(b, o)
	held, err := p.CheckOut(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	var got *pool.Conn
	done := func(c *pool.Conn, err error) {
		if err != nil {
			b.Error(err)
		}
		got = c
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, queued, err := p.CheckOutFunc(done); !queued || err != nil {
			b.Fatal(queued, err)
		}
		if err := p.CheckIn(held); err != nil {
			b.Fatal(err)
		}
		held, got = got, nil
	}
	if err := p.CheckIn(held); err != nil {
		b.Fatal(err)
	}
}
