package topology

// Discovery: every new description of a server (a monitor's check, or an
// application error) goes through Topology.update, which applies it to the
// SDAM topology description (internal/sdam), adds the servers discovery
// found and removes those that left, moves each server's pool between
// paused and ready, publishes a new selection snapshot and logs the change.

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/sdam"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// selection is an immutable snapshot of the topology for server selection.
type selection struct {
	// td is the topology description the snapshot was made from.
	td *sdam.TopologyDescription
	// all are the current servers, sorted by address; byAddr finds them.
	all    []*Server
	byAddr map[string]*Server
	// writable are the servers a write (or a read without a read
	// preference) may use: the primary, every mongos, a load balancer, or
	// the server of a Single topology; each is Usable with a ready pool.
	writable []*Server
	// gone are the latest servers discovery removed, with why.
	gone []ServerStatus
	// changed is closed when the set of selectable servers changes, waking
	// waiters; snapshots that change nothing selectable share it.
	changed chan struct{}
	closed  bool
}

// update applies sd, a new description of s from its monitor, to the
// topology. h is the hello it came from (nil for a failed check). When
// clear is set the pool of s is cleared after the change is published
// (interrupting in-use connections if interrupt is set), as SDAM orders it.
func (t *Topology) update(s *Server, sd sdam.ServerDescription, h *upstream.Hello, clear, interrupt bool) {
	t.mu.Lock()
	if t.closed || t.servers[s.addr] != s {
		t.mu.Unlock()
		return
	}
	if h != nil {
		t.lastHello.Store(h)
		if !t.helloSeen {
			t.helloSeen = true
			close(t.helloReady)
		}
	}
	removed := t.applyLocked(s, sd, h)
	t.publishLocked()
	if clear {
		// After publishing: no new selection picks s while it clears.
		s.clearPoolsLocked(sd.Error, interrupt)
	}
	t.mu.Unlock()
	for _, r := range removed {
		// Requests in flight on it finish (or fail) on their own; its
		// idle connections close now and the rest at check-in.
		r.closePools()
	}
}

// SetHosts replaces the topology's hosts with a new list from an SRV poll
// (polling-srv-records-for-mongos-discovery): hosts no longer listed are
// removed and new ones added, as Unknown servers with their own monitor and
// pool. As the specification says, it changes only a topology whose type is
// Sharded or Unknown: a replica set is discovered from its members, not from
// DNS. hosts must be normalized as Options.Hosts are. It reports whether the
// topology changed.
func (t *Topology) SetHosts(hosts []string) bool {
	t.mu.Lock()
	if t.closed || (t.desc.Type != sdam.Sharded && t.desc.Type != sdam.TopologyUnknown) || len(hosts) == 0 {
		t.mu.Unlock()
		return false
	}
	want := make(map[string]bool, len(hosts))
	for _, h := range hosts {
		want[h] = true
	}
	next := t.desc
	next.Servers = nil
	for _, sd := range t.desc.Servers {
		if want[sd.Address] {
			next.Servers = append(next.Servers, sd)
			delete(want, sd.Address)
		}
	}
	for h := range want {
		next.Servers = append(next.Servers, sdam.ServerDescription{Address: h, LastUpdateTime: time.Now()})
	}
	slices.SortFunc(next.Servers, func(a, b sdam.ServerDescription) int { return strings.Compare(a.Address, b.Address) })
	if slices.EqualFunc(next.Servers, t.desc.Servers, func(a, b sdam.ServerDescription) bool { return a.Address == b.Address }) {
		t.mu.Unlock()
		return false
	}
	prev := t.desc
	t.desc = next
	removed := t.syncServersLocked(&prev, nil, sdam.ServerDescription{}, nil)
	t.publishLocked()
	t.mu.Unlock()
	for _, r := range removed {
		r.closePools()
	}
	return true
}

// applyLocked applies sd to the description and the servers, and returns
// the servers that left the topology (their monitors stopped; the caller
// closes their pools without holding mu).
func (t *Topology) applyLocked(s *Server, sd sdam.ServerDescription, h *upstream.Hello) []*Server {
	prev := t.desc
	t.desc = sdam.Apply(prev, t.cfg, sd)
	return t.syncServersLocked(&prev, s, sd, h)
}

