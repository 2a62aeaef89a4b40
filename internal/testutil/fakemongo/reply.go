package fakemongo

import (
	"bytes"
	"fmt"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// Handler computes the reply to one command. It runs on the goroutine of the
// connection that received the request, so a slow handler delays only that
// connection, as a slow command would on a real server.
type Handler func(req *Request) Reply

// Reply tells the connection what to do with a request.
//
// The zero Reply sends nothing back, which is only right for requests sent
// with moreToCome; use NoReply to say so explicitly.
type Reply struct {
	// Docs are the reply bodies. One document is an ordinary reply. More
	// than one is an exhaust stream: if the request carried exhaustAllowed,
	// each document goes in its own OP_MSG, every one but the last with
	// moreToCome, each answering the previous reply's requestID. Without
	// exhaustAllowed only Docs[0] is sent, as a real server never streams to
	// a client that did not allow it.
	Docs []bsoncore.Document
	// Delay is waited before anything else (sending, closing, killing). The
	// wait ends early if the client closes the connection or the server is
	// closed; the request is then dropped.
	Delay time.Duration
	// Interval is waited between two documents of an exhaust stream.
	Interval time.Duration
	// NoReply sends nothing and goes on reading requests. Requests with
	// moreToCome never get a reply whatever the Reply says.
	NoReply bool
	// CloseConn closes this connection without replying.
	CloseConn bool
	// Kill kills the whole server without replying: the listener and every
	// connection are closed, as if the process died (see Server.Kill).
	Kill bool
}

// Docs builds a Reply with one document per argument; see Doc for the
// accepted types.
func Docs(docs ...any) Reply {
	r := Reply{Docs: make([]bsoncore.Document, len(docs))}
	for i, d := range docs {
		r.Docs[i] = Doc(d)
	}
	return r
}

// OK builds the reply {ok: 1, fields...}.
func OK(fields ...bson.E) Reply {
	d := make(bson.D, 0, len(fields)+1)
	d = append(d, bson.E{Key: "ok", Value: 1.0})
	d = append(d, fields...)
	return Docs(d)
}

// Error builds the error reply {ok: 0, errmsg, code, codeName, errorLabels}.
// An empty codeName is filled in for codes the fake knows; labels are
// omitted when none are given.
func Error(code int32, codeName, msg string, labels ...string) Reply {
	return Reply{Docs: []bsoncore.Document{appendErrorDoc(nil, code, codeName, msg, labels)}}
}

// Doc converts a test-provided value into a BSON document: bsoncore.Document,
// bson.Raw and []byte are used as they are; anything else goes through
// bson.Marshal. It panics when the value cannot be marshalled, which is a
// bug in the test that wrote it, never a consequence of network input.
func Doc(v any) bsoncore.Document {
	switch d := v.(type) {
	case bsoncore.Document:
		return d
	case bson.Raw:
		return bsoncore.Document(d)
	case []byte:
		return bsoncore.Document(d)
	}
	b, err := bson.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("fakemongo: cannot marshal reply document %T: %v", v, err))
	}
	return b
}

// Request is one command received by the fake server.
//
// Request and everything it points to (Body, Sequences) live in the
// connection's reusable buffers: they are valid only until the handler
// returns. Call Clone to keep a request.
type Request struct {
	// ConnID identifies the connection that carried the request; it is the
	// connectionId the server sent in its hello reply to that connection.
	ConnID int64
	// AppName is the client.application.name the connection sent in its
	// first hello ("" if none).
	AppName string
	// Command is the command name: the first key of Body.
	Command string
	// DB is the body's $db (for OP_QUERY: the database of "<db>.$cmd").
	DB string
	// Body is the command document (section kind 0; for OP_QUERY the
	// query, unwrapped from $query if needed).
	Body bsoncore.Document
	// Sequences are the OP_MSG document sequences (section kind 1).
	Sequences []wire.Sequence
	// Flags are the OP_MSG flag bits (0 for OP_QUERY).
	Flags wire.MsgFlags
	// RequestID is the requestID of the message header.
	RequestID int32
	// OpCode is wire.OpMsg or wire.OpQuery (after decompression).
	OpCode wire.OpCode
	// Compressor names the compressor the request arrived with ("" when it
	// was not compressed).
	Compressor string

	// conn is the connection the request came from; the built-in hello
	// records the negotiated compressors on it.
	conn *conn
}

// MoreToCome reports whether the client asked for no reply.
func (r *Request) MoreToCome() bool { return r.Flags.Has(wire.FlagMoreToCome) }

// ExhaustAllowed reports whether the client accepts an exhaust stream.
func (r *Request) ExhaustAllowed() bool { return r.Flags.Has(wire.FlagExhaustAllowed) }

// Lookup returns the value at the (dotted, as separate keys) path in Body; the
// zero Value when absent or malformed.
func (r *Request) Lookup(key ...string) bsoncore.Value {
	v, err := r.Body.LookupErr(key...)
	if err != nil {
		return bsoncore.Value{}
	}
	return v
}

// LSID returns the bytes of lsid.id (a UUID) and whether the request had one.
func (r *Request) LSID() ([]byte, bool) { return lsidOf(r.Body) }

// TxnNumber returns txnNumber and whether the request had one.
func (r *Request) TxnNumber() (int64, bool) {
	v := r.Lookup("txnNumber")
	return v.AsInt64OK()
}

