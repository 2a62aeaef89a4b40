package admin

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
	"unsafe"
)

// fakeClock returns t0, t0+step, t0+2*step, ... on successive calls.
func fakeClock(step time.Duration) func() time.Time {
	now := t0
	return func() time.Time { now = now.Add(step); return now }
}

func TestSamplerCapacity(t *testing.T) {
	f := newFake()
	for _, tc := range []struct {
		interval, window time.Duration
		want             int
	}{
		{0, 0, 150}, // 2 s x 5 min
		{time.Second, 5 * time.Second, 5},
		{time.Second, 5500 * time.Millisecond, 6},
		{time.Second, time.Millisecond, 2},
		{time.Millisecond, 24 * time.Hour, maxSamples},
	} {
		if got := NewSampler(f, tc.interval, tc.window).Capacity(); got != tc.want {
			t.Errorf("NewSampler(%v, %v): capacity %d, want %d", tc.interval, tc.window, got, tc.want)
		}
	}
}

func TestSamplerRingBounds(t *testing.T) {
	f := newFake()
	s := NewSampler(f, 2*time.Second, 10*time.Second)
	s.now = fakeClock(2 * time.Second)
	if d := s.Data(); len(d.Times) != 0 || len(d.Pools) != 0 || d.Current.Clients != 0 {
		t.Fatalf("empty sampler: %+v", d)
	}
	for i := 1; i <= 12; i++ {
		s.Sample()
		if want := min(i, 5); s.Len() != want {
			t.Fatalf("after %d samples Len %d, want %d", i, s.Len(), want)
		}
	}
	d := s.Data()
	if len(d.Times) != 5 {
		t.Fatalf("%d times, want 5", len(d.Times))
	}
	// The newest five, oldest first: samples 8..12.
	for i, ts := range d.Times {
		if want := t0.Add(time.Duration(8+i) * 2 * time.Second).UnixMilli(); ts != want {
			t.Fatalf("time %d = %d, want %d", i, ts, want)
		}
	}
	for _, p := range d.Pools {
		for _, series := range []gapInts{p.Available, p.InUse, p.Pending, p.Waiters} {
			if len(series) != 5 {
				t.Fatalf("pool %s/%s series of %d", p.Route, p.Server, len(series))
			}
		}
	}
	// Sample 12 saw step 11 for pools (Stats advances after Pools).
	for _, p := range d.Pools {
		i := map[string]int{"orders": 0, "*": 1}[p.Route]
		j := map[string]int{"127.0.0.1:27017": 0, "127.0.0.1:27018": 1}[p.Server]
		if want := poolAt(i, j, 11); p.InUse[4] != int32(want.InUse) || p.Waiters[4] != int32(want.Waiters) || p.Available[4] != int32(want.Available) {
			t.Fatalf("pool %s/%s newest %d/%d/%d, want %+v", p.Route, p.Server, p.InUse[4], p.Waiters[4], p.Available[4], want)
		}
	}
	// Per-sample rates: 500 operations per 2 s step.
	if r := d.Rates["operations"]; r[4] != 250 || r[0] != 250 {
		t.Fatalf("operations/s %v", r)
	}
	// Sample 12 saw step 11 for clients too: 40 + 11%5.
	if c := d.Current; c.Clients != 41 || d.Clients["total"][4] != 41 {
		t.Fatalf("current clients %d", c.Clients)
	}
}

func TestSamplerClientsAndApps(t *testing.T) {
	f := newFake()
	f.nClients = 30
	s := NewSampler(f, time.Second, time.Minute)
	s.Sample() // step 0 for Clients: 30 clients
	d := s.Data()
	if d.Clients["total"][0] != 30 || d.Current.Clients != 30 {
		t.Fatalf("clients %v", d.Clients["total"])
	}
	sum := 0
	for _, st := range clientStates {
		sum += d.Clients[string(st)][0]
		if d.Current.ClientsBy[st] != d.Clients[string(st)][0] {
			t.Fatalf("current %s %d vs series %d", st, d.Current.ClientsBy[st], d.Clients[string(st)][0])
		}
	}
	// fakeStates has idle twice out of five.
	if sum != 30 || d.Current.ClientsBy[ClientIdle] != 12 || d.Current.ClientsBy[ClientPinned] != 6 {
		t.Fatalf("by state %v", d.Current.ClientsBy)
	}
	if a := d.Current.TopApps; len(a) != 3 || a[0].Clients != 10 || a[0].AppName != "" || a[1].AppName != "checkout" {
		t.Fatalf("top apps %+v", a)
	}
}

