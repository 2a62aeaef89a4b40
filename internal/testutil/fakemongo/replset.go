// The ReplicaSet fixture: N fake members on loopback that answer hello as
// one replica set whose primary, term and configuration a test scripts
// (StepDown, Elect, Reconfig, Kill, Revive, Failover; RemoveMember in
// replset_reconfig.go). The members share one in-memory store, so
// replication is instantaneous: a write a primary acknowledged is readable
// from every member and survives any failover. What a member refuses in
// each state is in replset_member.go.

package fakemongo

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// DefaultReplicaSetWireVersion is the maxWireVersion replica-set members
// report unless ReplicaSetOptions.Base says otherwise (MongoDB 7.0).
const DefaultReplicaSetWireVersion = 21

// DefaultElectionDelay is how long Failover leaves the set without a
// primary: a real election takes one to two seconds, scaled down for tests.
const DefaultElectionDelay = 100 * time.Millisecond

// maxElectionDelay bounds ReplicaSetOptions.ElectionDelay.
const maxElectionDelay = 30 * time.Second

// ErrReplicaSetState is returned (wrapped) by a scripting call the set's
// state does not allow: stepping down a member that is not primary,
// electing a dead, hidden or arbiter member, reviving a live one.
var ErrReplicaSetState = errors.New("fakemongo: replica set state does not allow this")

// ErrReplicaSetClosed is returned (wrapped) by Failover when the fixture
// closes during its election delay.
var ErrReplicaSetClosed = errors.New("fakemongo: replica set closed")

// MemberState is what a member currently is.
type MemberState int

const (
	// StateSecondary is a data-bearing member that is not primary.
	StateSecondary MemberState = iota
	// StatePrimary accepts writes.
	StatePrimary
	// StateArbiter votes and holds no data.
	StateArbiter
	// StateDown is a killed member: its port refuses connections.
	StateDown
	// StateRemoved is a member RemoveMember took out of the configuration:
	// it runs, but belongs to no set (REMOVED in rs.status()).
	StateRemoved
)

// String returns the state's name as rs.status() spells it.
func (s MemberState) String() string {
	switch s {
	case StateSecondary:
		return "SECONDARY"
	case StatePrimary:
		return "PRIMARY"
	case StateArbiter:
		return "ARBITER"
	case StateDown:
		return "DOWN"
	case StateRemoved:
		return "REMOVED"
	}
	return fmt.Sprintf("MemberState(%d)", int(s))
}

// ReplicaSetOptions shape a ReplicaSet. The zero value is a three-member
// set "rs0" whose member 0 is primary.
type ReplicaSetOptions struct {
	// Name is the setName; "rs0" when empty.
	Name string
	// Members is the number of members; 3 when 0.
	Members int
	// Arbiters and Hidden list member indexes that are arbiters (listed
	// in hello's arbiters, never data-bearing) or hidden (priority 0,
	// missing from every hello's hosts, hidden: true in their own).
	// Neither can be elected.
	Arbiters []int
	Hidden   []int
	// Tags are the replica-set tags of members, by index, reported in
	// their hello for tag-set read preferences.
	Tags map[int]map[string]string
	// MaxWireVersions are the maxWireVersion of members, by index, in
	// place of Base's: a set in the middle of a rolling upgrade.
	MaxWireVersions map[int]int32
	// InitialPrimary is the member that starts as primary (term 1);
	// NoInitialPrimary starts the set without one (term 0).
	InitialPrimary   int
	NoInitialPrimary bool
	// ElectionDelay is how long Failover waits between stepping the
	// primary down and electing another; DefaultElectionDelay when 0,
	// at most 30s.
	ElectionDelay time.Duration
	// Base is the template of every member's Options (compressors, size
	// limits, logger, ...). The fixture sets Kind, SetName, Hosts,
	// Primary, Secondary, TopologyVersion and InMemory itself, and
	// MaxWireVersion to MaxWireVersions[i] if set, else to
	// DefaultReplicaSetWireVersion when 0.
	Base Options
}

