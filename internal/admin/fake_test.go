package admin

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// fakeCtl is a Controller whose numbers move: every Stats call is one step
// of simulated traffic (2 s of uptime, 500 operations, ...), and pools and
// clients are functions of the step, so consecutive snapshots differ the way
// a busy pooler's do.
type fakeCtl struct {
	mu sync.Mutex
	// step is the simulated time, calls the actions in order, and the
	// remaining fields what the next calls return. All guarded by mu.
	step     int
	calls    []string
	routes   []string
	servers  []string
	nClients int
	ready    bool
	reasons  []string
	reload   error
	config   map[string]any
	pools    []PoolInfo // when non-nil, Pools returns it as is
}

func newFake() *fakeCtl {
	return &fakeCtl{
		routes:   []string{"orders", "*"},
		servers:  []string{"127.0.0.1:27017", "127.0.0.1:27018"},
		nClients: 40,
		ready:    true,
		config: map[string]any{
			"mongobouncer": map[string]any{"listen": "127.0.0.1:27016", "max_pool_size": 10, "admin_listen": "127.0.0.1:8080"},
			"databases": map[string]any{
				"orders": map[string]any{"connection_string": "mongodb://app:xxxxx@127.0.0.1:27017/", "pool_mode": "transaction"},
				"*":      map[string]any{"connection_string": "mongodb://127.0.0.1:27018/"},
			},
			"listeners": []any{"127.0.0.1:27016", "/tmp/mb.sock"},
		},
	}
}

// poolAt is pool (route i, server j) at step s.
func poolAt(i, j, s int) PoolInfo {
	inUse := (s*3 + i*5 + j) % 9
	pending := (s + j) % 2
	avail := 10 - inUse - pending
	waiters := 0
	if inUse == 8 {
		waiters = (s+i)%4 + 1
	}
	p := PoolInfo{
		Route: []string{"orders", "*"}[i%2], Server: fmt.Sprintf("127.0.0.1:%d", 27017+j),
		Mode: "transaction", State: "ready", Usable: true, Generation: uint64(s / 10),
		Total: inUse + pending + avail, Available: avail, InUse: inUse, Pending: pending, Waiters: waiters,
		MaxPoolSize: 10, MinPoolSize: 1,
		Checkouts: uint64(10 * s), CheckoutWait: waitTotal(i, s),
		// The first server is each route's primary, the others its
		// secondaries; round trips move from step to step.
		Role:  []string{RolePrimary, RoleSecondary}[min(j, 1)],
		RTTMs: float64((s+j)%7) + 0.25*float64(i+1),
	}
	if i == 0 && j == 0 {
		// The orders primary's pool is adaptive (max_pool_size = "auto"):
		// its limit moves from step to step.
		p.Limit = 4 + s%5
	}
	if i == 1 && j == 1 {
		// The catch-all route's secondary is down: the monitor's error
		// says why.
		p.Role, p.Usable, p.RTTMs = RoleUnknown, false, 0
		p.LastError = "upstream: connect to 127.0.0.1:27018 (dial): connection refused"
	}
	return p
}

// waitTotal is the total checkout wait of route i's pools after step s:
// step k adds 10 checkouts of ((k+i)%5 + 1) ms each, so the mean over one
// step is a whole number of milliseconds that changes from step to step.
func waitTotal(i, s int) time.Duration {
	var d time.Duration
	for k := 1; k <= s; k++ {
		d += 10 * time.Duration((k+i)%5+1) * time.Millisecond
	}
	return d
}

func (f *fakeCtl) Pools() []PoolInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.pools != nil {
		return append([]PoolInfo(nil), f.pools...)
	}
	var out []PoolInfo
	// Reverse order, so tests see that the admin interface sorts.
	for i := len(f.routes) - 1; i >= 0; i-- {
		for j := len(f.servers) - 1; j >= 0; j-- {
			p := poolAt(i, j, f.step)
			p.Route, p.Server = f.routes[i], f.servers[j]
			out = append(out, p)
		}
	}
	return out
}

var fakeStates = []ClientState{ClientIdle, ClientIdle, ClientActive, ClientWaiting, ClientPinned}

func (f *fakeCtl) Clients() []ClientInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.nClients + f.step%5
	out := make([]ClientInfo, 0, n)
	for i := n; i > 0; i-- {
		c := ClientInfo{
			ID: int64(i), Addr: fmt.Sprintf("127.0.0.1:%d", 40000+i), AppName: []string{"checkout", "reports", ""}[i%3],
			Listener: "127.0.0.1:27016", ConnectedAt: t0.Add(time.Duration(i) * time.Second),
			State: fakeStates[(i+f.step)%len(fakeStates)], Requests: uint64(i * 10),
		}
		if c.State == ClientPinned {
			c.PinnedServer = "127.0.0.1:27017"
		}
		out = append(out, c)
	}
	return out
}

func (f *fakeCtl) Servers() []ServerConnInfo {
	return []ServerConnInfo{
		{Route: "orders", Server: "127.0.0.1:27017", ID: 2, State: "in use", Generation: 1, CreatedAt: t0, LastUsed: t0.Add(90 * time.Second), Role: RolePrimary},
		{Route: "orders", Server: "127.0.0.1:27017", ID: 1, State: "available", Generation: 1, CreatedAt: t0, LastUsed: t0.Add(30 * time.Second), Role: RolePrimary},
		{Route: "*", Server: "127.0.0.1:27018", ID: 7, State: "pending", Generation: 0, CreatedAt: t0.Add(100 * time.Second), Role: RoleSecondary},
	}
}

// Stats advances the simulation by one step and reports it.
func (f *fakeCtl) Stats() StatsInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.step++
	s := uint64(f.step)
	return StatsInfo{
		Uptime:         time.Duration(f.step) * 2 * time.Second,
		ClientsCurrent: f.nClients, ClientsTotal: 10 * s,
		Operations: 500 * s, Errors: s, BytesIn: 64000 * s, BytesOut: 128000 * s,
		WaitAvg:  time.Duration(f.step%4+1) * 250 * time.Microsecond,
		WaitP99:  time.Duration(f.step%5+2) * time.Millisecond,
		QueryAvg: 1500 * time.Microsecond, QueryP99: time.Duration(f.step%3+8) * time.Millisecond,
	}
}

func (f *fakeCtl) Config() map[string]any { return f.config }

func (f *fakeCtl) Ready() (bool, []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ready, f.reasons
}

func (f *fakeCtl) record(call string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call)
}

func (f *fakeCtl) checkRoute(route string) error {
	if route == "" {
		return nil
	}
	for _, r := range f.routes {
		if r == route {
			return nil
		}
	}
	return fmt.Errorf("%w %q", ErrUnknownRoute, route)
}

func (f *fakeCtl) Pause(route string) error {
	if err := f.checkRoute(route); err != nil {
		return err
	}
	f.record("pause " + route)
	return nil
}

func (f *fakeCtl) Resume(route string) error {
	if err := f.checkRoute(route); err != nil {
		return err
	}
	f.record("resume " + route)
	return nil
}

func (f *fakeCtl) Reconnect(route string) error {
	if err := f.checkRoute(route); err != nil {
		return err
	}
	f.record("reconnect " + route)
	return nil
}

func (f *fakeCtl) Reload() error {
	f.mu.Lock()
	err := f.reload
	f.mu.Unlock()
	if err != nil {
		return err
	}
	f.record("reload")
	return nil
}

func (f *fakeCtl) Shutdown() { f.record("shutdown") }

func (f *fakeCtl) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

var errBadFile = errors.New("mongobouncer.toml:7: max_pool_size = -1: must be at least 1")
