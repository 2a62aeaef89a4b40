// This file holds server selection (server-selection.md, "Rules for server
// selection", and the staleness filter of max-staleness.md): which servers
// of a topology are suitable for an operation, which of those are in the
// latency window, and the choice of one by operationCount. It keeps no
// state: the caller passes the topology, the read preference, the
// heartbeat frequency, the time and the operation counts, and does the
// waiting and retrying itself.

package sdam

import (
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// DefaultLocalThreshold is localThresholdMS's default, the width of the
// latency window.
const DefaultLocalThreshold = 15 * time.Millisecond

// SuitableServers returns the servers of td suitable for a read (write
// false) with read preference rp, or for a write, following the rules per
// topology type:
//
//   - Unknown: none.
//   - Single: the server, if available (not Unknown nor PossiblePrimary);
//     the read preference is ignored.
//   - LoadBalanced: the load balancer.
//   - Sharded: every mongos, for reads and writes; the read preference is
//     passed on to mongos, not applied here.
//   - ReplicaSetWithPrimary, ReplicaSetNoPrimary: writes go to the primary
//     only; reads follow rp's mode, then max staleness, then the first tag
//     set that matches a candidate, with primaryPreferred falling back to
//     the secondaries and secondaryPreferred to the primary.
//
// heartbeat is the monitors' heartbeatFrequency: it enters the staleness
// estimate and the smallest allowed max staleness. The staleness estimate
// deliberately does not read the current time (max-staleness.md rejects
// that, as it sloshes load between checks); now only stands in for the
// LastUpdateTime of a description the caller never stamped.
//
// An empty result with a nil error means no server is suitable yet: the
// caller waits for a topology change and tries again. The error is the
// topology's CompatibilityError, or a *ReadPrefError for a read preference
// the topology cannot accept (mode primary with a tag set or max
// staleness; for replica sets also a max staleness below
// SmallestMaxStaleness or heartbeat + IdleWritePeriod). Writes ignore rp.
// The result is a new slice, in td's server order.
func SuitableServers(td *TopologyDescription, write bool, rp ReadPref, heartbeat time.Duration, now time.Time) ([]ServerDescription, error) {
	return SuitableServersDeprioritized(td, write, rp, heartbeat, now, nil)
}

// SuitableServersDeprioritized is SuitableServers for a retry: the servers
// at the deprioritized addresses (those an earlier attempt of the same
// operation failed on) are left out, unless leaving them out leaves no
// suitable server, in which case they are considered again
// (server-selection.md, "Server Selection Algorithm", step 3). Staleness is
// still measured against the whole topology, deprioritized servers
// included: they remain the best evidence of where the primary's writes
// are.
func SuitableServersDeprioritized(td *TopologyDescription, write bool, rp ReadPref, heartbeat time.Duration, now time.Time, deprioritized []string) ([]ServerDescription, error) {
	if td == nil {
		return nil, nil
	}
	if td.CompatibilityError != nil {
		return nil, td.CompatibilityError
	}
	if !write {
		if err := rp.checkMode(); err != nil {
			return nil, err
		}
		if td.Type == ReplicaSetWithPrimary || td.Type == ReplicaSetNoPrimary {
			if err := rp.checkStaleness(heartbeat); err != nil {
				return nil, err
			}
		}
	}
	sel := selection{td: td, write: write, rp: rp, heartbeat: heartbeat, now: now}
	if len(deprioritized) > 0 {
		sel.skip = func(addr string) bool { return slices.Contains(deprioritized, addr) }
		if out := sel.suitable(); len(out) > 0 {
			return out, nil
		}
		sel.skip = nil
	}
	return sel.suitable(), nil
}

// selection is one pass of the suitability rules; skip, when set, hides
// the deprioritized servers from the candidates (not from the staleness
// reference).
type selection struct {
	td        *TopologyDescription
	write     bool
	rp        ReadPref
	heartbeat time.Duration
	now       time.Time
	skip      func(addr string) bool
}

// ofType returns the candidate servers of the given types, in td's order.
func (s *selection) ofType(types ...ServerType) []ServerDescription {
	var out []ServerDescription
	for _, sd := range s.td.Servers {
		if slices.Contains(types, sd.Type) && (s.skip == nil || !s.skip(sd.Address)) {
			out = append(out, sd)
		}
	}
	return out
}

func (s *selection) suitable() []ServerDescription {
	switch s.td.Type {
	case Single:
		return s.ofType(Standalone, Mongos, RSPrimary, RSSecondary, RSArbiter, RSOther, RSGhost, LoadBalancer)
	case LoadBalanced:
		return s.ofType(LoadBalancer)
	case Sharded:
		return s.ofType(Mongos)
	case ReplicaSetWithPrimary, ReplicaSetNoPrimary:
		if s.write {
			return s.ofType(RSPrimary)
		}
		return s.replicaSetRead()
	}
	return nil // TopologyUnknown, or a type this code does not know
}

// replicaSetRead applies the read preference modes to a replica set.
func (s *selection) replicaSetRead() []ServerDescription {
	switch s.rp.Mode {
	case Primary:
		return s.ofType(RSPrimary)
	case PrimaryPreferred:
		if p := s.ofType(RSPrimary); len(p) > 0 {
			return p
		}
		return s.eligible(s.ofType(RSSecondary))
	case Secondary:
		return s.eligible(s.ofType(RSSecondary))
	case SecondaryPreferred:
		if sec := s.eligible(s.ofType(RSSecondary)); len(sec) > 0 {
			return sec
		}
		return s.ofType(RSPrimary)
	case Nearest:
		return s.eligible(s.ofType(RSPrimary, RSSecondary))
	}
	return nil
}

// eligible filters candidates by max staleness, then by the tag sets:
// staleness first, so that a stale server matching the first tag set does
// not hide fresh servers matching a later one.
func (s *selection) eligible(candidates []ServerDescription) []ServerDescription {
	if s.rp.MaxStaleness > 0 {
		candidates = s.fresh(candidates)
	}
	return matchTagSets(candidates, s.rp.TagSets)
}

// matchTagSets returns the candidates matching the first tag set that
// matches any; all of them when there are no tag sets; none when no set
// matches.
func matchTagSets(candidates []ServerDescription, sets []TagSet) []ServerDescription {
	if len(sets) == 0 {
		return candidates
	}
	for _, ts := range sets {
		var out []ServerDescription
		for _, sd := range candidates {
			if ts.Matches(sd.Tags) {
				out = append(out, sd)
			}
		}
		if len(out) > 0 {
			return out
		}
	}
	return nil
}

// fresh keeps the candidates whose estimated staleness is at most the
// read preference's max staleness. Only secondaries have a staleness.
// Estimates are in microseconds, which int64 holds for any time.Time
// difference (nanoseconds overflow for the zero time).
//
// With a primary P (that reported a lastWriteDate), a secondary S is
// (S.lastUpdateTime - S.lastWriteDate) - (P.lastUpdateTime -
// P.lastWriteDate) + heartbeat; without, SMax.lastWriteDate -
// S.lastWriteDate + heartbeat, SMax being the secondary with the latest
// lastWriteDate. A secondary that reported no lastWriteDate has no
// estimate and is never fresh: its staleness cannot be shown to be within
// the bound.
func (s *selection) fresh(candidates []ServerDescription) []ServerDescription {
	limit := s.rp.MaxStaleness.Microseconds()
	hb := s.heartbeat.Microseconds()
	var primary, smax *ServerDescription
	for i := range s.td.Servers {
		sd := &s.td.Servers[i]
		if sd.LastWriteDate.IsZero() {
			continue
		}
		switch sd.Type {
		case RSPrimary:
			if primary == nil {
				primary = sd
			}
		case RSSecondary:
			if smax == nil || sd.LastWriteDate.After(smax.LastWriteDate) {
				smax = sd
			}
		}
	}
	var out []ServerDescription
	for _, sd := range candidates {
		if sd.Type != RSSecondary {
			out = append(out, sd) // staleness zero
			continue
		}
		if sd.LastWriteDate.IsZero() {
			continue
		}
		var staleness int64
		switch {
		case primary != nil:
			staleness = s.lagMicros(sd) - s.lagMicros(*primary) + hb
		case smax != nil:
			staleness = smax.LastWriteDate.UnixMicro() - sd.LastWriteDate.UnixMicro() + hb
		default:
			continue // unreachable: sd itself has a lastWriteDate
		}
		if staleness <= limit {
			out = append(out, sd)
		}
	}
	return out
}

// lagMicros is lastUpdateTime - lastWriteDate, the delta between the
// client's clock at the check and the primary's clock at the last write.
func (s *selection) lagMicros(sd ServerDescription) int64 {
	updated := sd.LastUpdateTime
	if updated.IsZero() {
		updated = s.now
	}
	return updated.UnixMicro() - sd.LastWriteDate.UnixMicro()
}

// InLatencyWindow returns the servers whose average round-trip time is
// within localThreshold of the fastest (a negative threshold counts as
// zero). A server with no RTT sample yet is in the window only when none
// of the servers has one: known-fast beats unknown, but a load balancer,
// which is never monitored, is still chosen. The result is a new slice in
// the order of servers.
func InLatencyWindow(servers []ServerDescription, localThreshold time.Duration) []ServerDescription {
	localThreshold = max(localThreshold, 0)
	fastest := time.Duration(math.MaxInt64)
	anyRTT := false
	for _, sd := range servers {
		if sd.HasRTT {
			anyRTT = true
			fastest = min(fastest, sd.AvgRTT)
		}
	}
	if !anyRTT {
		return slices.Clone(servers)
	}
	upper := fastest + localThreshold
	if upper < fastest { // overflow
		upper = time.Duration(math.MaxInt64)
	}
	var out []ServerDescription
	for _, sd := range servers {
		if sd.HasRTT && sd.AvgRTT <= upper {
			out = append(out, sd)
		}
	}
	return out
}

// PickInWindow chooses the server for an operation among the candidates in
// the latency window (server-selection.md, steps 6 and 7): with one
// candidate, that one; with more, two distinct ones at random, and of
// those the one with fewer operations in use (inUse(addr), the server's
// operationCount), either on a tie. Two random choices rather than the
// least loaded of all keep a burst of selections from piling onto one
// server between count updates. rnd(n) returns a random int in [0, n)
// (nil: math/rand/v2's IntN); an out-of-range value is folded into range
// rather than trusted. A nil inUse counts zero everywhere. With no
// candidates the zero ServerDescription is returned.
func PickInWindow(candidates []ServerDescription, inUse func(addr string) int, rnd func(n int) int) ServerDescription {
	switch len(candidates) {
	case 0:
		return ServerDescription{}
	case 1:
		return candidates[0]
	}
	if rnd == nil {
		rnd = rand.IntN
	}
	n := len(candidates)
	i := windowIndex(rnd, n)
	j := windowIndex(rnd, n-1)
	if j >= i {
		j++ // distinct from i, uniform over the others
	}
	a, b := candidates[i], candidates[j]
	if inUse != nil && inUse(b.Address) < inUse(a.Address) {
		return b
	}
	return a
}

// windowIndex calls rnd(n) and folds its result into [0, n).
func windowIndex(rnd func(int) int, n int) int {
	r := rnd(n)
	if r < 0 || r >= n {
		r %= n
		if r < 0 {
			r += n
		}
	}
	return r
}
