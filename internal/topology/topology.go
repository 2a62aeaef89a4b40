package topology

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// Topology is the set of upstream servers of one route.
type Topology struct {
	name    string
	opts    Options
	log     *slog.Logger
	servers []*Server          // fixed at New
	byAddr  map[string]*Server // fixed at New

	// sel is the current selection snapshot; SelectServer reads it without
	// locking. It is replaced (under mu) whenever the selectable set changes.
	sel atomic.Pointer[selection]
	// rr rotates the starting point of least-busy scans and picks for
	// round-robin.
	rr atomic.Uint64
	// lastHello is the most recent successful hello of any server.
	lastHello atomic.Pointer[upstream.Hello]
	// closedFlag mirrors closed for lock-free checks on error paths.
	closedFlag atomic.Bool

	mu sync.Mutex
	// closed is set once by Close.
	closed bool
	// helloSeen records that helloReady was closed; guarded by mu.
	helloSeen bool

	helloReady chan struct{}      // closed at the first successful hello
	done       chan struct{}      // closed by Close
	cancel     context.CancelFunc // stops the monitors
	wg         sync.WaitGroup     // monitor goroutines
}

// selection is an immutable snapshot of the selectable servers.
type selection struct {
	servers []*Server
	// changed is closed when this snapshot is replaced, waking waiters.
	changed chan struct{}
	closed  bool
}

// New builds a topology named name (the route, for logs and errors) with one
// Server and one pool per host, and starts a monitor goroutine per server.
// The pools stay paused until their server's first successful check. Close
// releases everything.
func New(name string, o Options) (*Topology, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	t := &Topology{
		name:       name,
		opts:       o,
		log:        o.Logger,
		byAddr:     make(map[string]*Server, len(o.Hosts)),
		helloReady: make(chan struct{}),
		done:       make(chan struct{}),
	}
	t.sel.Store(&selection{changed: make(chan struct{})})
	for _, h := range o.Hosts {
		s := newServer(t, h)
		po := o.Pool
		// The pool calls this without its lock held, so clearing from it
		// is safe. Errors are *pool.ConnectionError: handled like a failed
		// checkout, with the generation check.
		po.OnBackgroundError = func(err error) { s.HandleError(err, nil) }
		if po.Logger == nil {
			po.Logger = o.Logger
		}
		p, err := pool.New(h, o.Dialer, po)
		if err != nil {
			for _, prev := range t.servers {
				prev.pool.Close()
			}
			return nil, fmt.Errorf("topology %q: pool for %s: %w", name, h, err)
		}
		s.pool = p
		t.servers = append(t.servers, s)
		t.byAddr[h] = s
	}
	if o.Pool.LoadBalanced {
		// The load-balancer specification: no SDAM for a load balancer; its
		// pool is ready at once and it is always selectable. The monitor
		// still runs, only to keep a hello for WaitHello.
		for _, s := range t.servers {
			s.markLoadBalancer()
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.cancel = cancel
	for _, s := range t.servers {
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			s.monitor(ctx)
		}()
	}
	return t, nil
}

// Name returns the topology's name.
func (t *Topology) Name() string { return t.name }

// SelectionTimeout returns the configured ServerSelectionTimeout (after
// defaults), for callers that bound their own selection context.
func (t *Topology) SelectionTimeout() time.Duration { return t.opts.ServerSelectionTimeout }

// Servers returns the topology's servers in configuration order.
func (t *Topology) Servers() []*Server { return slices.Clone(t.servers) }

// ServerByAddress returns the server whose (normalized, see Options.Hosts)
// address is addr, or nil. Cursors and transactions use it to return to the
// server that holds their state.
func (t *Topology) ServerByAddress(addr string) *Server { return t.byAddr[addr] }

// Close stops the monitors, fails pending selections with ErrClosed and
// closes every pool. It waits for the monitors to exit.
func (t *Topology) Close() {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.closed = true
	t.closedFlag.Store(true)
	old := t.sel.Load()
	t.sel.Store(&selection{changed: make(chan struct{}), closed: true})
	close(old.changed)
	close(t.done)
	t.mu.Unlock()

	t.cancel()
	t.wg.Wait()
	for _, s := range t.servers {
		s.pool.Close()
	}
}

func (t *Topology) isClosed() bool { return t.closedFlag.Load() }

// serverChanged publishes a server's new description. It is called with
// s.mu held, so the snapshot and events of one server follow its changes in
// order.
func (t *Topology) serverChanged(s *Server, prev, d *Description) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	if d.Hello != nil && d.Hello != prev.Hello {
		t.lastHello.Store(d.Hello)
		if !t.helloSeen {
			t.helloSeen = true
			close(t.helloReady)
		}
	}
	// Selectability depends only on State and Kind, which most heartbeats
	// leave unchanged.
	if prev.State != d.State || prev.Kind != d.Kind {
		old := t.sel.Load()
		var list []*Server
		for _, srv := range t.servers {
			if t.selectable(srv.desc.Load()) {
				list = append(list, srv)
			}
		}
		if !slices.Equal(list, old.servers) {
			t.sel.Store(&selection{servers: list, changed: make(chan struct{})})
			close(old.changed)
		}
	}
	t.mu.Unlock()

	if prev.State == d.State && prev.Kind == d.Kind {
		return
	}
	attrs := []any{slog.String("topology", t.name), slog.String("address", s.addr),
		slog.String("from", prev.State.String()), slog.String("to", d.State.String()),
		slog.String("kind", d.Kind.String())}
	if d.LastError != nil {
		attrs = append(attrs, slog.Any("error", d.LastError))
	}
	t.log.Info("server state changed", attrs...)
	if d.State == Usable && !t.selectable(d) {
		t.log.Warn("server is reachable but will not be selected: a route serves writes, which need a standalone, a primary or mongos routers",
			slog.String("topology", t.name), slog.String("address", s.addr), slog.String("kind", d.Kind.String()),
			slog.Int("hosts", len(t.servers)))
	}
	s.emit(Event{Type: ServerChanged, Err: d.LastError, Previous: prev, New: d})
}

