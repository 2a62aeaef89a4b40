// The topology state machine: the initial TopologyDescription and Apply,
// which folds one new ServerDescription into it (SDAM "Updating the
// TopologyDescription"), with the checks every update ends with: wire
// version compatibility and the logical session timeout. The replica set
// subroutines are in replicaset.go.

package sdam

import (
	"bytes"
	"cmp"
	"fmt"
	"slices"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// The wire versions this program speaks with upstream servers (SDAM's
// clientMinWireVersion and clientMaxWireVersion). A server whose range does
// not overlap makes the topology incompatible (CompatibilityError).
const (
	// MinSupportedWireVersion is MongoDB 4.2: the specifications dropped
	// everything older, and 4.2 is where a stepdown stopped closing
	// connections (the error rules below rely on it).
	MinSupportedWireVersion = 8
	// MaxSupportedWireVersion is the newest protocol we know (MongoDB 8.2);
	// it matches what the proxy tells its own clients.
	MaxSupportedWireVersion = 25
)

// minSupportedMongoDBVersion names the release of MinSupportedWireVersion
// for the compatibility error.
const minSupportedMongoDBVersion = "4.2"

// Config is what the topology rules need from the user's configuration.
type Config struct {
	// Seeds are the initial servers, already normalized to "host:port" with
	// the host lowered (or Unix socket paths).
	Seeds []string
	// SetName is the replicaSet option; "" when absent.
	SetName string
	// DirectConnection connects to the one seed as TopologyType Single.
	DirectConnection bool
	// LoadBalanced connects through a load balancer (TopologyType
	// LoadBalanced): the one seed is never checked.
	LoadBalanced bool
}

// IncompatibleServerError is why a topology is incompatible: a known
// server's wire version range does not overlap ours. The message is the
// one the spec prescribes.
type IncompatibleServerError struct {
	Address        string
	MinWireVersion int32
	MaxWireVersion int32
}

// Error implements error.
func (e *IncompatibleServerError) Error() string {
	if e.MinWireVersion > MaxSupportedWireVersion {
		return fmt.Sprintf("Server at %s requires wire version %d, but this version of mongobouncer only supports up to %d.",
			e.Address, e.MinWireVersion, MaxSupportedWireVersion)
	}
	return fmt.Sprintf("Server at %s reports wire version %d, but this version of mongobouncer requires at least %d (MongoDB %s).",
		e.Address, e.MaxWireVersion, MinSupportedWireVersion, minSupportedMongoDBVersion)
}

// SetNameMismatchError is the error of a server that reported a replica set
// name other than the configured one while connected directly (TopologyType
// Single): the spec makes such a server Unknown.
type SetNameMismatchError struct {
	Want, Got string
}

// Error implements error.
func (e *SetNameMismatchError) Error() string {
	if e.Got == "" {
		return fmt.Sprintf("server is not a member of replica set %q", e.Want)
	}
	return fmt.Sprintf("server is a member of replica set %q, not %q", e.Got, e.Want)
}

// NewTopology is the initial TopologyDescription for cfg: LoadBalanced with
// loadBalanced=true, Single with directConnection=true, ReplicaSetNoPrimary
// with a replica set name, Unknown otherwise (the spec's table; a single
// seed is not Single until it turns out to be a standalone). Every seed is
// an Unknown server; duplicates are dropped.
func NewTopology(cfg Config) TopologyDescription {
	td := TopologyDescription{SetName: cfg.SetName}
	switch {
	case cfg.LoadBalanced:
		td.Type = LoadBalanced
	case cfg.DirectConnection:
		td.Type = Single
	case cfg.SetName != "":
		td.Type = ReplicaSetNoPrimary
	default:
		td.Type = TopologyUnknown
	}
	for _, s := range cfg.Seeds {
		if !td.has(s) {
			td.Servers = append(td.Servers, ServerDescription{Address: s})
		}
	}
	td.finish()
	return td
}

// Apply folds the new description sd of one server into td and returns the
// new TopologyDescription; td itself is not modified. It ignores sd (and
// returns td unchanged) when the server is no longer in td, or when sd's
// topologyVersion is older than the one td holds for the server (a reply
// overtaken by a newer one).
//
// A server absent from the result was removed: the caller stops its
// monitor and closes its pool. A server present in the result but not in td
// was added: the caller starts monitoring it (Diff lists both). A former
// primary that a newer one displaced is now Unknown with a
// *StalePrimaryError whose NewerPrimary is true: the caller requests an
// immediate check of it and must not clear its pool. Servers are sorted by
// address.
//
// In a LoadBalanced topology only a LoadBalancer description applies, and
// only there.
func Apply(td TopologyDescription, cfg Config, sd ServerDescription) TopologyDescription {
	cur, ok := td.Server(sd.Address)
	if !ok {
		return td
	}
	if CompareTopologyVersion(cur.TopologyVersion, sd.TopologyVersion) > 0 {
		return td
	}
	if sd.Type == Unknown {
		// An Unknown server has no round trip time (SDAM "roundTripTime").
		sd.AvgRTT, sd.HasRTT = 0, false
	}
	if (td.Type == LoadBalanced) != (sd.Type == LoadBalancer) {
		// A load balancer is never checked nor marked Unknown (the load
		// balancer spec), and only a load balancer is one.
		return td
	}
	next := td
	next.Servers = slices.Clone(td.Servers)
	switch td.Type {
	case Single:
		if cfg.SetName != "" && sd.Type != Unknown && sd.SetName != cfg.SetName {
			sd = UnknownServer(sd.Address, &SetNameMismatchError{Want: cfg.SetName, Got: sd.SetName}, nil)
		}
		next.replace(sd)
	case LoadBalanced:
		next.replace(sd)
	default:
		next.replace(sd)
		next.update(cfg, sd)
	}
	next.finish()
	return next
}

// update runs the action of the spec's TopologyType table for sd, whose
// description has just replaced the server's old one.
func (td *TopologyDescription) update(cfg Config, sd ServerDescription) {
	switch td.Type {
	case TopologyUnknown:
		switch sd.Type {
		case Standalone:
			td.updateUnknownWithStandalone(cfg, sd)
		case Mongos:
			td.Type = Sharded
		case RSPrimary:
			td.Type = ReplicaSetWithPrimary
			td.updateRSFromPrimary(sd)
		case RSSecondary, RSArbiter, RSOther:
			td.Type = ReplicaSetNoPrimary
			td.updateRSWithoutPrimary(sd)
		}
		// Unknown and RSGhost: no-op (an RSGhost has no set name, so it
		// cannot tell which replica set this is).
	case Sharded:
		if sd.Type != Unknown && sd.Type != Mongos {
			td.remove(sd.Address)
		}
	case ReplicaSetNoPrimary:
		switch sd.Type {
		case Standalone, Mongos:
			td.remove(sd.Address)
		case RSPrimary:
			td.Type = ReplicaSetWithPrimary
			td.updateRSFromPrimary(sd)
		case RSSecondary, RSArbiter, RSOther:
			td.updateRSWithoutPrimary(sd)
		}
	case ReplicaSetWithPrimary:
		switch sd.Type {
		case Standalone, Mongos:
			td.remove(sd.Address)
			td.checkIfHasPrimary()
		case RSPrimary:
			td.updateRSFromPrimary(sd)
		case RSSecondary, RSArbiter, RSOther:
			td.updateRSWithPrimaryFromMember(sd)
		default:
			td.checkIfHasPrimary()
		}
	}
}

// updateUnknownWithStandalone: one seed that is a standalone makes the
// topology Single; among several seeds a standalone is dropped, since the
// user more likely listed a replica set with a member taken out for
// maintenance.
func (td *TopologyDescription) updateUnknownWithStandalone(cfg Config, sd ServerDescription) {
	if len(slices.Compact(slices.Sorted(slices.Values(cfg.Seeds)))) == 1 {
		td.Type = Single
		return
	}
	td.remove(sd.Address)
}

// CompareTopologyVersion orders two topologyVersions as the spec's
// compareTopologyVersion: -1 when a is older than b, 0 when equal, 1 when
// newer. A nil on either side, or different process ids, count as "a is
// older": the other one comes from a new process or cannot be compared, so
// it is taken as more recent.
func CompareTopologyVersion(a, b *TopologyVersion) int {
	if a == nil || b == nil || a.ProcessID != b.ProcessID {
		return -1
	}
	return cmp.Compare(a.Counter, b.Counter)
}

// finish sorts the servers and recomputes what depends on all of them:
// compatibility and the logical session timeout.
func (td *TopologyDescription) finish() {
	slices.SortFunc(td.Servers, func(a, b ServerDescription) int { return cmp.Compare(a.Address, b.Address) })
	td.CompatibilityError = nil
	for _, s := range td.Servers {
		if !s.Type.checked() {
			continue
		}
		if s.MinWireVersion > MaxSupportedWireVersion || s.MaxWireVersion < MinSupportedWireVersion {
			td.CompatibilityError = &IncompatibleServerError{
				Address: s.Address, MinWireVersion: s.MinWireVersion, MaxWireVersion: s.MaxWireVersion,
			}
			break
		}
	}
	td.LogicalSessionTimeoutMinutes = nil
	for i, s := range td.Servers {
		if !s.Type.DataBearing() {
			continue
		}
		if s.LogicalSessionTimeoutMinutes == nil {
			td.LogicalSessionTimeoutMinutes = nil
			return
		}
		if td.LogicalSessionTimeoutMinutes == nil || *s.LogicalSessionTimeoutMinutes < *td.LogicalSessionTimeoutMinutes {
			td.LogicalSessionTimeoutMinutes = td.Servers[i].LogicalSessionTimeoutMinutes
		}
	}
}

// checked reports whether a server of this type answered a hello, so that
// its wire versions mean something: not Unknown, not PossiblePrimary (an
// Unknown another member named), not a LoadBalancer (never checked).
func (t ServerType) checked() bool {
	return t != Unknown && t != PossiblePrimary && t != LoadBalancer
}

func (td *TopologyDescription) has(addr string) bool {
	_, ok := td.index(addr)
	return ok
}

func (td *TopologyDescription) index(addr string) (int, bool) {
	for i := range td.Servers {
		if td.Servers[i].Address == addr {
			return i, true
		}
	}
	return 0, false
}

// replace puts sd in place of the server with its address, if present.
func (td *TopologyDescription) replace(sd ServerDescription) {
	if i, ok := td.index(sd.Address); ok {
		td.Servers[i] = sd
	}
}

// add adds a default (Unknown) server unless it is there already.
func (td *TopologyDescription) add(addr string) {
	if addr != "" && !td.has(addr) {
		td.Servers = append(td.Servers, ServerDescription{Address: addr})
	}
}

func (td *TopologyDescription) remove(addr string) {
	if i, ok := td.index(addr); ok {
		td.Servers = slices.Delete(td.Servers, i, i+1)
	}
}

// compareObjectID orders electionIds bytewise, nil before any value.
func compareObjectID(a, b *bson.ObjectID) int {
	switch {
	case a == nil && b == nil:
		return 0
	case a == nil:
		return -1
	case b == nil:
		return 1
	}
	return bytes.Compare(a[:], b[:])
}

// compareSetVersion orders setVersions, nil before any value.
func compareSetVersion(a, b *int64) int {
	switch {
	case a == nil && b == nil:
		return 0
	case a == nil:
		return -1
	case b == nil:
		return 1
	}
	return cmp.Compare(*a, *b)
}
