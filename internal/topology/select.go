package topology

import (
	"context"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/sdam"
)

// Criteria says what a request needs of a server. The zero value asks for
// a server that takes writes: the primary of a replica set, any mongos, the
// load balancer, or the server of a Single topology.
type Criteria struct {
	// ReadPref, when not nil, is the read preference of a read: in a
	// replica set it selects among the members it allows (server-selection
	// spec); elsewhere the server takes writes and reads alike, and a mongos
	// applies the read preference itself (the request carries it). The
	// caller has validated it (sdam.ReadPref.Validate).
	ReadPref *sdam.ReadPref
}

// SelectServer returns a server meeting c. When there is none it requests
// immediate checks and waits, bounded by ctx and ServerSelectionTimeout, for
// the topology to change (a new primary after an election, a member coming
// back), then fails with a *SelectionError naming every server and its last
// error.
//
// The common case (a write, or a read without a read preference, with the
// servers up) reads one atomic snapshot and allocates nothing.
func (t *Topology) SelectServer(ctx context.Context, c Criteria) (*Server, error) {
	if s := t.pickFor(t.sel.Load(), c); s != nil {
		return s, nil
	}
	return t.selectSlow(ctx, c)
}

// TrySelectServer is SelectServer for callers that must never wait (the
// proxy's event loop): it returns nil, having requested nothing, when no
// server meets c now, and the caller uses SelectServer.
func (t *Topology) TrySelectServer(c Criteria) *Server {
	return t.pickFor(t.sel.Load(), c)
}

// WritableServers returns the servers a write (or a read without a read
// preference) may select now: the primary, every mongos, a load balancer,
// or the server of a Single topology, each Usable. Readiness checks use it;
// a server's pool may still be paused for a moment after an admin
// reconnect.
func (t *Topology) WritableServers() []*Server { return slices.Clone(t.sel.Load().writable) }

func (t *Topology) selectSlow(ctx context.Context, c Criteria) (*Server, error) {
	start := time.Now()
	timer := time.NewTimer(t.opts.ServerSelectionTimeout)
	defer timer.Stop()
	for {
		sel := t.sel.Load()
		if sel.closed {
			return nil, t.selectionError(start, ErrClosed)
		}
		if s := t.pickFor(sel, c); s != nil {
			return s, nil
		}
		// SDAM server selection: with nothing suitable, ask every monitor to
		// check now rather than at its next heartbeat.
		for _, s := range sel.all {
			s.RequestCheck()
		}
		select {
		case <-sel.changed:
		case <-ctx.Done():
			return nil, t.selectionError(start, ctx.Err())
		case <-timer.C:
			return nil, t.selectionError(start, ErrSelectionTimeout)
		}
	}
}

// pickFor chooses a server meeting c in snapshot sel, or returns nil.
func (t *Topology) pickFor(sel *selection, c Criteria) *Server {
	rp := c.ReadPref
	if rp == nil || sel.td == nil || rp.Mode == sdam.Primary ||
		(sel.td.Type != sdam.ReplicaSetWithPrimary && sel.td.Type != sdam.ReplicaSetNoPrimary) {
		srv := t.pick(sel.writable)
		if srv != nil && srv.State() != Usable {
			// The server's new description is stored before the snapshot
			// that drops it is published: whoever saw it Unknown must not
			// be given it. The publish closes sel.changed.
			return nil
		}
		return srv
	}
	if sel.td.CompatibilityError != nil {
		return nil
	}
	// A replica set read with a read preference: the specification's
	// suitable servers, its latency window, and of two random servers in
	// the window the one with fewer operations in flight.
	cands, err := sdam.SuitableServers(sel.td, false, *rp, t.opts.HeartbeatInterval, time.Now())
	if err != nil {
		return nil
	}
	ready := cands[:0:0]
	for _, sd := range cands {
		if srv := sel.byAddr[sd.Address]; srv != nil && srv.State() == Usable {
			// The window compares the live average: while a member is
			// streamed, its RTT monitor updates it between the streamed
			// replies, which alone publish new descriptions.
			if rtt, ok := srv.avgRTT(); ok {
				sd.AvgRTT, sd.HasRTT = rtt, true
			}
			ready = append(ready, sd)
		}
	}
	window := ready
	if t.opts.LocalThreshold >= 0 {
		window = sdam.InLatencyWindow(ready, t.opts.LocalThreshold)
	}
	if len(window) == 0 {
		return nil
	}
	sd := sdam.PickInWindow(window, func(addr string) int {
		if srv := sel.byAddr[addr]; srv != nil {
			return srv.load()
		}
		return 0
	}, rand.IntN)
	return sel.byAddr[sd.Address]
}

// pick chooses among the selectable servers: first the latency window
// (servers whose RTT is within LocalThreshold of the fastest), then the
// configured policy. It returns nil when servers is empty.
func (t *Topology) pick(servers []*Server) *Server {
	switch len(servers) {
	case 0:
		return nil
	case 1:
		return servers[0]
	}
	limit := time.Duration(-1)
	if t.opts.LocalThreshold >= 0 {
		fastest := servers[0].RTT()
		for _, s := range servers[1:] {
			fastest = min(fastest, s.RTT())
		}
		limit = fastest + t.opts.LocalThreshold
	}
	inWindow := func(s *Server) bool { return limit < 0 || s.RTT() <= limit }

	n := len(servers)
	turn := int(t.rr.Add(1) % uint64(n))
	if t.opts.Selection == SelectRoundRobin {
		// Start at this turn's server and take the first one in the window;
		// with every server in the window this is a plain rotation.
		for i := range n {
			if s := servers[(turn+i)%n]; inWindow(s) {
				return s
			}
		}
		return servers[turn]
	}
	// Least busy: fewest checkouts in use, being established or waiting.
	// Scanning from a rotating start breaks ties in turn.
	var best *Server
	bestLoad := 0
	for i := range n {
		s := servers[(turn+i)%n]
		if !inWindow(s) {
			continue
		}
		if l := s.load(); best == nil || l < bestLoad {
			best, bestLoad = s, l
		}
	}
	if best == nil {
		return servers[turn]
	}
	return best
}

// load is the server's pool demand: connections in use plus connections
// being established plus checkouts waiting, in its main pool and its user
// pools.
func (s *Server) load() int {
	st := s.pool.Stats()
	n := st.InUse + st.Pending + st.Waiters
	s.eachUserPool(func(p *pool.Pool) {
		c := p.Stats().Counts
		n += c.InUse + c.Pending + c.Waiters
	})
	return n
}
