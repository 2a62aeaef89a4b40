// Reconfigurations of the ReplicaSet fixture that change its membership:
// RemoveMember takes a member out of the configuration, as a
// replSetReconfig without it does.

package fakemongo

import (
	"fmt"
	"slices"
)

// RemoveMember removes member i from the set's configuration, as a
// replSetReconfig without it does: setVersion rises, no hello lists it any
// more, and every member's topologyVersion is bumped. The member keeps
// running in the REMOVED state (StateRemoved): its hello has no setName
// and no hosts, only isreplicaset: true (an RSGhost to SDAM), it refuses
// reads and writes, and it cannot be elected. The primary cannot be
// removed (step it down first), nor a member twice. It returns the new
// setVersion.
func (rs *ReplicaSet) RemoveMember(i int) (int32, error) {
	rs.scriptMu.Lock()
	defer rs.scriptMu.Unlock()
	if err := rs.checkIndex(i); err != nil {
		return 0, err
	}
	rs.mu.Lock()
	m := rs.members[i]
	switch {
	case m.removed:
		rs.mu.Unlock()
		return 0, fmt.Errorf("%w: member %d is already removed", ErrReplicaSetState, i)
	case rs.primary == i:
		rs.mu.Unlock()
		return 0, fmt.Errorf("%w: member %d is primary", ErrReplicaSetState, i)
	}
	m.removed = true
	// New slices: views taken before keep the old configuration.
	rs.hosts = slices.DeleteFunc(slices.Clone(rs.hosts), func(h string) bool { return h == m.addr })
	rs.arbiters = slices.DeleteFunc(slices.Clone(rs.arbiters), func(h string) bool { return h == m.addr })
	rs.setVersion++
	v := rs.setVersion
	rs.mu.Unlock()
	rs.bumpAll()
	return v, nil
}