// selectable is the selection policy as a function of one server's
// description. Writes go through every route, so only servers that accept
// writes qualify: a mongos or a load balancer, a replica-set primary, or a
// standalone when it is the route's only host (a standalone among several
// hosts is a misconfiguration, and mixing it with others would split data).
// A replica-set policy (reads from secondaries, discovery) plugs in here.
func (t *Topology) selectable(d *Description) bool {
	if d.State != Usable {
		return false
	}
	switch d.Kind {
	case KindMongos, KindLoadBalancer, KindRSPrimary:
		return true
	case KindStandalone:
		return len(t.servers) == 1
	}
	return false
}

// WaitHello returns a hello reply to describe the upstream to clients: the
// latest hello of a selectable server, else the latest of any server. Before
// the first successful check it waits for one, bounded by ctx and
// ServerSelectionTimeout, and fails with a *SelectionError.
func (t *Topology) WaitHello(ctx context.Context) (*upstream.Hello, error) {
	if h := t.currentHello(); h != nil {
		return h, nil
	}
	start := time.Now()
	timer := time.NewTimer(t.opts.ServerSelectionTimeout)
	defer timer.Stop()
	select {
	case <-t.helloReady:
		if h := t.currentHello(); h != nil {
			return h, nil
		}
		return nil, t.selectionError(start, ErrClosed)
	case <-t.done:
		return nil, t.selectionError(start, ErrClosed)
	case <-ctx.Done():
		return nil, t.selectionError(start, ctx.Err())
	case <-timer.C:
		return nil, t.selectionError(start, ErrSelectionTimeout)
	}
}

func (t *Topology) currentHello() *upstream.Hello {
	if t.isClosed() {
		return nil
	}
	if sel := t.sel.Load(); len(sel.servers) > 0 {
		if h := sel.servers[0].Hello(); h != nil {
			return h
		}
	}
	return t.lastHello.Load()
}

func (t *Topology) selectionError(start time.Time, cause error) *SelectionError {
	e := &SelectionError{Topology: t.name, Waited: time.Since(start), Err: cause}
	for _, s := range t.servers {
		d := s.desc.Load()
		e.Servers = append(e.Servers, ServerStatus{Address: s.addr, State: d.State, Kind: d.Kind, Err: d.LastError})
	}
	return e
}