// ReplicaSet is a running scripted replica set. Its methods are safe for
// concurrent use; scripting calls are serialized.
type ReplicaSet struct {
	name    string
	opts    ReplicaSetOptions
	store   *store
	members []*Member
	// hosts and arbiters are what every hello lists. Guarded by mu; a
	// reconfiguration replaces them, never modifies them in place, so a
	// memberView may keep the slices.
	hosts, arbiters []string

	closed    chan struct{}
	closeOnce sync.Once

	// scriptMu serializes the scripting calls, so that each one sees the
	// state the previous one left.
	scriptMu sync.Mutex

	mu sync.Mutex
	// primary is the index of the primary, -1 when there is none. Guarded
	// by mu, as are the fields below and every Member's srv, lives, down.
	primary    int
	term       int64
	setVersion int32
	// lastWrite is when the primary last admitted a write; opInc orders
	// writes within a second for lastWrite.opTime.ts.
	lastWrite time.Time
	opInc     uint32
}

// Member is one member of a ReplicaSet across its lives: Kill ends a life
// (a Server) and Revive starts a new one on the same address.
type Member struct {
	rs      *ReplicaSet
	idx     int
	addr    string
	arbiter bool
	hidden  bool
	tags    []byte // the tags document's bytes; nil without tags

	// Guarded by rs.mu.
	srv   *Server
	lives []*Server
	down  bool
	// paused is set while replication to the member is paused.
	paused *replicationPause
	// removed is set once RemoveMember took the member out of the set.
	removed bool
}

// StartReplicaSet starts the members on 127.0.0.1 and closes them when the
// test ends. It fails the test if a member cannot listen or the options are
// inconsistent.
func StartReplicaSet(t testing.TB, o ReplicaSetOptions) *ReplicaSet {
	t.Helper()
	rs, err := NewReplicaSet(o)
	if err != nil {
		t.Fatalf("fakemongo: %v", err)
	}
	t.Cleanup(rs.Close)
	return rs
}