// Documents returns the documents a write command carries under ident
// ("documents", "updates", "deletes"): from the document sequence of that
// name if there is one, else from the body array of that name. The result
// aliases the request's buffers.
func (r *Request) Documents(ident string) []bsoncore.Document {
	for _, s := range r.Sequences {
		if s.Identifier == ident {
			var out []bsoncore.Document
			for d := range s.All() {
				out = append(out, d)
			}
			return out
		}
	}
	arr, ok := r.Lookup(ident).ArrayOK()
	if !ok {
		return nil
	}
	vals, err := arr.Values()
	if err != nil {
		return nil
	}
	out := make([]bsoncore.Document, 0, len(vals))
	for _, v := range vals {
		if d, ok := v.DocumentOK(); ok {
			out = append(out, d)
		}
	}
	return out
}

// Clone returns a deep copy of the request that stays valid after the handler
// returns. Builtin on a clone still works.
func (r *Request) Clone() *Request {
	c := *r
	c.Body = bytes.Clone(r.Body)
	c.Sequences = make([]wire.Sequence, len(r.Sequences))
	for i, s := range r.Sequences {
		c.Sequences[i].Identifier = strings.Clone(s.Identifier)
		c.Sequences[i].Documents = bytes.Clone(s.Documents)
	}
	return &c
}

// lsidOf extracts lsid.id's bytes from a command body.
func lsidOf(body bsoncore.Document) ([]byte, bool) {
	v, err := body.LookupErr("lsid", "id")
	if err != nil {
		return nil, false
	}
	_, data, ok := v.BinaryOK()
	return data, ok
}

// Error codes the fake uses or knows a name for.
const (
	codeBadValue                       = 2
	codeCursorNotFound                 = 43
	codeCommandNotFound                = 59
	codeShutdownInProgress             = 91
	codeConflictingOperationInProgress = 117
	codeTransactionTooOld              = 225
	codeNoSuchTransaction              = 251
	codeTransactionCommitted           = 256
	codeUnsupportedOpQueryCommand      = 352
	// CodeOverloaded is MongoDB 8.2's refusal of work under load
	// (IngressRequestRateLimitExceeded), labelled SystemOverloadedError and
	// RetryableError (the client-backpressure spec).
	CodeOverloaded = 462
)

// OverloadLabels are the labels a server puts on CodeOverloaded.
var OverloadLabels = []string{"SystemOverloadedError", "RetryableError"}

// Overloaded is the reply of a server refusing a command under load.
func Overloaded() Reply {
	return Error(CodeOverloaded, "", "request rejected: the server is overloaded", OverloadLabels...)
}

// codeNames names the error codes tests commonly inject, so injected errors
// look like a real server's.
var codeNames = map[int32]string{
	1:                                  "InternalError",
	codeBadValue:                       "BadValue",
	6:                                  "HostUnreachable",
	7:                                  "HostNotFound",
	11:                                 "UserNotFound",
	13:                                 "Unauthorized",
	18:                                 "AuthenticationFailed",
	26:                                 "NamespaceNotFound",
	codeCursorNotFound:                 "CursorNotFound",
	50:                                 "MaxTimeMSExpired",
	codeCommandNotFound:                "CommandNotFound",
	89:                                 "NetworkTimeout",
	codeShutdownInProgress:             "ShutdownInProgress",
	codeConflictingOperationInProgress: "ConflictingOperationInProgress",
	112:                                "WriteConflict",
	134:                                "ReadConcernMajorityNotAvailableYet",
	189:                                "PrimarySteppedDown",
	codeTransactionTooOld:              "TransactionTooOld",
	codeNoSuchTransaction:              "NoSuchTransaction",
	codeTransactionCommitted:           "TransactionCommitted",
	262:                                "ExceededTimeLimit",
	codeUnsupportedOpQueryCommand:      "UnsupportedOpQueryCommand",
	CodeOverloaded:                     "IngressRequestRateLimitExceeded",
	9001:                               "SocketException",
	10107:                              "NotWritablePrimary",
	11000:                              "DuplicateKey",
	11600:                              "InterruptedAtShutdown",
	11602:                              "InterruptedDueToReplStateChange",
	13435:                              "NotPrimaryNoSecondaryOk",
	13436:                              "NotPrimaryOrSecondary",
}

// appendErrorDoc appends {ok: 0, errmsg, code, codeName, errorLabels?}.
func appendErrorDoc(dst []byte, code int32, codeName, msg string, labels []string) []byte {
	if codeName == "" {
		codeName = codeNames[code]
	}
	idx, dst := bsoncore.AppendDocumentStart(dst)
	dst = bsoncore.AppendDoubleElement(dst, "ok", 0)
	dst = bsoncore.AppendStringElement(dst, "errmsg", msg)
	dst = bsoncore.AppendInt32Element(dst, "code", code)
	if codeName != "" {
		dst = bsoncore.AppendStringElement(dst, "codeName", codeName)
	}
	if len(labels) > 0 {
		var aidx int32
		aidx, dst = bsoncore.AppendArrayElementStart(dst, "errorLabels")
		for i, l := range labels {
			dst = bsoncore.AppendStringElement(dst, arrayKey(i), l)
		}
		dst = endDoc(dst, aidx)
	}
	return endDoc(dst, idx)
}

// endDoc closes a document or array started at idx. Unlike
// bsoncore.AppendDocumentEnd it has no error: idx always comes from a start
// call on the same buffer.
func endDoc(dst []byte, idx int32) []byte {
	dst = append(dst, 0)
	return bsoncore.UpdateLength(dst, idx, int32(len(dst))-idx)
}

// smallKeys are the array keys "0".."15", kept to avoid formatting them.
var smallKeys = [...]string{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15"}

// arrayKey returns the BSON array key for index i.
func arrayKey(i int) string {
	if i < len(smallKeys) {
		return smallKeys[i]
	}
	return fmt.Sprint(i)
}
