package fakemongo

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// defaultBatchSize is the first batch size a server uses when find has no
// batchSize.
const defaultBatchSize = 101

// TxnState is the state of a transaction in the in-memory engine.
type TxnState int

const (
	// TxnInProgress: started and neither committed nor aborted yet.
	TxnInProgress TxnState = iota
	// TxnCommitted: commitTransaction succeeded.
	TxnCommitted
	// TxnAborted: aborted by abortTransaction, endSessions, or a newer
	// transaction started on the same session.
	TxnAborted
)

// String returns the state's name.
func (t TxnState) String() string {
	switch t {
	case TxnInProgress:
		return "inProgress"
	case TxnCommitted:
		return "committed"
	case TxnAborted:
		return "aborted"
	}
	return fmt.Sprintf("TxnState(%d)", int(t))
}

// Txn is a snapshot of one transaction, identified by (LSID, TxnNumber).
type Txn struct {
	// LSID is the bytes of the session's lsid.id (a UUID).
	LSID []byte
	// TxnNumber numbers the transaction within its session.
	TxnNumber int64
	// State is where the transaction stands.
	State TxnState
	// AbortedBy names what aborted it: "abortTransaction", "endSessions",
	// "newerTransaction" or "killed" (the server was killed); "" otherwise.
	AbortedBy string
	// Commands are the commands that ran in the transaction, in order,
	// including commitTransaction / abortTransaction.
	Commands []string
	// ConnIDs is, for each entry of Commands, the connection that carried it.
	ConnIDs []int64
}

type txnKey struct {
	lsid string
	n    int64
}

type txnState struct {
	Txn
	// pending are inserts made inside the transaction, applied on commit.
	pending []pendingInsert
}

type pendingInsert struct {
	ns  string
	doc bsoncore.Document
}

type cursor struct {
	ns   string
	docs []bsoncore.Document
	// owner is the server that opened the cursor: replica-set members
	// share a store, but cursor ids stay per server (and per process life).
	owner *Server
}

// serverOf returns the server a request came in on, nil for a request
// built without a connection.
func serverOf(req *Request) *Server {
	if req.conn == nil {
		return nil
	}
	return req.conn.s
}

// ownedBy reports whether a getMore or killCursors on srv may use c.
func (c *cursor) ownedBy(srv *Server) bool {
	return c.owner == nil || srv == nil || c.owner == srv
}

// store is the optional in-memory engine (Options.InMemory).
type store struct {
	mu sync.Mutex
	// colls maps "db.coll" to its documents (owned copies), and seqs
	// gives, for each, the number of the write that added it (seq counts
	// every write), so a replica-set member whose replication is paused
	// sees only a prefix. Guarded by mu.
	colls map[string][]bsoncore.Document
	seqs  map[string][]uint64
	seq   uint64
	// cursors maps open cursor ids to what they still have to return.
	// Guarded by mu.
	cursors map[int64]*cursor
	// rng draws cursor ids. Guarded by mu.
	rng *rand.Rand
	// txns holds every transaction seen, order keeps them in creation
	// order, latest is the highest txnNumber started per lsid. Guarded by mu.
	txns   map[txnKey]*txnState
	order  []*txnState
	latest map[string]int64
	// retried maps the (lsid, txnNumber) of each retryable write done
	// (outside transactions) to its reply, so a retry after a lost reply
	// or a failover answers the first result instead of writing again,
	// as the session's transaction table does on a real server. Guarded
	// by mu.
	retried map[txnKey]bsoncore.Document
}

func newStore() *store {
	return &store{
		colls:   make(map[string][]bsoncore.Document),
		seqs:    make(map[string][]uint64),
		cursors: make(map[int64]*cursor),
		rng:     rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())),
		txns:    make(map[txnKey]*txnState),
		latest:  make(map[string]int64),
		retried: make(map[txnKey]bsoncore.Document),
	}
}

// dropCursorsOf forgets the cursors a server opened (it died).
func (st *store) dropCursorsOf(srv *Server) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for id, c := range st.cursors {
		if c.owner == srv {
			delete(st.cursors, id)
		}
	}
}

// newCursorID draws a positive id unused on this server. Ids are random so
// that two servers practically never share one: a getMore routed to the
// wrong server gets CursorNotFound, as with real servers. Called with mu held.
func (st *store) newCursorID() int64 {
	for {
		id := int64(st.rng.Uint64() >> 1)
		if _, used := st.cursors[id]; id != 0 && !used {
			return id
		}
	}
}