func TestSamplerPoolGaps(t *testing.T) {
	f := newFake()
	s := NewSampler(f, time.Second, time.Minute)
	s.now = fakeClock(time.Second)
	s.Sample()
	f.mu.Lock()
	f.routes = []string{"orders", "*", "added"}
	f.mu.Unlock()
	s.Sample()
	f.mu.Lock()
	f.routes = []string{"orders", "added"}
	f.mu.Unlock()
	s.Sample()
	b, err := json.Marshal(s.Data())
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Pools []struct {
			Info  PoolInfo `json:"info"`
			InUse []*int   `json:"inUse"`
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	if len(d.Pools) != 6 {
		t.Fatalf("%d pools, want 6", len(d.Pools))
	}
	for _, p := range d.Pools {
		present := fmt.Sprint(p.InUse[0] != nil, p.InUse[1] != nil, p.InUse[2] != nil)
		want := map[string]string{"orders": "true true true", "*": "true true false", "added": "false true true"}[p.Info.Route]
		if present != want {
			t.Errorf("pool %s/%s present %s, want %s", p.Info.Route, p.Info.Server, present, want)
		}
	}
	if !strings.Contains(string(b), `"inUse":[null,`) {
		t.Errorf("absent points are not null in JSON")
	}
}

func TestSamplerPoolCap(t *testing.T) {
	f := newFake()
	for i := range maxPoolsPerSample + 10 {
		f.pools = append(f.pools, PoolInfo{Route: fmt.Sprintf("r%04d", i), Server: "127.0.0.1:27017", InUse: 1})
	}
	s := NewSampler(f, time.Second, time.Minute)
	s.Sample()
	d := s.Data()
	if len(d.Pools) != maxPoolsPerSample || !d.Current.PoolsTruncate || d.Pools[0].Route != "r0000" {
		t.Fatalf("%d pools, truncated %v", len(d.Pools), d.Current.PoolsTruncate)
	}
}

func TestSamplerStartStop(t *testing.T) {
	f := newFake()
	s := NewSampler(f, 5*time.Millisecond, time.Second)
	s.Stop() // before Start: harmless
	s = NewSampler(f, 5*time.Millisecond, time.Second)
	s.Start()
	s.Start() // a second Start does not start a second goroutine (goleak)
	deadline := time.Now().Add(10 * time.Second)
	for s.Len() < 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if s.Len() < 3 {
		t.Fatalf("%d samples after waiting", s.Len())
	}
	s.Stop()
	n := s.Len()
	time.Sleep(30 * time.Millisecond)
	if s.Len() != n {
		t.Fatalf("sampled after Stop: %d -> %d", n, s.Len())
	}
	s.Stop()
	s.Start() // after Stop: nothing
	if s.running() {
		t.Fatal("Start after Stop restarted the sampler")
	}
}

func BenchmarkSamplerData(b *testing.B) {
	s := NewSampler(newFake(), 2*time.Second, 5*time.Minute)
	s.now = fakeClock(2 * time.Second)
	for range s.Capacity() {
		s.Sample()
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := json.Marshal(s.Data()); err != nil {
			b.Fatal(err)
		}
	}
}

// TestSamplerPoolWaitPerInterval checks that a pool's checkout latency is the
// mean over each interval, from the differences of its totals: not the mean
// since start, which would flatten out.
func TestSamplerPoolWaitPerInterval(t *testing.T) {
	f := newFake()
	s := NewSampler(f, time.Second, time.Minute)
	s.now = fakeClock(time.Second)
	for range 4 {
		s.Sample()
	}
	d := s.Data()
	for _, p := range d.Pools {
		if !math.IsNaN(p.WaitAvgMs[0]) {
			t.Fatalf("pool %s|%s: first sample has no interval, got %v", p.Route, p.Server, p.WaitAvgMs[0])
		}
		for i := 1; i < len(p.WaitAvgMs); i++ {
			if p.WaitAvgMs[i] < 1 || p.WaitAvgMs[i] > 5 {
				t.Fatalf("pool %s|%s interval %d: %v ms, want the fake's 1..5 ms", p.Route, p.Server, i, p.WaitAvgMs[i])
			}
		}
	}
	b, err := json.Marshal(d.Pools[0].WaitAvgMs)
	if err != nil || !strings.HasPrefix(string(b), "[null,") {
		t.Fatalf("JSON %s %v: a missing point must be null", b, err)
	}
}

// A server that stays down has its error stored once, however many
// samples repeat it; a new error text is stored anew.
func TestSamplerSharesRepeatedErrors(t *testing.T) {
	f := newFake()
	s := NewSampler(f, time.Second, time.Minute)
	s.now = fakeClock(time.Second)
	setErr := func(text string) {
		f.mu.Lock()
		defer f.mu.Unlock()
		// A fresh copy each time, as the Controller makes one per call.
		f.pools = []PoolInfo{
			{Route: "rs", Server: "127.0.0.1:27017", Role: RolePrimary},
			{Route: "rs", Server: "127.0.0.1:27018", Role: RoleUnknown, LastError: strings.Clone(text)},
		}
	}
	refused := "upstream: connect to 127.0.0.1:27018 (dial): connection refused"
	for range 3 {
		setErr(refused)
		s.Sample()
	}
	setErr("upstream: connect to 127.0.0.1:27018 (dial): i/o timeout")
	s.Sample()
	ss := s.samples()
	if len(ss) != 4 {
		t.Fatalf("%d samples", len(ss))
	}
	data := func(i int) *byte { return unsafe.StringData(ss[i].pools[1].LastError) }
	if data(0) != data(1) || data(1) != data(2) {
		t.Error("a repeated error is stored again in every sample")
	}
	if data(3) == data(2) || ss[3].pools[1].LastError == refused {
		t.Errorf("a new error kept the old text: %q", ss[3].pools[1].LastError)
	}
	if d := s.Data(); d.Pools[1].LastError != ss[3].pools[1].LastError {
		t.Errorf("the page shows %q, want the newest error", d.Pools[1].LastError)
	}
}
