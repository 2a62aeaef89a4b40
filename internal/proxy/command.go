package proxy

// Command and reply inspection: what a request is (its command, database,
// session, transaction, cursor) and what a reply says (ok, error code,
// cursor id), read from the BSON without decoding it; and the error
// replies we build (errorReply).

import (
	"bytes"
	"encoding/binary"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/routing"
	"github.com/mongobouncer/mongobouncer/internal/topology"
)

// cmdKind classifies the commands the proxy treats specially. Everything
// else is forwarded as it is.
type cmdKind uint8

const (
	kindOther       cmdKind = iota
	kindHello               // hello, isMaster, ismaster: answered by mongobouncer
	kindAuth                // authentication commands: refused until client auth exists
	kindGetMore             // routed by cursor id
	kindKillCursors         // routed by cursor id
	kindCommit              // commitTransaction
	kindAbort               // abortTransaction
	kindEndSessions         // endSessions: forwarded where possible, else answered
)

// cmdInfo is the static knowledge about one command name.
type cmdInfo struct {
	name string
	kind cmdKind
	// write marks the commands drivers retry as retryable writes; synthetic
	// error replies to them carry the RetryableWriteError label.
	write bool
	// known is set for the commands of the table below; others are
	// reported to metrics as "other".
	known bool
	// primary marks the commands that always run on a primary, whatever
	// read preference they carry: writes and changes to the catalog.
	primary bool
}

// commands maps a command name to what the proxy knows about it. Lookups
// with a []byte key converted in the index expression do not allocate, and
// the stored name gives an interned string for logs and metrics.
var commands = func() map[string]cmdInfo {
	m := map[string]cmdInfo{}
	add := func(kind cmdKind, write bool, names ...string) {
		for _, n := range names {
			m[n] = cmdInfo{name: n, kind: kind, write: write, known: true, primary: write}
		}
	}
	add(kindHello, false, "hello", "isMaster", "ismaster")
	add(kindAuth, false, "saslStart", "saslContinue", "authenticate", "getnonce", "logout",
		"copydbSaslStart", "copydbgetnonce")
	add(kindGetMore, false, "getMore")
	add(kindKillCursors, false, "killCursors")
	add(kindCommit, true, "commitTransaction")
	add(kindAbort, true, "abortTransaction")
	add(kindEndSessions, false, "endSessions")
	add(kindOther, true, "insert", "update", "delete", "findAndModify", "findandmodify", "bulkWrite")
	add(kindOther, false, "find", "aggregate", "count", "distinct", "ping", "buildInfo", "buildinfo",
		"listCollections", "listIndexes", "listDatabases", "create", "drop", "dropDatabase",
		"createIndexes", "dropIndexes", "serverStatus", "getParameter", "getLog", "explain",
		"collStats", "dbStats", "connectionStatus", "whatsmyuri", "startSession", "refreshSessions",
		"getCmdLineOpts", "atlasVersion", "hostInfo", "renameCollection", "collMod", "validate")
	// Changes to the catalog, and the other writes drivers do not retry.
	for _, n := range []string{"create", "drop", "dropDatabase", "createIndexes", "dropIndexes",
		"renameCollection", "collMod", "validate"} {
		ci := m[n]
		ci.primary = true
		m[n] = ci
	}
	return m
}()

// txnKey names one transaction: the session id and the transaction number
// (routing's, whose transaction affinity is keyed by it).
type txnKey = routing.TxnKey

// request is what the proxy learns from one command body in a single pass.
// Its byte slices alias the message buffer and are valid only while the
// request is being handled.
type request struct {
	info     cmdInfo
	db       []byte // $db value
	hasLSID  bool
	lsid     [16]byte
	hasTxn   bool
	txn      int64
	startTxn bool // startTransaction: true
	inTxn    bool // autocommit: false (every command of a transaction carries it)
	cursorID int64
	exhaust  bool // the request allowed an exhaust reply stream
	more     bool // the request carried moreToCome: no reply is expected
	// rp is the $readPreference document, nil when the command has none.
	rp []byte
}

