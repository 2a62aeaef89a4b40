package pool_test

// The adaptive limit gates checkouts (max_pool_size = "auto"): beyond it a
// checkout waits in order, drops reported at check-in lower it, and the
// limiter's minimum-RTT probe holds it at min_pool_size until operations
// have run there, or until its deadline when none come back.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/pool"
)

func adaptiveOptions() pool.Options {
	o := pool.DefaultOptions()
	o.Adaptive = true
	o.MaxPoolSize = 50
	o.MinPoolSize = 2
	o.MaintenanceInterval = -1
	return o
}

// endProbe runs operations one at a time until the limiter's first probe
// has measured the no-load RTT and handed the limit back.
func endProbe(t *testing.T, p *pool.Pool) {
	t.Helper()
	for i := 0; p.Stats().Limiter.Probing; i++ {
		if i > 100 {
			t.Fatalf("the probe did not end after %d operations: %+v", i, p.Stats().Limiter)
		}
		c, err := p.CheckOut(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Microsecond)
		_ = p.CheckIn(c)
	}
}

func TestAdaptiveLimitGatesCheckouts(t *testing.T) {
	p, _ := newTestPool(t, &mockConnector{}, adaptiveOptions())
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	// A new pool starts with a probe at min_pool_size (2), then the limit
	// starts from DefaultLimiterInitial.
	if st := p.Stats().Limiter; st == nil || st.Limit != 2 || !st.Probing {
		t.Fatalf("Stats().Limiter = %+v, want a probe at limit 2", st)
	}
	endProbe(t, p)
	st := p.Stats()
	if st.Limiter.Limit != pool.DefaultLimiterInitial || st.Limiter.Probes != 1 || st.Limiter.MinRTT <= 0 {
		t.Fatalf("Stats().Limiter = %+v, want limit %d after one probe with its minimum RTT", st.Limiter, pool.DefaultLimiterInitial)
	}
	var held []*pool.Conn
	for range pool.DefaultLimiterInitial {
		c, err := p.CheckOut(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	// MaxPoolSize would allow 42 more; the limit does not.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := p.CheckOut(ctx)
	var wq *pool.WaitQueueTimeoutError
	if !errors.As(err, &wq) {
		t.Fatalf("checkout past the limit: %v, want a WaitQueueTimeoutError", err)
	}
	// Waiters past the limit are served in order as connections come back.
	var order []int
	for i := range 2 {
		_, queued, err := p.CheckOutFunc(func(c *pool.Conn, err error) {
			if err == nil {
				order = append(order, i)
				held = append(held, c)
			}
		})
		if err != nil || !queued {
			t.Fatalf("CheckOutFunc %d: queued %v, err %v", i, queued, err)
		}
	}
	for i := range 2 {
		if err := p.CheckIn(held[i]); err != nil {
			t.Fatal(err)
		}
	}
	if len(order) != 2 || order[0] != 0 || order[1] != 1 {
		t.Fatalf("waiters served %v, want [0 1]", order)
	}
	if got := p.Stats().Total; got != pool.DefaultLimiterInitial {
		t.Fatalf("total connections %d, want %d (reused, none beyond the limit)", got, pool.DefaultLimiterInitial)
	}
	for _, c := range held[2:] {
		_ = p.CheckIn(c)
	}
}

func TestAdaptiveLimitFallsOnOverloadAndNetworkErrors(t *testing.T) {
	p, _ := newTestPool(t, &mockConnector{}, adaptiveOptions())
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	endProbe(t, p)
	c, err := p.CheckOut(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	c.MarkOverloaded()
	if err := p.CheckIn(c); err != nil {
		t.Fatal(err)
	}
	st := p.Stats()
	if st.Limiter.Limit != 7 || st.Limiter.Drops != 1 {
		t.Fatalf("after one overloaded reply: %+v, want limit 7 and 1 drop", st.Limiter)
	}
	if st.Total != 1 || st.Available != 1 {
		t.Fatalf("an overloaded reply closed its connection: %+v", st.Counts)
	}
	// A network error is a drop; a client-side error is not.
	c, _ = p.CheckOut(ctxT(t))
	c.MarkErrored(context.DeadlineExceeded)
	_ = p.CheckIn(c)
	c, _ = p.CheckOut(ctxT(t))
	c.MarkErrored(errors.New("client went away"))
	_ = p.CheckIn(c)
	if st := p.Stats().Limiter; st.Limit != 6 || st.Drops != 2 {
		t.Fatalf("after a timeout and a client error: %+v, want limit 6 and 2 drops", st)
	}
	// Drops never take it below min_pool_size.
	for range 50 {
		c, err := p.CheckOut(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		c.MarkOverloaded()
		_ = p.CheckIn(c)
	}
	if got := p.Stats().Limiter.Limit; got != 2 {
		t.Fatalf("limit after 50 drops = %d, want the floor 2", got)
	}
}

func TestAdaptiveSetLimits(t *testing.T) {
	o := adaptiveOptions()
	o.Adaptive = false
	p, _ := newTestPool(t, &mockConnector{}, o)
	if p.Stats().Limiter != nil {
		t.Fatal("a fixed-size pool has a limiter")
	}
	l := o.Limits()
	l.Adaptive, l.MaxPoolSize, l.MinPoolSize = true, 4, 1
	if err := p.SetLimits(l); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats().Limiter; st == nil || st.Limit != 1 || !st.Probing {
		t.Fatalf("after SetLimits(auto, ceiling 4, min 1): %+v, want a probe at limit 1", st)
	}
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	endProbe(t, p)
	if st := p.Stats().Limiter; st.Limit != 4 {
		t.Fatalf("after the probe: %+v, want limit 4 (the initial 8 under the ceiling)", st)
	}
	l.Adaptive = false
	_ = p.SetLimits(l)
	if p.Stats().Limiter != nil {
		t.Fatal("the limiter outlived SetLimits back to a fixed size")
	}
}

// A probe that no check-in ends (the connections at the floor are held, as
// a transaction waiting on its client holds one) ends at its deadline, and
// the waiters behind it are served.
func TestAdaptiveProbeEndsAtItsDeadline(t *testing.T) {
	p, _ := newTestPool(t, &mockConnector{}, adaptiveOptions())
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	var held []*pool.Conn
	for range 2 {
		c, err := p.CheckOut(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	start := time.Now()
	got := make(chan error, 1)
	_, queued, err := p.CheckOutFunc(func(c *pool.Conn, err error) {
		if err == nil {
			held = append(held, c)
		}
		got <- err
	})
	if err != nil || !queued {
		t.Fatalf("a third checkout during the probe: queued %v, err %v", queued, err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the waiter was not served 10 s into a probe: %+v", p.Stats().Limiter)
	}
	if el := time.Since(start); el < 900*time.Millisecond {
		t.Fatalf("served after %v, before the probe's deadline (1 s)", el)
	}
	st := p.Stats().Limiter
	if st.Probing || st.Probes != 1 || st.Limit != pool.DefaultLimiterInitial || st.MinRTT != 0 {
		t.Fatalf("after the deadline: %+v, want the probe over, limit %d, no minimum RTT measured", st, pool.DefaultLimiterInitial)
	}
	for _, c := range held {
		_ = p.CheckIn(c)
	}
}