// syncServersLocked makes the servers follow t.desc, which was prev: a
// Server with its pool and monitor for each new address, each server's new
// description (with h for s, whose description sd was just applied), and
// the servers that left stopped and returned, for the caller to close their
// pools without holding mu. It logs the change.
func (t *Topology) syncServersLocked(prev *sdam.TopologyDescription, s *Server, sd sdam.ServerDescription, h *upstream.Hello) []*Server {
	next := t.desc
	present := make(map[string]bool, len(next.Servers))
	for _, nsd := range next.Servers {
		present[nsd.Address] = true
		srv := t.servers[nsd.Address]
		if srv == nil {
			var err error
			if srv, err = t.addServerLocked(nsd.Address); err != nil {
				t.log.Error("cannot add a discovered server", slog.String("topology", t.name),
					slog.String("address", nsd.Address), slog.Any("error", err))
				continue
			}
			t.startMonitorLocked(srv)
			level := slog.LevelInfo
			if t.goneIndex(nsd.Address) >= 0 {
				// Back after a removal: a member that a primary lists but
				// that removes itself again (another set's member, a `me`
				// mismatch) comes back at every heartbeat of the primary;
				// its removal was logged with the reason.
				level = slog.LevelDebug
			}
			t.log.Log(context.Background(), level, "server discovered", slog.String("topology", t.name), slog.String("address", nsd.Address))
		} else if i := t.goneIndex(nsd.Address); i >= 0 && nsd.Type != sdam.Unknown {
			// Back for good: no longer one of the removed servers.
			t.gone = slices.Delete(t.gone, i, i+1)
		}
		var hello *upstream.Hello
		if srv == s && h != nil && nsd.Type == sd.Type {
			hello = h
		}
		srv.setDescLocked(nsd, hello)
	}
	var removed []*Server
	for addr, srv := range t.servers {
		if present[addr] {
			continue
		}
		delete(t.servers, addr)
		srv.removed.Store(true)
		if srv.stop != nil {
			srv.stop()
		}
		removed = append(removed, srv)
		why := removalReason(addr, prev, &next, sd)
		level := slog.LevelWarn
		if i := t.goneIndex(addr); i >= 0 {
			if t.gone[i].Removed == why {
				level = slog.LevelDebug // the same bad input again
			}
			t.gone = slices.Delete(t.gone, i, i+1)
		}
		t.gone = append(t.gone, ServerStatus{Address: addr, State: Unknown, Kind: srv.Kind(), Removed: why})
		if len(t.gone) > maxGone {
			t.gone = slices.Delete(t.gone, 0, len(t.gone)-maxGone)
		}
		t.log.Log(context.Background(), level, "server removed from the topology", slog.String("topology", t.name),
			slog.String("address", addr), slog.String("reason", why))
	}
	if from, to := summary(prev), summary(&next); from != to {
		attrs := []any{slog.String("topology", t.name), slog.String("from", from), slog.String("to", to)}
		if sd.Error != nil {
			attrs = append(attrs, slog.String("address", sd.Address), slog.Any("error", sd.Error))
		}
		level := slog.LevelInfo
		// Removed servers coming back Unknown, or leaving again, are
		// logged by the lines above; alone they are no change worth Info.
		quiet := func(d sdam.ServerDescription) bool { return d.Type == sdam.Unknown && t.goneIndex(d.Address) >= 0 }
		if summarySkipping(prev, quiet) == summarySkipping(&next, quiet) {
			level = slog.LevelDebug
		}
		t.log.Log(context.Background(), level, "topology changed", attrs...)
	}
	if next.CompatibilityError != nil && (prev.CompatibilityError == nil || prev.CompatibilityError.Error() != next.CompatibilityError.Error()) {
		t.log.Error("topology is incompatible", slog.String("topology", t.name), slog.Any("error", next.CompatibilityError))
	}
	return removed
}

// maxGone bounds the removed servers a selection error names.
const maxGone = 8

// removalReason says why SDAM removed the server at addr when sd was
// applied to prev, giving next: what the server itself reported, or that
// the primary no longer lists it.
func removalReason(addr string, prev, next *sdam.TopologyDescription, sd sdam.ServerDescription) string {
	if sd.Address != addr {
		for _, p := range next.Servers {
			if p.Type == sdam.RSPrimary {
				return fmt.Sprintf("the primary %s does not list it", p.Address)
			}
		}
		return fmt.Sprintf("%s does not list it", sd.Address)
	}
	setName := next.SetName
	if setName == "" {
		setName = prev.SetName
	}
	switch {
	case sd.SetName != "" && setName != "" && sd.SetName != setName:
		return fmt.Sprintf("it is a member of replica set %q, not %q", sd.SetName, setName)
	case sd.Me != "" && sd.Me != addr:
		return fmt.Sprintf("it calls itself %q (hello's me), not %q", sd.Me, addr)
	case sd.Type == sdam.Standalone || sd.Type == sdam.Mongos || sd.Type == sdam.LoadBalancer:
		return fmt.Sprintf("it is a %s, which cannot be part of a %s topology", sd.Type, prev.Type)
	case sd.Type.IsReplicaSetMember() && prev.Type == sdam.Sharded:
		return fmt.Sprintf("it is a replica-set member (%s) among mongos routers", sd.Type)
	}
	return fmt.Sprintf("it reported %s", sd.Type)
}