// name returns the command name for logs and error messages.
func (r *request) name() string { return r.info.name }

// key returns the transaction the request belongs to, if any.
func (r *request) key() (txnKey, bool) {
	if !r.hasLSID || !r.hasTxn || !r.inTxn {
		return txnKey{}, false
	}
	return txnKey{LSID: r.lsid, Txn: r.txn}, true
}

// inspect fills r from a command body. It walks the top-level elements once
// and does not allocate for known command names. body must already be valid
// BSON (the wire layer validates it).
func (r *request) inspect(body bsoncore.Document) {
	*r = request{}
	if len(body) < 5 {
		return
	}
	rest := body[4 : len(body)-1]
	first, dbSeen := true, false
	for len(rest) > 0 {
		el, next, ok := bsoncore.ReadElement(rest)
		if !ok {
			return
		}
		rest = next
		key := el.KeyBytes()
		if first {
			first = false
			if ci, ok := commands[string(key)]; ok {
				r.info = ci
			} else {
				r.info = cmdInfo{name: string(key)}
			}
			if r.info.kind == kindGetMore {
				r.cursorID, _ = el.Value().AsInt64OK()
			}
			continue
		}
		if len(key) == 0 {
			continue
		}
		switch key[0] {
		case '$':
			if bytes.Equal(key, []byte("$db")) {
				// The first $db names the database, as mongod reads it: a
				// later one must not route the command elsewhere.
				if !dbSeen {
					dbSeen = true
					r.db, _ = stringBytes(el.Value())
				}
			} else if bytes.Equal(key, []byte("$readPreference")) {
				if v := el.Value(); v.Type == bsoncore.TypeEmbeddedDocument {
					r.rp = v.Data
				} else {
					r.rp = badReadPref
				}
			}
		case 'l':
			if bytes.Equal(key, []byte("lsid")) {
				r.lsid, r.hasLSID = sessionID(el.Value())
			}
		case 't':
			if bytes.Equal(key, []byte("txnNumber")) {
				r.txn, r.hasTxn = el.Value().AsInt64OK()
			}
		case 's':
			if bytes.Equal(key, []byte("startTransaction")) {
				r.startTxn, _ = el.Value().BooleanOK()
			}
		case 'a':
			if bytes.Equal(key, []byte("autocommit")) {
				if b, ok := el.Value().BooleanOK(); ok && !b {
					r.inTxn = true
				}
			}
		}
	}
}

// badReadPref stands for a $readPreference that is not a document, so
// that it is refused rather than ignored.
var badReadPref = []byte{0}

// stringBytes returns the bytes of a BSON string value without copying.
func stringBytes(v bsoncore.Value) ([]byte, bool) {
	if v.Type != bsoncore.TypeString || len(v.Data) < 5 {
		return nil, false
	}
	n := int(binary.LittleEndian.Uint32(v.Data))
	if n < 1 || 4+n > len(v.Data) {
		return nil, false
	}
	return v.Data[4 : 4+n-1], true
}

// sessionID extracts the UUID of an lsid document ({id: UUID}).
func sessionID(v bsoncore.Value) (id [16]byte, ok bool) {
	doc, ok := v.DocumentOK()
	if !ok {
		return id, false
	}
	idv, err := doc.LookupErr("id")
	if err != nil {
		return id, false
	}
	_, data, ok := idv.BinaryOK()
	if !ok || len(data) != 16 {
		return id, false
	}
	copy(id[:], data)
	return id, true
}

// cursorIDs returns the ids of a killCursors command's cursors array.
func cursorIDs(body bsoncore.Document) []int64 {
	v, err := body.LookupErr("cursors")
	if err != nil {
		return nil
	}
	arr, ok := v.ArrayOK()
	if !ok {
		return nil
	}
	vals, err := arr.Values()
	if err != nil {
		return nil
	}
	ids := make([]int64, 0, len(vals))
	for _, v := range vals {
		if id, ok := v.AsInt64OK(); ok {
			ids = append(ids, id)
		}
	}
	return ids
}

