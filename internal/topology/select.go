package topology

import (
	"context"
	"time"
)

// SelectServer returns a server for the next operation. When no server is
// selectable it requests immediate checks and waits, bounded by ctx and
// ServerSelectionTimeout, then fails with a *SelectionError naming every host
// and its last error.
//
// The common case (servers are up) reads one atomic snapshot and allocates
// nothing.
func (t *Topology) SelectServer(ctx context.Context) (*Server, error) {
	if s := t.pick(t.sel.Load().servers); s != nil {
		return s, nil
	}
	return t.selectSlow(ctx)
}

// TrySelectServer is SelectServer for callers that must never wait (the
// proxy's event loop): it returns nil, having requested nothing, when no
// server is selectable now, and the caller uses SelectServer.
func (t *Topology) TrySelectServer() *Server {
	return t.pick(t.sel.Load().servers)
}

func (t *Topology) selectSlow(ctx context.Context) (*Server, error) {
	start := time.Now()
	timer := time.NewTimer(t.opts.ServerSelectionTimeout)
	defer timer.Stop()
	for {
		sel := t.sel.Load()
		if sel.closed {
			return nil, t.selectionError(start, ErrClosed)
		}
		if s := t.pick(sel.servers); s != nil {
			return s, nil
		}
		// SDAM server selection: with nothing suitable, ask every monitor to
		// check now rather than at its next heartbeat.
		for _, s := range t.servers {
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
// being established plus checkouts waiting.
func (s *Server) load() int {
	st := s.pool.Stats()
	return st.InUse + st.Pending + st.Waiters
}
