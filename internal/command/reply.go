package command

// Replies: what an upstream reply says that the proxy acts on (ok, code,
// overload, cursor id, an SDAM state change), read in one pass.

import (
	"bytes"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/sdam"
)

// Reply is what the proxy needs from an upstream reply.
type Reply struct {
	OK       bool
	CursorID int64 // cursor.id, 0 when absent or exhausted
	Code     int32
	// WCCode is writeConcernError.code, 0 when absent.
	WCCode int32
	// Overloaded: the server refused the command under load (code 462 or
	// the SystemOverloadedError label of the client-backpressure spec).
	Overloaded bool
}

// CodeOverloaded is the code MongoDB 8.2 refuses work with under load.
const CodeOverloaded = 462

// StateChange returns the state-change error code (NotWritablePrimary,
// NodeIsRecovering, shutdown...) the reply carries, as its code or its
// writeConcernError's, or 0: SDAM's application error rules apply to both.
func (ri *Reply) StateChange() int32 {
	switch {
	case !ri.OK && isStateChange(ri.Code):
		return ri.Code
	case isStateChange(ri.WCCode):
		return ri.WCCode
	}
	return 0
}

// isStateChange reports whether a server error code means the server is
// not (or no longer) what its description says, by SDAM's rules.
func isStateChange(code int32) bool { return sdam.IsStateChangeError(code, true, "") }

// InspectReply reads ok, code, labels and cursor.id from a reply body.
func InspectReply(body bsoncore.Document) Reply {
	var ri Reply
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
				ri.OK = f == 1
			}
		case bytes.Equal(key, []byte("code")):
			if c, ok := el.Value().AsInt32OK(); ok {
				ri.Code = c
				ri.Overloaded = ri.Overloaded || c == CodeOverloaded
			}
		case bytes.Equal(key, []byte("errorLabels")):
			if a, ok := el.Value().ArrayOK(); ok {
				vals, _ := a.Values()
				for _, v := range vals {
					if s, ok := v.StringValueOK(); ok && s == "SystemOverloadedError" {
						ri.Overloaded = true
					}
				}
			}
		case bytes.Equal(key, []byte("cursor")):
			if d, ok := el.Value().DocumentOK(); ok {
				if idv, err := d.LookupErr("id"); err == nil {
					ri.CursorID, _ = idv.AsInt64OK()
				}
			}
		case bytes.Equal(key, []byte("writeConcernError")):
			if d, ok := el.Value().DocumentOK(); ok {
				if cv, err := d.LookupErr("code"); err == nil {
					ri.WCCode, _ = cv.AsInt32OK()
				}
			}
		}
	}
	return ri
}
