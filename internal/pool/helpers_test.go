package pool_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/testutil/specdir"
)

// mockUpstream is an Upstream that does no I/O.
type mockUpstream struct {
	pool.Upstream // never used by the pool but for Close
	id            int64
	closed        atomic.Int32
}

func (u *mockUpstream) Close() error {
	u.closed.Add(1)
	return nil
}

// mockConnector establishes mockUpstreams, optionally slowly or failing, and counts
// what it does. Its hooks run on the pool's establishment goroutines.
type mockConnector struct {
	// delay, when set, returns how long establishing connection id takes.
	delay func(id int64) time.Duration
	// fail, when set, returns the error establishing connection id fails with.
	fail func(id int64) error
	// wrap, when set, turns the mock upstream into the Upstream returned.
	wrap func(u *mockUpstream) pool.Upstream

	mu        sync.Mutex
	upstreams []*mockUpstream
	calls     atomic.Int64
}

func (m *mockConnector) Connect(ctx context.Context, _ string, id int64) (pool.Upstream, error) {
	m.calls.Add(1)
	if m.delay != nil {
		if d := m.delay(id); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			}
		}
	}
	if m.fail != nil {
		if err := m.fail(id); err != nil {
			return nil, err
		}
	}
	u := &mockUpstream{id: id}
	m.mu.Lock()
	m.upstreams = append(m.upstreams, u)
	m.mu.Unlock()
	if m.wrap != nil {
		return m.wrap(u), nil
	}
	return u, nil
}

// upstream returns the mock upstream of connection id.
func (m *mockConnector) upstream(id int64) *mockUpstream {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, u := range m.upstreams {
		if u.id == id {
			return u
		}
	}
	return nil
}

// recorder is a Monitor that records every event and checks, at each one, the count
// invariants the pool must never break.
type recorder struct {
	maxPoolSize, maxConnecting int

	mu     sync.Mutex
	events []pool.Event
	// at[i] is when events[i] was received: read inside HandleEvent, so under
	// the pool's lock, which is what bounds the events' durations (see
	// checkDurations).
	at         []time.Time
	changed    chan struct{} // closed and replaced at every event
	violations []string
}

func newRecorder(o pool.Options) *recorder {
	return &recorder{maxPoolSize: o.MaxPoolSize, maxConnecting: o.MaxConnecting, changed: make(chan struct{})}
}

func (r *recorder) HandleEvent(e pool.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := e.Counts
	switch {
	case c.Total != c.Available+c.Pending+c.InUse:
		r.violations = append(r.violations, fmt.Sprintf("%v: total %d != available %d + pending %d + inUse %d", e.Type, c.Total, c.Available, c.Pending, c.InUse))
	case r.maxPoolSize > 0 && c.Total > r.maxPoolSize:
		r.violations = append(r.violations, fmt.Sprintf("%v: total %d > maxPoolSize %d", e.Type, c.Total, r.maxPoolSize))
	case c.Pending > r.maxConnecting:
		r.violations = append(r.violations, fmt.Sprintf("%v: pending %d > maxConnecting %d", e.Type, c.Pending, r.maxConnecting))
	case c.Available < 0 || c.Pending < 0 || c.InUse < 0 || c.Waiters < 0:
		r.violations = append(r.violations, fmt.Sprintf("%v: negative count %+v", e.Type, c))
	case e.Duration < 0:
		r.violations = append(r.violations, fmt.Sprintf("%v: negative duration %v", e.Type, e.Duration))
	}
	r.events = append(r.events, e)
	r.at = append(r.at, time.Now())
	close(r.changed)
	r.changed = make(chan struct{})
}

// snapshot returns the events so far.
func (r *recorder) snapshot() []pool.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]pool.Event(nil), r.events...)
}

// stamped returns the events so far and when each was received.
func (r *recorder) stamped() ([]pool.Event, []time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]pool.Event(nil), r.events...), append([]time.Time(nil), r.at...)
}

// count returns how many events of type t were recorded.
func (r *recorder) count(t pool.EventType) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if e.Type == t {
			n++
		}
	}
	return n
}

// waitFor waits until count events of type t have been recorded in total.
func (r *recorder) waitFor(t pool.EventType, count int, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		n := 0
		for _, e := range r.events {
			if e.Type == t {
				n++
			}
		}
		ch := r.changed
		r.mu.Unlock()
		if n >= count {
			return nil
		}
		select {
		case <-ch:
		case <-deadline.C:
			return fmt.Errorf("timed out after %v waiting for %d %v events (saw %d)", timeout, count, t, n)
		}
	}
}

func (r *recorder) checkInvariants(t *testing.T) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, v := range r.violations {
		t.Errorf("invariant violated: %s", v)
	}
}

// types returns the event types in order, for failure messages.
func types(events []pool.Event) []string {
	out := make([]string, len(events))
	for i, e := range events {
		out[i] = e.Type.String()
		if e.ConnectionID != 0 {
			out[i] += fmt.Sprintf("(%d)", e.ConnectionID)
		}
		if e.Reason != "" {
			out[i] += "[" + string(e.Reason) + "]"
		}
	}
	return out
}

// onlyTypes keeps the events whose type is in keep.
func onlyTypes(events []pool.Event, keep ...pool.EventType) []pool.Event {
	var out []pool.Event
	for _, e := range events {
		for _, k := range keep {
			if e.Type == k {
				out = append(out, e)
				break
			}
		}
	}
	return out
}

// newTestPool creates a pool with a recorder and closes it when the test ends.
func newTestPool(t *testing.T, c pool.Connector, o pool.Options) (*pool.Pool, *recorder) {
	t.Helper()
	rec := newRecorder(o)
	o.Monitor = pool.Monitors(o.Monitor, rec)
	p, err := pool.New("127.0.0.1:27017", c, o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		p.Close()
		rec.checkInvariants(t)
	})
	return p, rec
}

// ctxT returns a context bounded by a generous safety timeout.
func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// specDir returns the CMAP test directory named sub ("cmap-format" or
// "logging"): under $CMAP_SPEC_DIR if set (which may name the cmap
// directory or cmap-format itself), else where specdir finds the suites
// (../shared/specs/cmap from the module root, or $MONGOBOUNCER_SPECS). A
// missing directory skips the test, or fails it when $CI is set.
func specDir(t *testing.T, sub string) string {
	t.Helper()
	env := os.Getenv("CMAP_SPEC_DIR")
	if env == "" {
		return specdir.Dir(t, "cmap", sub)
	}
	dir := filepath.Join(env, sub)
	if _, err := os.Stat(dir); err != nil && filepath.Base(env) == "cmap-format" {
		dir = filepath.Join(filepath.Dir(env), sub)
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		msg := fmt.Sprintf("CMAP spec tests not found: directory %s is missing (CMAP_SPEC_DIR names the specs/cmap directory)", dir)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return dir
}