// Transactions returns a snapshot of every transaction the in-memory engine
// has seen, in the order they started. It is empty unless Options.InMemory.
func (s *Server) Transactions() []Txn {
	st := s.store
	if st == nil {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	out := make([]Txn, len(st.order))
	for i, t := range st.order {
		out[i] = t.Txn
		out[i].LSID = bytes.Clone(t.LSID)
		out[i].Commands = slices.Clone(t.Commands)
		out[i].ConnIDs = slices.Clone(t.ConnIDs)
	}
	return out
}

// OpenCursors returns the ids of the cursors open on this server.
func (s *Server) OpenCursors() []int64 {
	st := s.store
	if st == nil {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	ids := make([]int64, 0, len(st.cursors))
	for id := range st.cursors {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Collection returns copies of the committed documents of db.coll.
func (s *Server) Collection(db, coll string) []bson.Raw {
	st := s.store
	if st == nil {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	docs := st.colls[db+"."+coll]
	out := make([]bson.Raw, len(docs))
	for i, d := range docs {
		out[i] = bson.Raw(bytes.Clone(d))
	}
	return out
}

// txnInfo is what a command says about transactions.
type txnInfo struct {
	lsid      []byte
	n         int64
	inTxn     bool // autocommit: false
	start     bool // startTransaction: true
	hasNumber bool
}

func parseTxnInfo(body bsoncore.Document) txnInfo {
	var ti txnInfo
	ti.lsid, _ = lsidOf(body)
	ti.n, ti.hasNumber = body.Lookup("txnNumber").AsInt64OK()
	if ac, ok := body.Lookup("autocommit").BooleanOK(); ok && !ac {
		ti.inTxn = true
	}
	ti.start, _ = body.Lookup("startTransaction").BooleanOK()
	return ti
}

// trackTxn does the transaction bookkeeping for a command that is part of a
// transaction (autocommit: false). It returns an error reply when the
// command must not run, as a real server would refuse it.
func (st *store) trackTxn(req *Request, ti txnInfo) (Reply, bool) {
	if ti.lsid == nil || !ti.hasNumber {
		return Error(50768, "", "autocommit:false requires lsid and txnNumber"), false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	key := txnKey{lsid: string(ti.lsid), n: ti.n}
	t := st.txns[key]
	if ti.start {
		if latest, ok := st.latest[key.lsid]; ok && latest > ti.n {
			return Error(codeTransactionTooOld, "", fmt.Sprintf("txnNumber %d is older than %d", ti.n, latest)), false
		}
		if t != nil {
			return Error(codeConflictingOperationInProgress, "", fmt.Sprintf("transaction %d already started on this session", ti.n)), false
		}
		st.abortSessionLocked(key.lsid, "newerTransaction")
		t = &txnState{Txn: Txn{LSID: bytes.Clone(ti.lsid), TxnNumber: ti.n, State: TxnInProgress}}
		st.txns[key] = t
		st.order = append(st.order, t)
		st.latest[key.lsid] = ti.n
	} else if t == nil || t.State != TxnInProgress {
		return Error(codeNoSuchTransaction, "", fmt.Sprintf("transaction %d is not in progress", ti.n), "TransientTransactionError"), false
	}
	t.Commands = append(t.Commands, req.Command)
	t.ConnIDs = append(t.ConnIDs, req.ConnID)
	return Reply{}, true
}

// abortSessionLocked aborts the in-progress transactions of a session.
// Called with mu held.
func (st *store) abortSessionLocked(lsid, by string) {
	n, ok := st.latest[lsid]
	if !ok {
		return
	}
	if t := st.txns[txnKey{lsid, n}]; t != nil && t.State == TxnInProgress {
		t.State, t.AbortedBy, t.pending = TxnAborted, by, nil
	}
}

// abortAll aborts every in-progress transaction (the server was killed).
func (st *store) abortAll(by string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, t := range st.order {
		if t.State == TxnInProgress {
			t.State, t.AbortedBy, t.pending = TxnAborted, by, nil
		}
	}
}

// endTxn runs commitTransaction (commit true) or abortTransaction.
func (st *store) endTxn(req *Request, commit bool, mongos bool) Reply {
	ti := parseTxnInfo(req.Body)
	if ti.lsid == nil || !ti.hasNumber {
		return Error(codeNoSuchTransaction, "", "no transaction: lsid and txnNumber are required", "TransientTransactionError")
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	t := st.txns[txnKey{string(ti.lsid), ti.n}]
	if t == nil {
		return Error(codeNoSuchTransaction, "", fmt.Sprintf("transaction %d not found", ti.n), "TransientTransactionError")
	}
	t.Commands = append(t.Commands, req.Command)
	t.ConnIDs = append(t.ConnIDs, req.ConnID)
	switch {
	case commit && t.State == TxnInProgress:
		for _, p := range t.pending {
			st.appendLocked(p.ns, p.doc)
		}
		t.State, t.pending = TxnCommitted, nil
	case commit && t.State == TxnCommitted:
		// A retried commit of a committed transaction succeeds again.
	case commit:
		return Error(codeNoSuchTransaction, "", fmt.Sprintf("transaction %d has been aborted", ti.n), "TransientTransactionError")
	case t.State == TxnInProgress:
		t.State, t.AbortedBy, t.pending = TxnAborted, "abortTransaction", nil
	case t.State == TxnCommitted:
		return Error(codeTransactionCommitted, "", fmt.Sprintf("transaction %d has been committed", ti.n))
	default:
		return Error(codeNoSuchTransaction, "", fmt.Sprintf("transaction %d has been aborted", ti.n))
	}
	if commit && mongos {
		return OK(bson.E{Key: "recoveryToken", Value: bson.D{{Key: "recoveryShardId", Value: "shard0"}}})
	}
	return okReply()
}

// endSessions aborts the in-progress transactions of the listed sessions.
func (st *store) endSessions(body bsoncore.Document) {
	arr, ok := body.Lookup("endSessions").ArrayOK()
	if !ok {
		return
	}
	vals, err := arr.Values()
	if err != nil {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, v := range vals {
		d, ok := v.DocumentOK()
		if !ok {
			continue
		}
		if id, ok := lsidFromSessionDoc(d); ok {
			st.abortSessionLocked(string(id), "endSessions")
		}
	}
}

func lsidFromSessionDoc(d bsoncore.Document) ([]byte, bool) {
	_, data, ok := d.Lookup("id").BinaryOK()
	return data, ok
}

// activeTxn returns the in-progress transaction a command belongs to, or nil.
// Called with mu held.
func (st *store) activeTxnLocked(ti txnInfo) *txnState {
	if !ti.inTxn || ti.lsid == nil {
		return nil
	}
	t := st.txns[txnKey{string(ti.lsid), ti.n}]
	if t == nil || t.State != TxnInProgress {
		return nil
	}
	return t
}

// collName returns the collection a command names in its first element.
func collName(req *Request) (string, bool) {
	name, ok := req.Lookup(req.Command).StringValueOK()
	return name, ok && name != ""
}

func (st *store) insert(req *Request) Reply {
	coll, ok := collName(req)
	if !ok {
		return Error(codeBadValue, "", "insert: collection name must be a non-empty string")
	}
	docs := req.Documents("documents")
	ns := req.DB + "." + coll
	ti := parseTxnInfo(req.Body)
	st.mu.Lock()
	defer st.mu.Unlock()
	var retryKey txnKey
	retryable := ti.lsid != nil && ti.hasNumber && !ti.inTxn
	if retryable {
		retryKey = txnKey{lsid: string(ti.lsid), n: ti.n}
		if done, ok := st.retried[retryKey]; ok {
			return Reply{Docs: []bsoncore.Document{done}}
		}
	}
	t := st.activeTxnLocked(ti)
	for _, d := range docs {
		owned := withID(d)
		if t != nil {
			t.pending = append(t.pending, pendingInsert{ns: ns, doc: owned})
		} else {
			st.appendLocked(ns, owned)
		}
	}
	r := OK(bson.E{Key: "n", Value: int32(len(docs))})
	if retryable {
		st.retried[retryKey] = r.Docs[0]
	}
	return r
}

// withID returns an owned copy of d with an _id, adding an ObjectID first
// when d has none (drivers normally add it themselves).
func withID(d bsoncore.Document) bsoncore.Document {
	if _, err := d.LookupErr("_id"); err == nil {
		return bytes.Clone(d)
	}
	idx, out := bsoncore.AppendDocumentStart(make([]byte, 0, len(d)+17))
	out = bsoncore.AppendObjectIDElement(out, "_id", bson.NewObjectID())
	if len(d) > 5 {
		out = append(out, d[4:len(d)-1]...)
	}
	return endDoc(out, idx)
}

func (st *store) drop(req *Request) Reply {
	coll, ok := collName(req)
	if !ok {
		return Error(codeBadValue, "", "drop: collection name must be a non-empty string")
	}
	ns := req.DB + "." + coll
	st.mu.Lock()
	delete(st.colls, ns)
	delete(st.seqs, ns)
	st.mu.Unlock()
	return OK(bson.E{Key: "ns", Value: ns})
}

// appendLocked adds a document to ns as a new write. Called with mu held.
func (st *store) appendLocked(ns string, doc bsoncore.Document) {
	st.seq++
	st.colls[ns] = append(st.colls[ns], doc)
	st.seqs[ns] = append(st.seqs[ns], st.seq)
}

// lastSeq returns the number of the latest write.
func (st *store) lastSeq() uint64 {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.seq
}

// allWrites is the find horizon that sees every write.
const allWrites = ^uint64(0)

func (st *store) find(req *Request) Reply { return st.findAt(req, allWrites) }

// findAt runs find seeing only the writes numbered up to upTo.
func (st *store) findAt(req *Request, upTo uint64) Reply {
	coll, ok := collName(req)
	if !ok {
		return Error(codeBadValue, "", "find: collection name must be a non-empty string")
	}
	for _, unsupported := range []string{"sort", "projection", "collation", "hint"} {
		if d, ok := req.Lookup(unsupported).DocumentOK(); ok && len(d) > 5 {
			return Error(codeBadValue, "", "fakemongo: find does not support "+unsupported)
		}
	}
	var filter bsoncore.Document
	if v := req.Lookup("filter"); v.Type != 0 {
		if filter, ok = v.DocumentOK(); !ok {
			return Error(codeBadValue, "", "find: filter must be a document")
		}
	}
	skip, _ := req.Lookup("skip").AsInt64OK()
	limit, _ := req.Lookup("limit").AsInt64OK()
	batch, hasBatch := req.Lookup("batchSize").AsInt64OK()
	single, _ := req.Lookup("singleBatch").BooleanOK()
	if skip < 0 || batch < 0 {
		return Error(codeBadValue, "", "find: skip and batchSize must not be negative")
	}
	if limit < 0 {
		limit, single = -limit, true
	}
	if !hasBatch {
		batch = defaultBatchSize
	}
	ns := req.DB + "." + coll
	ti := parseTxnInfo(req.Body)

	st.mu.Lock()
	defer st.mu.Unlock()
	src := st.colls[ns]
	if upTo != allWrites {
		n, _ := slices.BinarySearch(st.seqs[ns], upTo+1)
		src = src[:n]
	}
	if t := st.activeTxnLocked(ti); t != nil {
		src = slices.Clone(src)
		for _, p := range t.pending {
			if p.ns == ns {
				src = append(src, p.doc)
			}
		}
	}
	var matched []bsoncore.Document
	for _, d := range src {
		ok, err := matches(d, filter)
		if err != nil {
			return Error(codeBadValue, "", err.Error())
		}
		if !ok {
			continue
		}
		if skip > 0 {
			skip--
			continue
		}
		matched = append(matched, d)
		if limit > 0 && int64(len(matched)) >= limit {
			break
		}
	}
	n := len(matched)
	if hasBatch && batch > 0 && int64(n) > batch {
		n = int(batch)
	} else if hasBatch && batch == 0 {
		n = 0
	}
	var id int64
	if n < len(matched) && !single {
		id = st.newCursorID()
		st.cursors[id] = &cursor{ns: ns, docs: matched[n:], owner: serverOf(req)}
	}
	return Reply{Docs: []bsoncore.Document{cursorReply(id, ns, "firstBatch", matched[:n])}}
}

func (st *store) getMore(req *Request) Reply {
	id, ok := req.Lookup("getMore").AsInt64OK()
	if !ok {
		return Error(codeBadValue, "", "getMore: cursor id must be an integer")
	}
	coll, _ := req.Lookup("collection").StringValueOK()
	batch, _ := req.Lookup("batchSize").AsInt64OK()
	if batch < 0 {
		return Error(codeBadValue, "", "getMore: batchSize must not be negative")
	}
	ns := req.DB + "." + coll
	st.mu.Lock()
	defer st.mu.Unlock()
	c := st.cursors[id]
	if c == nil || !c.ownedBy(serverOf(req)) {
		return Error(codeCursorNotFound, "", fmt.Sprintf("cursor id %d not found", id))
	}
	if c.ns != ns {
		return Error(13, "", fmt.Sprintf("cursor %d belongs to %s, not %s", id, c.ns, ns))
	}
	var r Reply
	for {
		n := len(c.docs)
		if batch > 0 && int64(n) > batch {
			n = int(batch)
		}
		replyID := id
		if n == len(c.docs) {
			replyID = 0
			delete(st.cursors, id)
		}
		r.Docs = append(r.Docs, cursorReply(replyID, ns, "nextBatch", c.docs[:n]))
		c.docs = c.docs[n:]
		// Exhaust: stream every remaining batch, as a real server does
		// for getMore with exhaustAllowed.
		if replyID == 0 || !req.ExhaustAllowed() {
			return r
		}
	}
}

func (st *store) killCursors(req *Request) Reply {
	coll, _ := collName(req)
	ns := req.DB + "." + coll
	arr, ok := req.Lookup("cursors").ArrayOK()
	if !ok {
		return Error(codeBadValue, "", "killCursors: cursors must be an array")
	}
	vals, err := arr.Values()
	if err != nil {
		return Error(codeBadValue, "", "killCursors: "+err.Error())
	}
	var killed, notFound []int64
	st.mu.Lock()
	for _, v := range vals {
		id, ok := v.AsInt64OK()
		if !ok {
			continue
		}
		if c := st.cursors[id]; c != nil && c.ns == ns && c.ownedBy(serverOf(req)) {
			delete(st.cursors, id)
			killed = append(killed, id)
		} else {
			notFound = append(notFound, id)
		}
	}
	st.mu.Unlock()
	return OK(
		bson.E{Key: "cursorsKilled", Value: int64Array(killed)},
		bson.E{Key: "cursorsNotFound", Value: int64Array(notFound)},
		bson.E{Key: "cursorsAlive", Value: bson.A{}},
		bson.E{Key: "cursorsUnknown", Value: bson.A{}},
	)
}

func int64Array(ids []int64) bson.A {
	a := make(bson.A, len(ids))
	for i, id := range ids {
		a[i] = id
	}
	return a
}

// cursorReply builds {cursor: {<batchKey>: docs, id, ns}, ok: 1}.
func cursorReply(id int64, ns, batchKey string, docs []bsoncore.Document) bsoncore.Document {
	size := 64 + len(ns)
	for _, d := range docs {
		size += len(d) + 8
	}
	idx, dst := bsoncore.AppendDocumentStart(make([]byte, 0, size))
	cidx, dst := bsoncore.AppendDocumentElementStart(dst, "cursor")
	aidx, dst := bsoncore.AppendArrayElementStart(dst, batchKey)
	for i, d := range docs {
		dst = bsoncore.AppendDocumentElement(dst, arrayKey(i), d)
	}
	dst = endDoc(dst, aidx)
	dst = bsoncore.AppendInt64Element(dst, "id", id)
	dst = bsoncore.AppendStringElement(dst, "ns", ns)
	dst = endDoc(dst, cidx)
	dst = bsoncore.AppendDoubleElement(dst, "ok", 1)
	return endDoc(dst, idx)
}

// matches reports whether doc matches a filter of top-level (or dotted)
// equalities. Query operators are refused rather than misinterpreted.
func matches(doc, filter bsoncore.Document) (bool, error) {
	if len(filter) <= 5 {
		return true, nil
	}
	elems, err := filter.Elements()
	if err != nil {
		return false, fmt.Errorf("filter: %w", err)
	}
	for _, e := range elems {
		key := e.Key()
		if strings.HasPrefix(key, "$") {
			return false, fmt.Errorf("fakemongo: filter operator %s is not supported", key)
		}
		want := e.Value()
		if d, ok := want.DocumentOK(); ok {
			if first, err := d.IndexErr(0); err == nil && strings.HasPrefix(first.Key(), "$") {
				return false, fmt.Errorf("fakemongo: filter operator %s is not supported", first.Key())
			}
		}
		got, err := doc.LookupErr(strings.Split(key, ".")...)
		if err != nil {
			if want.Type == bsoncore.TypeNull {
				continue
			}
			return false, nil
		}
		if !valuesEqual(got, want) {
			return false, nil
		}
	}
	return true, nil
}

func valuesEqual(a, b bsoncore.Value) bool {
	// Numbers compare by value across int32/int64/double, as in MongoDB;
	// Decimal128 has no float64 view here and falls back to exact bytes.
	x, okx := a.AsFloat64OK()
	y, oky := b.AsFloat64OK()
	if okx && oky {
		return x == y
	}
	return a.Type == b.Type && bytes.Equal(a.Data, b.Data)
}