// publishLocked replaces the selection snapshot. The old snapshot's
// waiters are woken only when the selectable servers changed.
func (t *Topology) publishLocked() {
	old := t.sel.Load()
	td := t.desc
	sel := &selection{td: &td, byAddr: make(map[string]*Server, len(t.servers)), gone: slices.Clone(t.gone)}
	for _, sd := range td.Servers {
		srv := t.servers[sd.Address]
		if srv == nil {
			continue
		}
		sel.all = append(sel.all, srv)
		sel.byAddr[sd.Address] = srv
		if srv.State() == Usable && writable(td.Type, sd.Type) {
			sel.writable = append(sel.writable, srv)
		}
	}
	if td.CompatibilityError != nil {
		// SDAM: an incompatible topology selects nothing; the selection
		// error says why.
		sel.writable = nil
	}
	if old.td != nil && slices.Equal(old.writable, sel.writable) && slices.Equal(old.all, sel.all) &&
		readable(old.td) == readable(&td) {
		sel.changed = old.changed
	} else {
		sel.changed = make(chan struct{})
		defer close(old.changed)
	}
	t.sel.Store(sel)
}

// writable reports whether a server of type st in a topology of type tt
// takes writes (and reads without a read preference).
func writable(tt sdam.TopologyType, st sdam.ServerType) bool {
	switch tt {
	case sdam.Single:
		return st.DataBearing()
	case sdam.ReplicaSetWithPrimary:
		return st == sdam.RSPrimary
	case sdam.Sharded:
		return st == sdam.Mongos
	case sdam.LoadBalanced:
		return st == sdam.LoadBalancer
	}
	return false
}

// readable summarizes what a read preference could select in td, so that a
// waiter for a secondary wakes when one appears although no writable
// server changed. In a replica set it covers everything the suitability of
// a member depends on besides its type: its tags (tag sets) and its
// lastWriteDate and lastUpdateTime (max staleness), so a waiter also wakes
// when a member is tagged or a lagging secondary catches up.
func readable(td *sdam.TopologyDescription) string {
	rs := td.Type == sdam.ReplicaSetWithPrimary || td.Type == sdam.ReplicaSetNoPrimary
	var b strings.Builder
	for _, sd := range td.Servers {
		if !sd.Type.DataBearing() {
			continue
		}
		b.WriteString(sd.Address)
		b.WriteByte(byte('0' + int(sd.Type)))
		if !rs {
			continue
		}
		for _, k := range slices.Sorted(maps.Keys(sd.Tags)) {
			fmt.Fprintf(&b, "|%q=%q", k, sd.Tags[k])
		}
		fmt.Fprintf(&b, "|%d|%d;", sd.LastWriteDate.UnixNano(), sd.LastUpdateTime.UnixNano())
	}
	return b.String()
}

// summary describes a topology for the log: its type and each server's
// role.
func summary(td *sdam.TopologyDescription) string {
	return summarySkipping(td, func(sdam.ServerDescription) bool { return false })
}

// summarySkipping is summary without the servers skip selects.
func summarySkipping(td *sdam.TopologyDescription, skip func(sdam.ServerDescription) bool) string {
	var b strings.Builder
	b.WriteString(td.Type.String())
	if td.SetName != "" {
		fmt.Fprintf(&b, " %q", td.SetName)
	}
	first := true
	for _, sd := range td.Servers {
		if skip(sd) {
			continue
		}
		if first {
			b.WriteString(": ")
			first = false
		} else {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %s", sd.Address, sd.Type)
	}
	return b.String()
}

// goneIndex returns the index in t.gone of the removal of addr, or -1.
// Called with mu held.
func (t *Topology) goneIndex(addr string) int {
	for i := len(t.gone) - 1; i >= 0; i-- {
		if t.gone[i].Address == addr {
			return i
		}
	}
	return -1
}

// setDescLocked records the server's new SDAM description nsd (and its
// hello, when it came from this check). The pool is made ready before the
// description says Usable, so selection never sees a Usable server whose
// pool is paused. Called with the topology's mu held.
func (s *Server) setDescLocked(nsd sdam.ServerDescription, hello *upstream.Hello) {
	prev := s.desc.Load()
	state := Unknown
	if nsd.Type != sdam.Unknown && nsd.Type != sdam.PossiblePrimary {
		state = Usable
		// Only a server that can serve operations gets connections: an
		// arbiter's or a ghost's pool stays paused.
		if nsd.Type.DataBearing() {
			if err := s.readyPoolsLocked(); err != nil {
				// Only a closed pool refuses; the topology is closing.
				return
			}
		}
	}
	kind := nsd.Type
	if state == Unknown && kind == sdam.Unknown {
		// Keep what the server was, for logs and errors; State decides.
		kind = prev.Kind
	}
	if hello == nil {
		hello = prev.Hello
	}
	var lastErr error
	if state == Unknown {
		lastErr = nsd.Error
	}
	if nsd.Type == sdam.Unknown && prev.SDAM.Type != sdam.Unknown {
		// SDAM: from a known type to Unknown, the round-trip time is null.
		s.resetRTT()
	}
	d := &Description{Address: s.addr, State: state, Kind: kind, Hello: hello, LastError: lastErr,
		Updated: time.Now(), SDAM: nsd}
	s.desc.Store(d)
	if prev.State != d.State || prev.Kind != d.Kind {
		s.emit(Event{Type: ServerChanged, Err: d.LastError, Previous: prev, New: d})
	}
}
