package command

// Legacy OP_QUERY commands: a command sent as an OP_QUERY on "<db>.$cmd" is
// served as the OP_MSG a modern driver would have sent, and its reply goes
// back as an OP_REPLY. Drivers of this century send OP_QUERY only for the
// first hello (proxy/dispatch.go answers it), but a mongos of the oldest release
// mongobouncer fronts (4.2) still takes commands this way, and so does
// mongobouncer: what reaches the upstream is always OP_MSG, which every
// supported server accepts.
//
// The read preference follows server-selection.md, "Passing read
// preference to mongos": a $readPreference query modifier beside the
// command (wrapped in $query) is the read preference; without one, the
// SecondaryOk flag means secondaryPreferred and its absence means primary.
// The proxy then serves the translated command on its one request path, so
// routing, authentication, affinity and selection are decided as for any
// OP_MSG. Legacy queries on a collection, and the other legacy opcodes,
// are refused: no server mongobouncer supports takes them from a mongos
// client, and MongoDB 5.1 and later refuse them too.

import (
	"errors"
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// OP_QUERY flags that change how a command is served.
const (
	querySecondaryOk int32 = 1 << 2 // a secondary may answer
	queryExhaust     int32 = 1 << 6 // the client wants a stream of replies
)

// ErrLegacyExhaust is an OP_QUERY command that asks for an exhaust stream,
// which only getMore and hello ever served, and never over OP_QUERY
// commands.
var ErrLegacyExhaust = errors.New("OP_QUERY commands with the Exhaust flag are not supported; use OP_MSG")

// secondaryPreferred is the read preference of a SecondaryOk flag without
// a $readPreference modifier.
var secondaryPreferred = func() bsoncore.Document {
	return bsoncore.NewDocumentBuilder().AppendString("mode", "secondaryPreferred").Build()
}()

// LegacyDatabase returns the database of a command namespace ("db.$cmd"),
// or "" when ns names a collection.
func LegacyDatabase(ns string) string {
	db, ok := strings.CutSuffix(ns, ".$cmd")
	if !ok || db == "" || strings.Contains(db, ".") {
		return ""
	}
	return db
}

// LegacyCommand returns, appended to dst, the OP_MSG that carries q's
// command to database db, with q's request ID so that the reply answers
// it: the command's fields (unwrapped from $query), then $db, then the read
// preference the modifier or the SecondaryOk flag gives.
func LegacyCommand(dst []byte, q wire.Query, db string) ([]byte, error) {
	if q.Flags&queryExhaust != 0 {
		return nil, ErrLegacyExhaust
	}
	cmd := q.Query
	var rp bsoncore.Value
	if v, err := cmd.LookupErr("$query"); err == nil {
		d, ok := v.DocumentOK()
		if !ok {
			return nil, errors.New("$query is not a document")
		}
		if v, err := cmd.LookupErr("$readPreference"); err == nil {
			rp = v // validated with every other read preference (criteria)
		}
		cmd = d
	}
	if rp.Type == 0 && q.Flags&querySecondaryOk != 0 {
		rp = bsoncore.Value{Type: bsoncore.TypeEmbeddedDocument, Data: secondaryPreferred}
	}
	elems, err := cmd.Elements()
	if err != nil {
		return nil, err // ParseQuery validated it; kept for safety
	}
	if len(elems) == 0 {
		return nil, errors.New("empty command document")
	}
	idx, body := bsoncore.AppendDocumentStart(nil)
	for _, e := range elems {
		switch e.Key() {
		case "$db":
			continue // the namespace says where the command goes
		case "$readPreference":
			if rp.Type != 0 {
				continue // the modifier or the flag decides
			}
		}
		body = append(body, e...)
	}
	body = bsoncore.AppendStringElement(body, "$db", db)
	if rp.Type != 0 {
		body = bsoncore.AppendValueElement(body, "$readPreference", rp)
	}
	body, err = bsoncore.AppendDocumentEnd(body, idx)
	if err != nil {
		return nil, err
	}
	return wire.AppendMsg(dst, q.Header.RequestID, 0, 0, body), nil
}

// LegacyReply returns, appended to dst, the OP_REPLY that carries the body
// of the OP_MSG reply msg, with msg's request and response IDs. A command's
// failure is its document's ok: 0, as a server answers OP_QUERY commands;
// the QueryFailure flag is for queries. A reply that is not a well-formed
// OP_MSG (it passed the reply checks, which do not parse it whole) becomes
// an error document, so the client never reads a broken frame.
func LegacyReply(dst, msg []byte) []byte {
	h, _ := wire.ParseHeader(msg)
	m, err := wire.ParseMsg(msg)
	if err != nil {
		return wire.AppendReply(dst, h.RequestID, h.ResponseTo,
			ErrorReply(17, "ProtocolError", "mongobouncer: the upstream's reply could not be translated to OP_REPLY: "+err.Error()))
	}
	return wire.AppendReply(dst, h.RequestID, h.ResponseTo, m.Body)
}

// IsCmdNamespace reports whether ns is a command namespace, "<db>.$cmd".
func IsCmdNamespace(ns string) bool {
	return len(ns) > 5 && ns[len(ns)-5:] == ".$cmd"
}

// LegacyError adds the $err field that OP_REPLY query failures carry to
// the error reply doc.
func LegacyError(doc bsoncore.Document) bsoncore.Document {
	msg, _ := doc.Lookup("errmsg").StringValueOK()
	out := bsoncore.AppendStringElement(nil, "$err", msg)
	elems, _ := doc.Elements()
	parts := [][]byte{out}
	for _, e := range elems {
		parts = append(parts, e)
	}
	return bsoncore.BuildDocument(nil, parts...)
}
