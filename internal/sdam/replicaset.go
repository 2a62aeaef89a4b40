// The replica set subroutines of the topology state machine (SDAM
// updateRSWithoutPrimary, updateRSWithPrimaryFromMember,
// updateRSFromPrimary, checkIfHasPrimary) and the stale-primary rules that
// order primaries by (electionId, setVersion).

package sdam

import (
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// wireVersionElectionIDFirst is MongoDB 6.0, from which a primary is
// ordered by electionId before setVersion, as the server itself does.
const wireVersionElectionIDFirst = 17

// StalePrimaryError is the error of a server that said it was primary but
// was marked Unknown: either a newer primary was found (NewerPrimary), or
// its (electionId, setVersion) is older than the newest seen. The messages
// hold the substrings the spec requires.
type StalePrimaryError struct {
	// NewerPrimary: another server reported itself primary since.
	NewerPrimary bool
	// The stale tuple and the newest one seen, when !NewerPrimary.
	ElectionID, MaxElectionID *bson.ObjectID
	SetVersion, MaxSetVersion *int64
}

// Error implements error.
func (e *StalePrimaryError) Error() string {
	if e.NewerPrimary {
		return "primary marked stale due to discovery of newer primary"
	}
	return fmt.Sprintf("primary marked stale due to electionId/setVersion mismatch, %s is stale compared to %s",
		tuple(e.ElectionID, e.SetVersion), tuple(e.MaxElectionID, e.MaxSetVersion))
}

func tuple(id *bson.ObjectID, v *int64) string {
	ids, vs := "null", "null"
	if id != nil {
		ids = id.Hex()
	}
	if v != nil {
		vs = fmt.Sprint(*v)
	}
	return "{electionId: " + ids + ", setVersion: " + vs + "}"
}

// updateRSWithoutPrimary: a secondary, arbiter or other member while no
// primary is known. Its host lists may only add servers; it removes only
// itself (wrong set name, or an address that is not its "me").
func (td *TopologyDescription) updateRSWithoutPrimary(sd ServerDescription) {
	if td.SetName == "" {
		td.SetName = sd.SetName
	} else if td.SetName != sd.SetName {
		td.remove(sd.Address)
		return
	}
	td.addMembers(sd)
	td.markPossiblePrimary(sd.Primary)
	if sd.Me != "" && sd.Address != sd.Me {
		td.remove(sd.Address)
	}
}

// updateRSWithPrimaryFromMember: a secondary, arbiter or other member while
// a primary is known. Only the primary's host list is trusted, so nothing is
// added; the member may remove itself, and if it was the primary the
// topology loses it.
func (td *TopologyDescription) updateRSWithPrimaryFromMember(sd ServerDescription) {
	if td.SetName != sd.SetName || (sd.Me != "" && sd.Address != sd.Me) {
		td.remove(sd.Address)
		td.checkIfHasPrimary()
		return
	}
	if !td.hasPrimary() {
		td.Type = ReplicaSetNoPrimary
		td.markPossiblePrimary(sd.Primary)
	}
}

// updateRSFromPrimary: a server that says it is primary. Unless it is stale
// by (electionId, setVersion) it becomes the one primary, its host lists
// become the topology's servers, and any other primary is marked Unknown
// (its pool is kept; the caller requests a check of it).
func (td *TopologyDescription) updateRSFromPrimary(sd ServerDescription) {
	if td.SetName == "" {
		td.SetName = sd.SetName
	} else if td.SetName != sd.SetName {
		td.remove(sd.Address)
		td.checkIfHasPrimary()
		return
	}
	if td.isStalePrimary(sd) {
		td.replace(UnknownServer(sd.Address, &StalePrimaryError{
			ElectionID: sd.ElectionID, SetVersion: sd.SetVersion,
			MaxElectionID: td.MaxElectionID, MaxSetVersion: td.MaxSetVersion,
		}, nil))
		td.checkIfHasPrimary()
		return
	}
	for i, s := range td.Servers {
		if s.Address != sd.Address && s.Type == RSPrimary {
			td.Servers[i] = UnknownServer(s.Address, &StalePrimaryError{NewerPrimary: true}, nil)
		}
	}
	td.addMembers(sd)
	members := make(map[string]bool, len(sd.Hosts)+len(sd.Passives)+len(sd.Arbiters))
	for _, list := range [][]string{sd.Hosts, sd.Passives, sd.Arbiters} {
		for _, a := range list {
			members[a] = true
		}
	}
	kept := td.Servers[:0]
	for _, s := range td.Servers {
		if members[s.Address] {
			kept = append(kept, s)
		}
	}
	clear(td.Servers[len(kept):])
	td.Servers = kept
	td.checkIfHasPrimary()
}

// isStalePrimary applies the (electionId, setVersion) ordering and, when
// the primary is not stale, records its tuple as the newest. From wire
// version 17 (MongoDB 6.0) electionId comes first and a missing value is
// less than any; before, setVersion comes first and a primary missing
// either value is never stale.
func (td *TopologyDescription) isStalePrimary(sd ServerDescription) bool {
	if sd.MaxWireVersion >= wireVersionElectionIDFirst {
		c := compareObjectID(sd.ElectionID, td.MaxElectionID)
		if c > 0 || (c == 0 && compareSetVersion(sd.SetVersion, td.MaxSetVersion) >= 0) {
			td.MaxElectionID, td.MaxSetVersion = sd.ElectionID, sd.SetVersion
			return false
		}
		return true
	}
	if sd.SetVersion != nil && sd.ElectionID != nil {
		if td.MaxSetVersion != nil && td.MaxElectionID != nil &&
			(*td.MaxSetVersion > *sd.SetVersion ||
				(*td.MaxSetVersion == *sd.SetVersion && compareObjectID(td.MaxElectionID, sd.ElectionID) > 0)) {
			return true
		}
		td.MaxElectionID = sd.ElectionID
	}
	if sd.SetVersion != nil && (td.MaxSetVersion == nil || *sd.SetVersion > *td.MaxSetVersion) {
		td.MaxSetVersion = sd.SetVersion
	}
	return false
}

// addMembers adds every address of sd's host lists not yet known.
func (td *TopologyDescription) addMembers(sd ServerDescription) {
	for _, list := range [][]string{sd.Hosts, sd.Passives, sd.Arbiters} {
		for _, a := range list {
			td.add(a)
		}
	}
}

// markPossiblePrimary turns the Unknown server a member named as primary
// into a PossiblePrimary (which a selector treats as Unknown).
func (td *TopologyDescription) markPossiblePrimary(addr string) {
	if addr == "" {
		return
	}
	if i, ok := td.index(addr); ok && td.Servers[i].Type == Unknown {
		td.Servers[i].Type = PossiblePrimary
	}
}

func (td *TopologyDescription) hasPrimary() bool {
	for _, s := range td.Servers {
		if s.Type == RSPrimary {
			return true
		}
	}
	return false
}

// checkIfHasPrimary sets the replica set type from the presence of an
// RSPrimary.
func (td *TopologyDescription) checkIfHasPrimary() {
	if td.hasPrimary() {
		td.Type = ReplicaSetWithPrimary
	} else {
		td.Type = ReplicaSetNoPrimary
	}
}
