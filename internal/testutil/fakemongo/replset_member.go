// What a replica-set member's state means on the wire: the replica-set
// fields of its hello, and which commands it refuses, with the errors and
// labels mongod 4.4+ sends so drivers retry and rediscover as they would
// against a real set.

package fakemongo

import (
	"time"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Error codes of replica-set state changes.
const (
	codeNotWritablePrimary              = 10107
	codeInterruptedDueToReplStateChange = 11602
	codeNotPrimaryNoSecondaryOk         = 13435
	codeNotPrimaryOrSecondary           = 13436
)

// ServedByField is the field a replica-set member adds to its find replies,
// holding its own address, so a test (through command monitoring, or a
// proxy test reading the raw reply) knows which member served a read.
// Drivers ignore unknown top-level reply fields. hello says the same in
// "me".
const ServedByField = "fakemongoServedBy"

// cmdClass is how a member's state affects a command.
type cmdClass int

const (
	// classAny runs in any state (hello, ping, getMore, ...).
	classAny cmdClass = iota
	// classRead needs a primary, or a secondary and secondaryOk.
	classRead
	// classWrite needs the primary: writes and anything in a transaction.
	classWrite
)

// writeCommands and readCommands classify commands by name, as mongod's
// secondaryAllowed does (kNever for writes, kOptIn for these reads).
var (
	writeCommands = map[string]bool{
		"insert": true, "update": true, "delete": true, "findAndModify": true, "findandmodify": true,
		"create": true, "drop": true, "dropDatabase": true, "createIndexes": true, "dropIndexes": true,
		"renameCollection": true, "collMod": true, "commitTransaction": true, "abortTransaction": true,
	}
	readCommands = map[string]bool{
		"find": true, "aggregate": true, "count": true, "distinct": true, "listCollections": true,
		"listIndexes": true, "dbStats": true, "collStats": true, "explain": true,
	}
)

// classify returns the class of req.
func classify(req *Request) cmdClass {
	if writeCommands[req.Command] || inTransaction(req) {
		return classWrite
	}
	if readCommands[req.Command] {
		return classRead
	}
	return classAny
}

// inTransaction reports whether req is part of a multi-document
// transaction (autocommit: false).
func inTransaction(req *Request) bool {
	ac, ok := req.Lookup("autocommit").BooleanOK()
	return ok && !ac
}

// secondaryOk reports whether a read may run on a secondary: an OP_MSG
// $readPreference whose mode is not primary. (OP_QUERY would carry the
// secondaryOk flag instead, but the fake accepts only hello over OP_QUERY.)
func secondaryOk(req *Request) bool {
	mode, ok := req.Lookup("$readPreference", "mode").StringValueOK()
	return ok && mode != "primary"
}

// admitAction is what admit decided.
type admitAction int

const (
	admitRun    admitAction = iota // run the command
	admitRefuse                    // answer with the returned error reply
	admitHangUp                    // close the connection without a reply
)

// admit checks req against the member's state. A write the primary admits
// moves lastWrite.
func (m *Member) admit(req *Request, class cmdClass) (Reply, admitAction) {
	if class == classAny {
		return Reply{}, admitRun
	}
	rs := m.rs
	rs.mu.Lock()
	state := m.stateLocked()
	if state == StatePrimary && class == classWrite {
		rs.noteWriteLocked()
	}
	rs.mu.Unlock()
	switch {
	case state == StatePrimary:
		return Reply{}, admitRun
	case state == StateDown:
		// Killed, its connections not yet all closed: a dead process
		// answers nothing.
		return Reply{}, admitHangUp
	case class == classWrite:
		// An unacknowledged write has nowhere to put the error: mongod
		// hangs up so the client notices.
		if req.MoreToCome() {
			return Reply{}, admitHangUp
		}
		return Error(codeNotWritablePrimary, "", "not primary", stateChangeLabels(req)...), admitRefuse
	case state == StateArbiter || state == StateRemoved:
		return Error(codeNotPrimaryOrSecondary, "", "node is not in primary or recovering state"), admitRefuse
	case secondaryOk(req):
		return Reply{}, admitRun
	}
	return Error(codeNotPrimaryNoSecondaryOk, "", "not primary and secondaryOk=false"), admitRefuse
}

// withTopologyVersion adds the server's topologyVersion to r's error
// document, as mongod 4.4+ does on its NotPrimaryError and ShutdownError
// replies, so that a client can tell an error that predates what its
// monitor last heard (SDAM ignores it) from news.
func (s *Server) withTopologyVersion(r Reply) Reply {
	if !s.opts.TopologyVersion || len(r.Docs) != 1 || len(r.Docs[0]) < 5 {
		return r
	}
	d := r.Docs[0]
	out := append([]byte(nil), d[:len(d)-1]...) // without the final NUL
	tidx, out := bsoncore.AppendDocumentElementStart(out, "topologyVersion")
	out = bsoncore.AppendObjectIDElement(out, "processId", s.processID)
	out = bsoncore.AppendInt64Element(out, "counter", s.topologyVersion())
	out = endDoc(out, tidx)
	out = endDoc(out, 0)
	return Reply{Docs: []bsoncore.Document{out}}
}

// interruptedReply is the answer to a write a stepdown killed.
func interruptedReply(req *Request) Reply {
	return Error(codeInterruptedDueToReplStateChange, "", "operation was interrupted because the node stepped down",
		stateChangeLabels(req)...)
}

// stateChangeLabels returns the labels a 4.4+ server puts on a state-change
// error: TransientTransactionError inside a transaction, RetryableWriteError
// on commit / abort and on retryable writes (a txnNumber outside a
// transaction). Drivers at wire version 9+ retry writes only on the label.
func stateChangeLabels(req *Request) []string {
	switch {
	case req.Command == "commitTransaction" || req.Command == "abortTransaction":
		return []string{"RetryableWriteError"}
	case inTransaction(req):
		return []string{"TransientTransactionError"}
	}
	if _, ok := req.TxnNumber(); ok && writeCommands[req.Command] {
		return []string{"RetryableWriteError"}
	}
	return nil
}

// noteWriteLocked moves lastWrite to now. Called with rs.mu held.
func (rs *ReplicaSet) noteWriteLocked() {
	now := time.Now()
	if now.Unix() == rs.lastWrite.Unix() {
		rs.opInc++
	} else {
		rs.opInc = 1
	}
	rs.lastWrite = now
}

// stamp adds ServedByField to a successful reply's first document.
func (m *Member) stamp(r Reply) Reply {
	if len(r.Docs) == 0 {
		return r
	}
	if ok, _ := r.Docs[0].Lookup("ok").AsFloat64OK(); ok != 1 {
		return r
	}
	d := r.Docs[0]
	out := make([]byte, 0, len(d)+len(ServedByField)+len(m.addr)+8)
	out = append(out, d[:len(d)-1]...)
	out = bsoncore.AppendStringElement(out, ServedByField, m.addr)
	out = append(out, 0)
	out = bsoncore.UpdateLength(out, 0, int32(len(out)))
	docs := make([]bsoncore.Document, len(r.Docs))
	copy(docs, r.Docs)
	docs[0] = out
	r.Docs = docs
	return r
}

// memberView is a consistent snapshot of what a member's hello says.
type memberView struct {
	state           MemberState
	setName         string
	hosts, arbiters []string
	primary         string
	me              string
	hidden          bool
	tags            []byte
	setVersion      int32
	term            int64
	lastWrite       time.Time
	opTerm          int64 // term of lastWrite.opTime
	opInc           uint32
}

// view snapshots the member's hello state.
func (m *Member) view() *memberView {
	rs := m.rs
	rs.mu.Lock()
	defer rs.mu.Unlock()
	v := &memberView{
		state:      m.stateLocked(),
		setName:    rs.name,
		hosts:      rs.hosts,
		arbiters:   rs.arbiters,
		me:         m.addr,
		hidden:     m.hidden,
		tags:       m.tags,
		setVersion: rs.setVersion,
		term:       rs.term,
		lastWrite:  rs.lastWrite,
		opInc:      rs.opInc,
		opTerm:     rs.term,
	}
	if rs.primary >= 0 {
		v.primary = rs.members[rs.primary].addr
	}
	if p := m.paused; p != nil {
		v.lastWrite, v.opInc, v.opTerm = p.write, p.inc, p.term
	}
	return v
}

// appendHello appends the replica-set fields of a member's hello.
func (v *memberView) appendHello(dst []byte) []byte {
	if v.state == StateRemoved {
		// What mongod answers without a valid configuration: no set name
		// and no hosts, only isreplicaset (SDAM: an RSGhost).
		dst = bsoncore.AppendBooleanElement(dst, "secondary", false)
		dst = bsoncore.AppendBooleanElement(dst, "isreplicaset", true)
		return bsoncore.AppendStringElement(dst, "info", "Does not have a valid replica set config")
	}
	dst = appendStrings(dst, "hosts", v.hosts)
	if len(v.arbiters) > 0 {
		dst = appendStrings(dst, "arbiters", v.arbiters)
	}
	dst = bsoncore.AppendStringElement(dst, "setName", v.setName)
	dst = bsoncore.AppendInt32Element(dst, "setVersion", v.setVersion)
	dst = bsoncore.AppendBooleanElement(dst, "secondary", v.state == StateSecondary)
	if v.state == StateArbiter {
		dst = bsoncore.AppendBooleanElement(dst, "arbiterOnly", true)
	}
	if v.hidden {
		dst = bsoncore.AppendBooleanElement(dst, "hidden", true)
	}
	if v.primary != "" {
		dst = bsoncore.AppendStringElement(dst, "primary", v.primary)
	}
	dst = bsoncore.AppendStringElement(dst, "me", v.me)
	if v.state == StatePrimary {
		dst = bsoncore.AppendObjectIDElement(dst, "electionId", electionID(v.term))
	}
	if len(v.tags) > 0 {
		dst = bsoncore.AppendDocumentElement(dst, "tags", v.tags)
	}
	if v.state != StateArbiter {
		ts := uint32(v.lastWrite.Unix())
		ms := v.lastWrite.UnixMilli()
		var lidx, oidx int32
		lidx, dst = bsoncore.AppendDocumentElementStart(dst, "lastWrite")
		for _, key := range [...]string{"opTime", "majorityOpTime"} {
			oidx, dst = bsoncore.AppendDocumentElementStart(dst, key)
			dst = bsoncore.AppendTimestampElement(dst, "ts", ts, v.opInc)
			dst = bsoncore.AppendInt64Element(dst, "t", v.opTerm)
			dst = endDoc(dst, oidx)
		}
		dst = bsoncore.AppendDateTimeElement(dst, "lastWriteDate", ms)
		dst = bsoncore.AppendDateTimeElement(dst, "majorityWriteDate", ms)
		dst = endDoc(dst, lidx)
	}
	return dst
}

// appendStrings appends an array of strings.
func appendStrings(dst []byte, key string, vals []string) []byte {
	idx, dst := bsoncore.AppendArrayElementStart(dst, key)
	for i, s := range vals {
		dst = bsoncore.AppendStringElement(dst, arrayKey(i), s)
	}
	return endDoc(dst, idx)
}
