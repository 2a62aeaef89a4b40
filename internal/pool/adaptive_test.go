package pool_test

// The adaptive limit gates checkouts (max_pool_size = "auto"): beyond it a
// checkout waits in order, and drops reported at check-in lower it.

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

func TestAdaptiveLimitGatesCheckouts(t *testing.T) {
	p, _ := newTestPool(t, &mockConnector{}, adaptiveOptions())
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	st := p.Stats()
	if st.Limiter == nil || st.Limiter.Limit != pool.DefaultLimiterInitial {
		t.Fatalf("Stats().Limiter = %+v, want limit %d", st.Limiter, pool.DefaultLimiterInitial)
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
	if st := p.Stats().Limiter; st == nil || st.Limit != 4 {
		t.Fatalf("after SetLimits(auto, ceiling 4): %+v, want limit 4", st)
	}
	l.Adaptive = false
	_ = p.SetLimits(l)
	if p.Stats().Limiter != nil {
		t.Fatal("the limiter outlived SetLimits back to a fixed size")
	}
}