// replyInfo is what the proxy needs from an upstream reply.
type replyInfo struct {
	ok       bool
	cursorID int64 // cursor.id, 0 when absent or exhausted
	code     int32
	// wcCode is writeConcernError.code, 0 when absent.
	wcCode int32
	// overloaded: the server refused the command under load (code 462 or
	// the SystemOverloadedError label of the client-backpressure spec).
	overloaded bool
}

// codeOverloaded is the code MongoDB 8.2 refuses work with under load.
const codeOverloaded = 462

// stateChange returns the state-change error code (NotWritablePrimary,
// NodeIsRecovering, shutdown...) the reply carries, as its code or its
// writeConcernError's, or 0: SDAM's application error rules apply to both.
func (ri *replyInfo) stateChange() int32 {
	switch {
	case !ri.ok && topology.IsStateChangeCode(ri.code):
		return ri.code
	case topology.IsStateChangeCode(ri.wcCode):
		return ri.wcCode
	}
	return 0
}

// inspectReply reads ok, code and cursor.id from a reply body.
func inspectReply(body bsoncore.Document) replyInfo {
	var ri replyInfo
	if len(body) < 5 {
		return ri
	}
	rest := body[4 : len(body)-1]
	for len(rest) > 0 {
		el, next, ok := bsoncore.ReadElement(rest)
		if !ok {
			break
		}
		rest = next
		key := el.KeyBytes()
		switch {
		case bytes.Equal(key, []byte("ok")):
			if f, ok := el.Value().AsFloat64OK(); ok {
				ri.ok = f == 1
			}
		case bytes.Equal(key, []byte("code")):
			if c, ok := el.Value().AsInt32OK(); ok {
				ri.code = c
				ri.overloaded = ri.overloaded || c == codeOverloaded
			}
		case bytes.Equal(key, []byte("errorLabels")):
			if a, ok := el.Value().ArrayOK(); ok {
				vals, _ := a.Values()
				for _, v := range vals {
					if s, ok := v.StringValueOK(); ok && s == "SystemOverloadedError" {
						ri.overloaded = true
					}
				}
			}
		case bytes.Equal(key, []byte("cursor")):
			if d, ok := el.Value().DocumentOK(); ok {
				if idv, err := d.LookupErr("id"); err == nil {
					ri.cursorID, _ = idv.AsInt64OK()
				}
			}
		case bytes.Equal(key, []byte("writeConcernError")):
			if d, ok := el.Value().DocumentOK(); ok {
				if cv, err := d.LookupErr("code"); err == nil {
					ri.wcCode, _ = cv.AsInt32OK()
				}
			}
		}
	}
	return ri
}

// errorReply builds the body of a MongoDB error reply. Drivers decide what to
// retry from code and errorLabels, so every synthetic error goes through here.
func errorReply(code int32, codeName, msg string, labels ...string) bsoncore.Document {
	idx, doc := bsoncore.AppendDocumentStart(nil)
	doc = bsoncore.AppendDoubleElement(doc, "ok", 0)
	doc = bsoncore.AppendStringElement(doc, "errmsg", msg)
	doc = bsoncore.AppendInt32Element(doc, "code", code)
	doc = bsoncore.AppendStringElement(doc, "codeName", codeName)
	if len(labels) > 0 {
		aidx, d := bsoncore.AppendArrayElementStart(doc, "errorLabels")
		for i, l := range labels {
			d = bsoncore.AppendStringElement(d, strconv.Itoa(i), l)
		}
		doc, _ = bsoncore.AppendArrayEnd(d, aidx)
	}
	doc, _ = bsoncore.AppendDocumentEnd(doc, idx)
	return doc
}
