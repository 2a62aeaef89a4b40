package topology

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/sdam"
	"github.com/mongobouncer/mongobouncer/internal/srv"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// Topology is the deployment behind one route: its servers, discovered
// from the seed list as SDAM says, each with a pool and a monitor.
//
// Lock order, outermost first (the package's only statement of it):
//
//  1. Topology.mu.
//  2. A server's userPools.mu (usersMu; users.go): taken under mu to make,
//     ready or clear a user pool (UserPool, RetryUserPool,
//     readyPoolsLocked, clearPoolsLocked), and alone to read the set.
//  3. A pool's lock, main or user (Ready, ClearWithError, Stats, New),
//     taken under either of the above.
//  4. That pool's Monitor, which the pool calls under its lock (metrics'
//     locks: see metrics' poolMonitor).
//  5. The server's pool.Share lock (max_db_connections), a leaf a pool
//     takes under its own lock; it takes no other lock and reaches other
//     pools only through atomics (pool's share.go).
//
// mu is never held across a network round trip, a pool checkout or Close
// of a pool (which may run callbacks that call back into the topology);
// usersMu is never held while a pool is closed or an error is handled.
type Topology struct {
	name string
	opts Options
	log  *slog.Logger
	cfg  sdam.Config

	// sel is the current selection snapshot; SelectServer reads it without
	// locking. It is replaced (under mu) after every change of the
	// topology description.
	sel atomic.Pointer[selection]
	// rr rotates the starting point of least-busy scans and picks for
	// round-robin.
	rr atomic.Uint64
	// lastHello is the most recent successful hello of any server.
	lastHello atomic.Pointer[upstream.Hello]
	// closedFlag mirrors closed for lock-free checks on error paths.
	closedFlag atomic.Bool
	// multi is set once the topology has, or may have, more than one
	// server; it is never cleared (see Multi).
	multi atomic.Bool

	mu sync.Mutex
	// desc is the SDAM topology description; guarded by mu.
	desc sdam.TopologyDescription
	// servers holds a Server for every server of desc; guarded by mu.
	servers map[string]*Server
	// closed is set once by Close; guarded by mu.
	closed bool
	// helloSeen records that helloReady was closed; guarded by mu.
	helloSeen bool
	// gone are the latest servers removed, for selection errors; guarded
	// by mu, at most maxGone.
	gone []ServerStatus
	// sweeping is set once the idle user pool sweeper runs; guarded by
	// mu.
	sweeping bool

	// poller re-resolves a mongodb+srv:// host list; nil without one.
	poller *srv.Poller

	helloReady chan struct{}   // closed at the first successful hello
	done       chan struct{}   // closed by Close
	ctx        context.Context // cancelled by Close: stops the monitors
	cancel     context.CancelFunc
	wg         sync.WaitGroup // monitor goroutines
}

// New builds a topology named name (the route, for logs and errors) from
// the seed list o.Hosts, with one Server, pool and monitor per seed. Servers
// that discovery finds are added with their own pool and monitor, and
// servers that leave are closed. The pools stay paused until their server's
// first successful check. Close releases everything.
func New(name string, o Options) (*Topology, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	t := &Topology{
		name:       name,
		opts:       o,
		log:        o.Logger,
		servers:    make(map[string]*Server, len(o.Hosts)),
		helloReady: make(chan struct{}),
		done:       make(chan struct{}),
	}
	t.cfg = sdam.Config{Seeds: o.Hosts, SetName: o.ReplicaSet, DirectConnection: o.DirectConnection,
		LoadBalanced: o.Pool.LoadBalanced}
	t.desc = sdam.NewTopology(t.cfg)
	t.multi.Store(len(o.Hosts) > 1 || o.ReplicaSet != "")
	t.ctx, t.cancel = context.WithCancel(context.Background())
	t.sel.Store(&selection{changed: make(chan struct{}), byAddr: map[string]*Server{}})
	t.mu.Lock()
	for _, sd := range t.desc.Servers {
		s, err := t.addServerLocked(sd.Address)
		if err != nil {
			t.mu.Unlock()
			t.cancel()
			for _, prev := range t.servers {
				prev.pool.Close()
			}
			return nil, fmt.Errorf("topology %q: %w", name, err)
		}
		if o.Pool.LoadBalanced {
			// The load-balancer specification: no SDAM for a load
			// balancer; its pool is ready at once and it is always
			// selectable. The monitor still runs, only to keep a hello for
			// WaitHello.
			s.loadBalancer = true
		}
	}
	if o.Pool.LoadBalanced {
		for _, s := range t.servers {
			t.applyLocked(s, sdam.ServerDescription{Address: s.addr, Type: sdam.LoadBalancer, LastUpdateTime: time.Now()}, nil)
		}
	}
	t.publishLocked()
	for _, s := range t.servers {
		if s.stop == nil {
			t.startMonitorLocked(s)
		}
	}
	t.mu.Unlock()
	if p := o.SRV; p != nil && o.ReplicaSet == "" && !o.Pool.LoadBalanced {
		r := p.Resolver
		if r == nil {
			r = net.DefaultResolver
		}
		poller, err := srv.StartPoller(t.ctx, r, p.Host, o.Hosts, srv.PollOptions{Options: p.Options,
			Interval: p.Interval, RetryInterval: o.HeartbeatInterval, Logger: t.log,
			OnChange: func(hosts []string) {
				if t.SetHosts(hosts) {
					t.log.Debug("SRV records changed the hosts", slog.String("topology", name), slog.Any("hosts", hosts))
				}
			}})
		if err != nil {
			t.Close()
			return nil, fmt.Errorf("topology %q: SRV polling: %w", name, err)
		}
		t.poller = poller
	}
	return t, nil
}