// NewReplicaSet starts a replica set on 127.0.0.1 (for tools; tests use
// StartReplicaSet). The caller must Close it.
func NewReplicaSet(o ReplicaSetOptions) (*ReplicaSet, error) {
	if o.Name == "" {
		o.Name = "rs0"
	}
	if o.Members == 0 {
		o.Members = 3
	}
	if o.ElectionDelay == 0 {
		o.ElectionDelay = DefaultElectionDelay
	}
	if o.Members < 1 || o.Members > 50 {
		return nil, fmt.Errorf("fakemongo: a replica set has 1 to 50 members, not %d", o.Members)
	}
	if o.ElectionDelay < 0 || o.ElectionDelay > maxElectionDelay {
		return nil, fmt.Errorf("fakemongo: ElectionDelay %v out of range", o.ElectionDelay)
	}
	for _, i := range slices.Concat(o.Arbiters, o.Hidden, slices.Collect(maps.Keys(o.MaxWireVersions))) {
		if i < 0 || i >= o.Members {
			return nil, fmt.Errorf("fakemongo: member index %d out of range", i)
		}
	}
	rs := &ReplicaSet{
		name:       o.Name,
		opts:       o,
		store:      newStore(),
		closed:     make(chan struct{}),
		primary:    -1,
		setVersion: 1,
		lastWrite:  time.Now(),
	}
	if !o.NoInitialPrimary {
		p := o.InitialPrimary
		if p < 0 || p >= o.Members || slices.Contains(o.Arbiters, p) || slices.Contains(o.Hidden, p) {
			return nil, fmt.Errorf("fakemongo: member %d cannot be the initial primary", p)
		}
		rs.primary, rs.term = p, 1
	}
	for i := range o.Members {
		m := &Member{rs: rs, idx: i, arbiter: slices.Contains(o.Arbiters, i), hidden: slices.Contains(o.Hidden, i)}
		if tags := o.Tags[i]; len(tags) > 0 {
			keys := make([]string, 0, len(tags))
			for k := range tags {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			d := make(bson.D, len(keys))
			for j, k := range keys {
				d[j] = bson.E{Key: k, Value: tags[k]}
			}
			b, err := bson.Marshal(d)
			if err != nil {
				return nil, fmt.Errorf("fakemongo: tags of member %d: %w", i, err)
			}
			m.tags = b
		}
		srv, err := listen("127.0.0.1:0", rs.memberOptions(i), m, rs.store)
		if err != nil {
			rs.Close()
			return nil, err
		}
		rs.mu.Lock()
		m.addr, m.srv, m.lives = srv.Addr(), srv, []*Server{srv}
		rs.members = append(rs.members, m)
		rs.mu.Unlock()
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for _, m := range rs.members {
		switch {
		case m.arbiter:
			rs.arbiters = append(rs.arbiters, m.addr)
		case !m.hidden:
			rs.hosts = append(rs.hosts, m.addr)
		}
	}
	return rs, nil
}

// memberOptions returns the Options every life of member i starts with.
func (rs *ReplicaSet) memberOptions(i int) Options {
	o := rs.opts.Base
	o.Kind = ReplicaSetMember
	o.SetName = rs.name
	o.Hosts, o.Primary, o.Secondary = nil, "", false
	o.TopologyVersion = true
	o.InMemory = true
	if v, ok := rs.opts.MaxWireVersions[i]; ok {
		o.MaxWireVersion = v
	}
	if o.MaxWireVersion == 0 {
		o.MaxWireVersion = DefaultReplicaSetWireVersion
	}
	return o
}

// Close kills every member and waits for all their goroutines. It is
// idempotent; a Failover waiting for its election returns.
func (rs *ReplicaSet) Close() {
	rs.closeOnce.Do(func() { close(rs.closed) })
	rs.mu.Lock()
	var lives []*Server
	for _, m := range rs.members {
		lives = append(lives, m.lives...)
		m.down = true
	}
	rs.mu.Unlock()
	for _, s := range lives {
		s.Close()
	}
}

// Name returns the setName.
func (rs *ReplicaSet) Name() string { return rs.name }

// Members returns the members in index order.
func (rs *ReplicaSet) Members() []*Member { return slices.Clone(rs.members) }

// Member returns member i; it panics if i is out of range, a bug in the
// test.
func (rs *ReplicaSet) Member(i int) *Member { return rs.members[i] }

// Primary returns the primary, or nil while there is none.
func (rs *ReplicaSet) Primary() *Member {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.primary < 0 {
		return nil
	}
	return rs.members[rs.primary]
}

// Term returns the election term (0 before the first election).
func (rs *ReplicaSet) Term() int64 {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.term
}

// ElectionID returns the electionId the current term's primary reports.
func (rs *ReplicaSet) ElectionID() bson.ObjectID { return electionID(rs.Term()) }

// SetVersion returns the configuration version hello reports.
func (rs *ReplicaSet) SetVersion() int32 {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.setVersion
}

// Hosts returns the addresses hello lists in hosts: the members that are
// neither hidden nor arbiters.
func (rs *ReplicaSet) Hosts() []string {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return slices.Clone(rs.hosts)
}

// URI returns a connection string seeding every host with replicaSet.
func (rs *ReplicaSet) URI() string {
	return "mongodb://" + strings.Join(rs.Hosts(), ",") + "/?replicaSet=" + rs.name
}

// SeedURI returns a connection string seeding only member i, with
// replicaSet: a driver must discover the other members from its hello.
func (rs *ReplicaSet) SeedURI(i int) string {
	return "mongodb://" + rs.members[i].addr + "/?replicaSet=" + rs.name
}

// Collection returns copies of the committed documents of db.coll, which
// every member serves.
func (rs *ReplicaSet) Collection(db, coll string) []bson.Raw {
	return rs.members[0].Server().Collection(db, coll)
}

// Transactions returns the transactions the set has seen (see
// Server.Transactions); a stepdown aborts those in progress ("stepDown").
func (rs *ReplicaSet) Transactions() []Txn { return rs.members[0].Server().Transactions() }

// StepDown makes primary i a secondary. The set has no primary until Elect.
// Writes in flight on i are interrupted (see the package doc), its
// transactions in progress are aborted, and every member's
// topologyVersion is bumped so awaitable hellos answer at once.
func (rs *ReplicaSet) StepDown(i int) error {
	rs.scriptMu.Lock()
	defer rs.scriptMu.Unlock()
	if err := rs.checkIndex(i); err != nil {
		return err
	}
	rs.mu.Lock()
	if rs.primary != i {
		rs.mu.Unlock()
		return fmt.Errorf("%w: member %d is not primary", ErrReplicaSetState, i)
	}
	rs.setPrimaryLocked(-1)
	old := rs.members[i].srv
	rs.mu.Unlock()
	rs.demoted(old)
	rs.bumpAll()
	return nil
}

// Elect makes member i primary in a new term: electionId rises, the
// previous primary (if another member) steps down as in StepDown, and
// every member's topologyVersion is bumped. Dead, hidden, arbiter and
// removed members cannot be elected. setVersion does not change: on a real replica
// set it is the configuration's version, raised by a reconfig (Reconfig),
// while an election only starts a new term, which electionId carries; SDAM
// compares the pair, so a stale primary is told apart by electionId alone.
func (rs *ReplicaSet) Elect(i int) error {
	rs.scriptMu.Lock()
	defer rs.scriptMu.Unlock()
	return rs.electLocked(i)
}

// electLocked elects i; the caller holds scriptMu.
func (rs *ReplicaSet) electLocked(i int) error {
	if err := rs.checkIndex(i); err != nil {
		return err
	}
	m := rs.members[i]
	if m.arbiter || m.hidden {
		return fmt.Errorf("%w: member %d is an arbiter or hidden", ErrReplicaSetState, i)
	}
	rs.mu.Lock()
	if m.down || m.removed {
		rs.mu.Unlock()
		return fmt.Errorf("%w: member %d is %v", ErrReplicaSetState, i, m.stateLocked())
	}
	var old *Server
	if p := rs.primary; p >= 0 && p != i {
		old = rs.members[p].srv
	}
	rs.setPrimaryLocked(i)
	rs.term++
	m.paused = nil // caught up before winning
	rs.mu.Unlock()
	if old != nil {
		rs.demoted(old)
	}
	rs.bumpAll()
	return nil
}

// Reconfig raises setVersion, as a replSetReconfig does, bumps every
// member's topologyVersion and returns the new version.
func (rs *ReplicaSet) Reconfig() int32 {
	rs.scriptMu.Lock()
	defer rs.scriptMu.Unlock()
	rs.mu.Lock()
	rs.setVersion++
	v := rs.setVersion
	rs.mu.Unlock()
	rs.bumpAll()
	return v
}

// Kill kills member i's process: its listener and every connection close
// without a reply and new connections are refused (a handler's Reply.Kill
// on the member's server has the same effect). A killed primary leaves
// the set without a primary (as once the election timeout has passed) and
// its transactions in progress are aborted; the others' hellos change.
func (rs *ReplicaSet) Kill(i int) error {
	rs.scriptMu.Lock()
	defer rs.scriptMu.Unlock()
	if err := rs.checkIndex(i); err != nil {
		return err
	}
	m := rs.members[i]
	rs.mu.Lock()
	down, srv := m.down, m.srv
	rs.mu.Unlock()
	if down {
		return fmt.Errorf("%w: member %d is already down", ErrReplicaSetState, i)
	}
	srv.Kill() // lifeEnded does the rest
	return nil
}

// lifeEnded records that a member's server died, whether by Kill or by a
// handler's Reply.Kill: the member is down, and if it was primary the set
// has none and its transactions in progress are aborted.
func (rs *ReplicaSet) lifeEnded(s *Server) {
	m := s.member
	rs.mu.Lock()
	if m.srv != s || m.down {
		rs.mu.Unlock()
		return
	}
	m.down = true
	wasPrimary := rs.primary == m.idx
	if wasPrimary {
		rs.setPrimaryLocked(-1)
	}
	rs.mu.Unlock()
	if wasPrimary {
		rs.store.abortAll("killed")
	}
	rs.bumpAll()
}

// Revive restarts killed member i on the same address as a secondary (or
// arbiter) with a new processId, topologyVersion counter 0, no handlers,
// no fail point and fresh request counters (Member.Requests sums every
// life). The store, and so the data, is the set's.
func (rs *ReplicaSet) Revive(i int) error {
	rs.scriptMu.Lock()
	defer rs.scriptMu.Unlock()
	if err := rs.checkIndex(i); err != nil {
		return err
	}
	m := rs.members[i]
	rs.mu.Lock()
	down := m.down
	rs.mu.Unlock()
	if !down {
		return fmt.Errorf("%w: member %d is not down", ErrReplicaSetState, i)
	}
	select {
	case <-rs.closed:
		return ErrReplicaSetClosed
	default:
	}
	// The old listener is closed, but the port may take a moment to be
	// free again: retry a bounded number of times.
	var srv *Server
	var err error
	for range 40 {
		if srv, err = listen(m.addr, rs.memberOptions(i), m, rs.store); err == nil {
			break
		}
		time.Sleep(25 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("fakemongo: revive member %d: %w", i, err)
	}
	rs.mu.Lock()
	select {
	case <-rs.closed:
		// Close has collected the lives already: this one is ours to end.
		rs.mu.Unlock()
		srv.Close()
		return ErrReplicaSetClosed
	default:
	}
	m.srv, m.down, m.paused = srv, false, nil
	m.lives = append(m.lives, srv)
	rs.mu.Unlock()
	rs.bumpAll()
	return nil
}

// Failover steps the primary down, waits ElectionDelay with no primary,
// then elects the next electable live member after the old primary (by
// index, wrapping; the old primary only when no other can be) and returns
// its index. If a primary was elected meanwhile by another call, Failover
// returns that one. It blocks for the delay: run it in a goroutine to
// overlap it with traffic.
func (rs *ReplicaSet) Failover() (int, error) {
	rs.scriptMu.Lock()
	rs.mu.Lock()
	old := rs.primary
	var srv *Server
	if old >= 0 {
		srv = rs.members[old].srv
		rs.setPrimaryLocked(-1)
	}
	rs.mu.Unlock()
	if old < 0 {
		rs.scriptMu.Unlock()
		return -1, fmt.Errorf("%w: no primary to fail over from", ErrReplicaSetState)
	}
	rs.demoted(srv)
	rs.bumpAll()
	rs.scriptMu.Unlock()

	t := time.NewTimer(rs.opts.ElectionDelay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-rs.closed:
		return -1, ErrReplicaSetClosed
	}

	rs.scriptMu.Lock()
	defer rs.scriptMu.Unlock()
	rs.mu.Lock()
	p := rs.primary
	cand := -1
	for k := 1; k <= len(rs.members) && p < 0; k++ {
		j := (old + k) % len(rs.members)
		if m := rs.members[j]; !m.down && !m.arbiter && !m.hidden && !m.removed {
			cand = j
			break
		}
	}
	rs.mu.Unlock()
	if p >= 0 {
		return p, nil
	}
	if cand < 0 {
		return -1, fmt.Errorf("%w: no electable member is up", ErrReplicaSetState)
	}
	return cand, rs.electLocked(cand)
}

// demoted does what losing the primary role does to a server's work: its
// writes in flight are interrupted and the set's transactions in progress
// (they only run on the primary) are aborted.
func (rs *ReplicaSet) demoted(srv *Server) {
	rs.store.abortAll("stepDown")
	srv.mu.Lock()
	defer srv.mu.Unlock()
	for c := range srv.conns {
		c.interruptWrite()
	}
}

// setPrimaryLocked makes member i (or none, -1) the primary; the caller
// holds rs.mu. A primary that loses the role has its topologyVersion
// counter raised in the same step, as mongod does within a stepdown: its
// "not primary" replies then carry a version newer than any hello that
// said primary, or SDAM would rightly discard them as stale (and a driver
// would retry on the old primary). bumpAll, after the change, wakes the
// awaitable hellos.
func (rs *ReplicaSet) setPrimaryLocked(i int) {
	if p := rs.primary; p >= 0 && p != i {
		rs.members[p].srv.topoCounter.Add(1)
	}
	rs.primary = i
}

// bumpAll bumps the topologyVersion of every live member, waking their
// awaitable hellos: each member's hello (its primary field at least)
// changed.
func (rs *ReplicaSet) bumpAll() {
	rs.mu.Lock()
	var live []*Server
	for _, m := range rs.members {
		if !m.down {
			live = append(live, m.srv)
		}
	}
	rs.mu.Unlock()
	for _, s := range live {
		s.BumpTopologyVersion()
	}
}

func (rs *ReplicaSet) checkIndex(i int) error {
	if i < 0 || i >= len(rs.members) {
		return fmt.Errorf("%w: no member %d", ErrReplicaSetState, i)
	}
	return nil
}

// electionID is the electionId of a term, built as mongod does: 0x7fffffff
// then the term, big-endian, so it grows with the term.
func electionID(term int64) bson.ObjectID {
	var id bson.ObjectID
	binary.BigEndian.PutUint32(id[:4], 0x7fffffff)
	binary.BigEndian.PutUint64(id[4:], uint64(term))
	return id
}

// Index returns the member's index in the set.
func (m *Member) Index() int { return m.idx }

// Addr returns the member's host:port, the same in every life.
func (m *Member) Addr() string { return m.addr }

// State returns what the member is now.
func (m *Member) State() MemberState {
	m.rs.mu.Lock()
	defer m.rs.mu.Unlock()
	return m.stateLocked()
}

// stateLocked is State with rs.mu held.
func (m *Member) stateLocked() MemberState {
	switch {
	case m.down:
		return StateDown
	case m.removed:
		return StateRemoved
	case m.arbiter:
		return StateArbiter
	case m.rs.primary == m.idx:
		return StatePrimary
	}
	return StateSecondary
}

// Server returns the member's current life (the killed one while down):
// for handlers, fail points, Conns and per-life counters. Handlers and
// fail points do not survive Revive.
func (m *Member) Server() *Server {
	m.rs.mu.Lock()
	defer m.rs.mu.Unlock()
	return m.srv
}

// livesSnapshot returns every life of the member.
func (m *Member) livesSnapshot() []*Server {
	m.rs.mu.Lock()
	defer m.rs.mu.Unlock()
	return slices.Clone(m.lives)
}

// Requests returns how many requests named cmd the member received in all
// its lives.
func (m *Member) Requests(cmd string) int64 {
	var n int64
	for _, s := range m.livesSnapshot() {
		n += s.Requests(cmd)
	}
	return n
}

// RequestCounts returns the member's request counts by command name, summed
// over its lives.
func (m *Member) RequestCounts() map[string]int64 {
	out := map[string]int64{}
	for _, s := range m.livesSnapshot() {
		for k, v := range s.RequestCounts() {
			out[k] += v
		}
	}
	return out
}

// ResetCounters zeroes the request counts of every life of the member.
func (m *Member) ResetCounters() {
	for _, s := range m.livesSnapshot() {
		s.ResetCounters()
	}
}
