// Replication lag on demand: the members share one store, and a paused
// member serves reads and reports lastWrite as of the moment replication
// to it stopped, so tests can see stale secondaries (read-your-writes
// failures, lastWriteDate gaps for maxStalenessSeconds) without the fake
// ever losing an acknowledged write.

package fakemongo

import (
	"fmt"
	"time"
)

// replicationPause is where a paused member stopped applying writes.
type replicationPause struct {
	seq   uint64    // the last write it applied
	write time.Time // lastWrite as it was then
	inc   uint32
	term  int64
}

// PauseReplication stops replication to secondary i: its finds see only
// the writes done before the call and its hello keeps the lastWrite of that
// moment, until ResumeReplication. Electing the member, or reviving it,
// first catches it up (a member must hold every acknowledged write to win
// an election in the fake, which never rolls back). Only a live, non-primary,
// data-bearing member can be paused. The pause hides new documents
// (inserts, upserts, committed transactions) only: updates and deletes of
// existing documents show at once.
func (rs *ReplicaSet) PauseReplication(i int) error {
	rs.scriptMu.Lock()
	defer rs.scriptMu.Unlock()
	if err := rs.checkIndex(i); err != nil {
		return err
	}
	seq := rs.store.lastSeq()
	rs.mu.Lock()
	defer rs.mu.Unlock()
	m := rs.members[i]
	if st := m.stateLocked(); st != StateSecondary {
		return fmt.Errorf("%w: member %d is %v, not a secondary", ErrReplicaSetState, i, st)
	}
	if m.paused == nil {
		m.paused = &replicationPause{seq: seq, write: rs.lastWrite, inc: rs.opInc, term: rs.term}
	}
	return nil
}

// ResumeReplication lets member i catch up at once: it sees every write
// again and reports the set's lastWrite. Resuming a member that is not
// paused does nothing.
func (rs *ReplicaSet) ResumeReplication(i int) error {
	if err := rs.checkIndex(i); err != nil {
		return err
	}
	rs.mu.Lock()
	rs.members[i].paused = nil
	rs.mu.Unlock()
	return nil
}

// horizon returns the latest write the member's reads may see.
func (m *Member) horizon() uint64 {
	m.rs.mu.Lock()
	defer m.rs.mu.Unlock()
	if m.paused == nil {
		return allWrites
	}
	return m.paused.seq
}