// addServerLocked creates the Server and the pool of a new member; its
// monitor is started by startMonitorLocked. Called with mu held.
func (t *Topology) addServerLocked(addr string) (*Server, error) {
	s := newServer(t, addr)
	share, err := pool.NewShare(t.opts.MaxDBConnections)
	if err != nil {
		return nil, fmt.Errorf("pool for %s: %w", addr, err)
	}
	s.share = share
	po := t.opts.Pool
	po.Share = share
	// The pool calls this without its lock held, so clearing from it is
	// safe. Errors are *pool.ConnectionError: handled like a failed
	// checkout, with the generation check.
	po.OnBackgroundError = func(err error) { s.HandleError(err, nil) }
	if po.Logger == nil {
		po.Logger = t.opts.Logger
	}
	p, err := pool.New(addr, t.opts.Dialer, po)
	if err != nil {
		return nil, fmt.Errorf("pool for %s: %w", addr, err)
	}
	s.pool = p
	t.servers[addr] = s
	if len(t.servers) > 1 {
		t.multi.Store(true)
	}
	return s, nil
}

// startMonitorLocked starts the monitor goroutine of s. Called with mu
// held, so Close cannot miss it.
func (t *Topology) startMonitorLocked(s *Server) {
	ctx, cancel := context.WithCancel(t.ctx)
	s.stop = cancel
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		s.monitor(ctx)
	}()
}

// Name returns the topology's name.
func (t *Topology) Name() string { return t.name }

// SelectionTimeout returns the configured ServerSelectionTimeout (after
// defaults), for callers that bound their own selection context.
func (t *Topology) SelectionTimeout() time.Duration { return t.opts.ServerSelectionTimeout }

// HeartbeatInterval returns the configured HeartbeatInterval (after
// defaults): max staleness is validated against it.
func (t *Topology) HeartbeatInterval() time.Duration { return t.opts.HeartbeatInterval }

// Multi reports whether the topology has, or may come to have, more than one
// server: several seeds, a replica set, or a member discovered since. Cursor
// and transaction affinity matter only then. Once true it stays true, so a
// cursor opened while the set had two members is still followed after one
// leaves.
func (t *Topology) Multi() bool { return t.multi.Load() }

// Servers returns the topology's current servers, sorted by address.
func (t *Topology) Servers() []*Server { return slices.Clone(t.sel.Load().all) }

// SetMaxDBConnections changes max_db_connections live (a reload): on every
// current server, and for the servers discovered from now on.
func (t *Topology) SetMaxDBConnections(n int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if n < 0 {
		return fmt.Errorf("%w: MaxDBConnections %d must be >= 0", pool.ErrInvalidOptions, n)
	}
	t.opts.MaxDBConnections = n
	for _, s := range t.servers {
		if err := s.SetMaxDBConnections(n); err != nil {
			return err
		}
	}
	return nil
}

// ServerByAddress returns the current server whose (normalized, see
// Options.Hosts) address is addr, or nil. Cursors and transactions use it to
// return to the server that holds their state.
func (t *Topology) ServerByAddress(addr string) *Server { return t.sel.Load().byAddr[addr] }

// Description returns the current SDAM topology description.
func (t *Topology) Description() sdam.TopologyDescription {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.desc
}

// Close stops the monitors, fails pending selections with ErrClosed and
// closes every pool. It waits for the monitors to exit.
func (t *Topology) Close() {
	if t.poller != nil {
		// First: its callback takes mu.
		t.poller.Close()
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.closed = true
	t.closedFlag.Store(true)
	old := t.sel.Load()
	t.sel.Store(&selection{td: old.td, changed: make(chan struct{}), closed: true, all: old.all, byAddr: old.byAddr})
	close(old.changed)
	close(t.done)
	servers := make([]*Server, 0, len(t.servers))
	for _, s := range t.servers {
		servers = append(servers, s)
	}
	t.mu.Unlock()

	t.cancel()
	t.wg.Wait()
	for _, s := range servers {
		s.closePools()
	}
}

func (t *Topology) isClosed() bool { return t.closedFlag.Load() }

// WaitHello returns a hello reply to describe the upstream to clients: the
// latest hello of a server that can take writes, else the latest of any
// server. Before the first successful check it waits for one, bounded by ctx
// and ServerSelectionTimeout, and fails with a *SelectionError.
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
	if sel := t.sel.Load(); len(sel.writable) > 0 {
		if h := sel.writable[0].Hello(); h != nil {
			return h
		}
	}
	return t.lastHello.Load()
}

func (t *Topology) selectionError(start time.Time, cause error) *SelectionError {
	sel := t.sel.Load()
	e := &SelectionError{Topology: t.name, Waited: time.Since(start), Err: cause}
	if sel.td != nil {
		e.Type = sel.td.Type
		if sel.td.CompatibilityError != nil {
			e.Err = fmt.Errorf("%w (%v)", cause, sel.td.CompatibilityError)
		}
	}
	for _, s := range sel.all {
		d := s.desc.Load()
		e.Servers = append(e.Servers, ServerStatus{Address: s.addr, State: d.State, Kind: d.Kind, Err: d.LastError})
	}
	e.Servers = append(e.Servers, sel.gone...)
	return e
}
