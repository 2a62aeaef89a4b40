package command

// Requests: what one command body is (its command, database, session,
// transaction, cursor), learnt in a single pass over its elements.

import (
	"bytes"
	"encoding/binary"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Kind classifies the commands the proxy treats specially. Everything
// else is forwarded as it is.
type Kind uint8

// The kinds of command.
const (
	Other       Kind = iota
	Hello            // hello, isMaster, ismaster: answered by mongobouncer
	Auth             // authentication commands: answered by mongobouncer
	GetMore          // routed by cursor id
	KillCursors      // routed by cursor id
	Commit           // commitTransaction
	Abort            // abortTransaction
	EndSessions      // endSessions: forwarded where possible, else answered
)

// Info is the static knowledge about one command name.
type Info struct {
	Name string
	Kind Kind
	// Write marks the commands drivers retry as retryable writes; synthetic
	// error replies to them carry the RetryableWriteError label.
	Write bool
	// Known is set for the commands of the table below; others are
	// reported to metrics as "other".
	Known bool
	// Primary marks the commands that always run on a primary, whatever
	// read preference they carry: writes and changes to the catalog.
	Primary bool
}

// commands maps a command name to what the proxy knows about it. Lookups
// with a []byte key converted in the index expression do not allocate, and
// the stored name gives an interned string for logs and metrics.
var commands = func() map[string]Info {
	m := map[string]Info{}
	add := func(kind Kind, write bool, names ...string) {
		for _, n := range names {
			m[n] = Info{Name: n, Kind: kind, Write: write, Known: true, Primary: write}
		}
	}
	add(Hello, false, "hello", "isMaster", "ismaster")
	add(Auth, false, "saslStart", "saslContinue", "authenticate", "getnonce", "logout",
		"copydbSaslStart", "copydbgetnonce")
	add(GetMore, false, "getMore")
	add(KillCursors, false, "killCursors")
	add(Commit, true, "commitTransaction")
	add(Abort, true, "abortTransaction")
	add(EndSessions, false, "endSessions")
	add(Other, true, "insert", "update", "delete", "findAndModify", "findandmodify", "bulkWrite")
	add(Other, false, "find", "aggregate", "count", "distinct", "ping", "buildInfo", "buildinfo",
		"listCollections", "listIndexes", "listDatabases", "create", "drop", "dropDatabase",
		"createIndexes", "dropIndexes", "serverStatus", "getParameter", "getLog", "explain",
		"collStats", "dbStats", "connectionStatus", "whatsmyuri", "startSession", "refreshSessions",
		"getCmdLineOpts", "atlasVersion", "hostInfo", "renameCollection", "collMod", "validate")
	// Changes to the catalog, and the other writes drivers do not retry.
	for _, n := range []string{"create", "drop", "dropDatabase", "createIndexes", "dropIndexes",
		"renameCollection", "collMod", "validate"} {
		ci := m[n]
		ci.Primary = true
		m[n] = ci
	}
	return m
}()

// Lookup returns what is known about the command name; an unknown name
// has only its Name set.
func Lookup(name string) Info {
	if ci, ok := commands[name]; ok {
		return ci
	}
	return Info{Name: name}
}

// TxnKey names one transaction: the session id and the transaction number.
// It is comparable, so maps keyed by it never allocate on lookup.
type TxnKey struct {
	LSID [16]byte
	Txn  int64
}

// Request is what the proxy learns from one command body in a single pass.
// Its byte slices alias the message buffer and are valid only while the
// request is being handled.
type Request struct {
	Info     Info
	DB       []byte // $db value
	HasLSID  bool
	LSID     [16]byte
	HasTxn   bool
	Txn      int64
	StartTxn bool // startTransaction: true
	InTxn    bool // autocommit: false (every command of a transaction carries it)
	CursorID int64
	// Exhaust and More are the OP_MSG flags, set by the caller: the
	// request allowed an exhaust reply stream; it carried moreToCome (no
	// reply is expected).
	Exhaust bool
	More    bool
	// ReadPref is the $readPreference document, nil when the command has
	// none, BadReadPref when it is not a document.
	ReadPref []byte
}

// Name returns the command name for logs and error messages.
func (r *Request) Name() string { return r.Info.Name }

// Key returns the transaction the request belongs to, if any.
func (r *Request) Key() (TxnKey, bool) {
	if !r.HasLSID || !r.HasTxn || !r.InTxn {
		return TxnKey{}, false
	}
	return TxnKey{LSID: r.LSID, Txn: r.Txn}, true
}

// Inspect fills r from a command body. It walks the top-level elements once
// and does not allocate for known command names. body must already be valid
// BSON (the wire layer validates it).
func (r *Request) Inspect(body bsoncore.Document) {
	*r = Request{}
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
				r.Info = ci
			} else {
				r.Info = Info{Name: string(key)}
			}
			if r.Info.Kind == GetMore {
				r.CursorID, _ = el.Value().AsInt64OK()
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
					r.DB, _ = stringBytes(el.Value())
				}
			} else if bytes.Equal(key, []byte("$readPreference")) {
				if v := el.Value(); v.Type == bsoncore.TypeEmbeddedDocument {
					r.ReadPref = v.Data
				} else {
					r.ReadPref = BadReadPref
				}
			}
		case 'l':
			if bytes.Equal(key, []byte("lsid")) {
				r.LSID, r.HasLSID = sessionID(el.Value())
			}
		case 't':
			if bytes.Equal(key, []byte("txnNumber")) {
				r.Txn, r.HasTxn = el.Value().AsInt64OK()
			}
		case 's':
			if bytes.Equal(key, []byte("startTransaction")) {
				r.StartTxn, _ = el.Value().BooleanOK()
			}
		case 'a':
			if bytes.Equal(key, []byte("autocommit")) {
				if b, ok := el.Value().BooleanOK(); ok && !b {
					r.InTxn = true
				}
			}
		}
	}
}

// BadReadPref stands for a $readPreference that is not a document, so
// that it is refused rather than ignored.
var BadReadPref = []byte{0}

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

// CursorIDs returns the ids of a killCursors command's cursors array.
func CursorIDs(body bsoncore.Document) []int64 {
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
