package pool

// The adaptive gate under concurrency, checked from inside: a Monitor runs
// under Pool.mu, so at every ConnectionCheckedOut it can compare the
// number in use with the limit in force at that instant.

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// limitMonitor counts hand-outs past the limit in force.
type limitMonitor struct {
	p         atomic.Pointer[Pool]
	handOuts  atomic.Int64
	overLimit atomic.Int64
	highest   atomic.Int64 // highest in-use count seen at a hand-out
}

func (m *limitMonitor) HandleEvent(e Event) {
	p := m.p.Load()
	if p == nil || e.Type != ConnectionCheckedOut {
		return
	}
	m.handOuts.Add(1)
	if p.lim != nil && e.Counts.InUse > p.lim.Limit() {
		m.overLimit.Add(1)
	}
	if n := int64(e.Counts.InUse); n > m.highest.Load() {
		m.highest.Store(n)
	}
}

type nopUpstream struct{ Upstream }

func (nopUpstream) Close() error { return nil }

type nopConnector struct{}

func (nopConnector) Connect(context.Context, string, int64) (Upstream, error) {
	return nopUpstream{}, nil
}

func TestAdaptiveGateUnderConcurrency(t *testing.T) {
	mon := &limitMonitor{}
	o := DefaultOptions()
	o.Adaptive, o.MaxPoolSize, o.MinPoolSize, o.MaintenanceInterval = true, 32, 1, -1
	o.Monitor = mon
	p, err := New("127.0.0.1:27017", nopConnector{}, o)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	mon.p.Store(p)
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for g := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 150 {
				c, err := p.CheckOut(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				if (g+i)%41 == 0 {
					c.MarkOverloaded()
				}
				time.Sleep(50 * time.Microsecond)
				if err := p.CheckIn(c); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	st := p.Stats()
	if n := mon.overLimit.Load(); n != 0 {
		t.Fatalf("%d of %d hand-outs past the limit in force", n, mon.handOuts.Load())
	}
	if st.InUse != 0 || st.Waiters != 0 || st.Limiter.Drops == 0 {
		t.Fatalf("at the end: %+v, limiter %+v", st.Counts, st.Limiter)
	}
	t.Logf("%d hand-outs, at most %d in use, limit now %d, %d drops", mon.handOuts.Load(), mon.highest.Load(), st.Limiter.Limit, st.Limiter.Drops)
}
