package hello

// The request side: what a client's hello/isMaster asks for.

import (
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// MaxAwait bounds one wait of an awaitable hello, whatever maxAwaitTimeMS
// asks: a driver's monitor takes an earlier reply as a heartbeat, and a
// peer cannot park its server's goroutine for longer.
const MaxAwait = time.Minute

// Error is a hello refused, with the code and codeName a mongos answers it
// with; Msg is the errmsg without the server's prefix.
type Error struct {
	Code     int32
	CodeName string
	Msg      string
}

// Error returns the message with its codeName.
func (e *Error) Error() string { return e.CodeName + ": " + e.Msg }

// TopologyVersion is a server's {processId, counter}: drivers compare it
// to order what a server tells them, and the awaitable hello waits while
// it is the one the client holds.
type TopologyVersion struct {
	ProcessID bson.ObjectID
	Counter   int64
}

// Request is what a client's hello/isMaster asks for. Unknown fields are
// ignored, as a server does.
type Request struct {
	// LegacyName is set for isMaster/ismaster: the reply says "ismaster"
	// instead of "isWritablePrimary".
	LegacyName   bool
	HelloOK      bool
	LoadBalanced bool
	Compression  []string // the compressors the client offers, in its order
	AppName      string
	// APIVersion is the apiVersion asked for; for one that is not a
	// string, the name of its type (apiVersionType set), so that a check
	// refusing versions other than "1" refuses it too.
	APIVersion     string
	apiVersionType bsoncore.Type

	// The awaitable protocol: Version with HasVersion (topologyVersion),
	// Wait with HasWait (maxAwaitTimeMS, at most MaxAwait).
	HasVersion, HasWait bool
	Version             TopologyVersion
	Wait                time.Duration
	// awaitErr refuses malformed awaitable fields (nil when they are fine).
	awaitErr *Error
}

// Parse reads a hello/isMaster command document; name is the command's
// name as sent. The awaitable fields are checked as a mongos checks them
// (Awaitable, and State.Check for the refusal).
func Parse(body bsoncore.Document, name string) Request {
	r := Request{LegacyName: name != "hello"}
	if v, err := body.LookupErr("helloOk"); err == nil {
		r.HelloOK, _ = v.BooleanOK()
	}
	if v, err := body.LookupErr("loadBalanced"); err == nil {
		r.LoadBalanced, _ = v.BooleanOK()
	}
	if v, err := body.LookupErr("compression"); err == nil {
		if arr, ok := v.ArrayOK(); ok {
			if vals, err := arr.Values(); err == nil {
				for _, c := range vals {
					if s, ok := c.StringValueOK(); ok {
						r.Compression = append(r.Compression, s)
					}
				}
			}
		}
	}
	if v, err := body.LookupErr("client", "application", "name"); err == nil {
		r.AppName, _ = v.StringValueOK()
	}
	if v, err := body.LookupErr("apiVersion"); err == nil {
		if str, ok := v.StringValueOK(); ok {
			r.APIVersion = str
		} else {
			r.apiVersionType = v.Type
			r.APIVersion = typeName(v.Type)
		}
	}
	r.awaitErr = r.parseAwait(body)
	return r
}

// Awaitable reports whether the hello may wait: it has a well-formed
// topologyVersion and maxAwaitTimeMS.
func (r *Request) Awaitable() bool { return r.HasVersion && r.HasWait && r.awaitErr == nil }

// apiVersionError refuses an apiVersion other than "1": TypeMismatch (14)
// for one that is not a string, as a server answers, else
// APIVersionError (322); nil when there is none or it is "1".
func (r *Request) apiVersionError() *Error {
	switch {
	case r.APIVersion == "" || r.APIVersion == "1":
		return nil
	case r.apiVersionType != 0:
		return &Error{14, "TypeMismatch",
			fmt.Sprintf("BSON field 'apiVersion' is the wrong type '%s', expected type 'string'", r.APIVersion)}
	}
	return &Error{322, "APIVersionError", fmt.Sprintf("API version %q is not supported", r.APIVersion)}
}

// parseAwait reads topologyVersion and maxAwaitTimeMS into r, with a
// mongos's checks and codes; it returns the refusal, nil when they are
// fine.
func (r *Request) parseAwait(body bsoncore.Document) *Error {
	if v, err := body.LookupErr("topologyVersion"); err == nil {
		r.HasVersion = true
		d, ok := v.DocumentOK()
		if !ok {
			return typeMismatch("topologyVersion", v.Type, "object")
		}
		pid, err := d.LookupErr("processId")
		if err != nil {
			return missingField("TopologyVersion.processId")
		}
		if r.Version.ProcessID, ok = pid.ObjectIDOK(); !ok {
			return typeMismatch("TopologyVersion.processId", pid.Type, "objectId")
		}
		cnt, err := d.LookupErr("counter")
		if err != nil {
			return missingField("TopologyVersion.counter")
		}
		if r.Version.Counter, ok = cnt.Int64OK(); !ok {
			return typeMismatch("TopologyVersion.counter", cnt.Type, "long")
		}
	}
	if v, err := body.LookupErr("maxAwaitTimeMS"); err == nil {
		r.HasWait = true
		ms, ok := wholeNumber(v)
		if !ok {
			return typeMismatch("maxAwaitTimeMS", v.Type, "long")
		}
		if ms < 0 {
			return &Error{51759, "Location51759", "maxAwaitTimeMS must be a non-negative integer"}
		}
		r.Wait = time.Duration(min(ms, int64(MaxAwait/time.Millisecond))) * time.Millisecond
	}
	switch {
	case r.HasVersion && !r.HasWait:
		return &Error{51760, "Location51760", "A request with a 'topologyVersion' must include 'maxAwaitTimeMS'"}
	case r.HasWait && !r.HasVersion:
		return &Error{51760, "Location51760", "A request with 'maxAwaitTimeMS' must include a 'topologyVersion'"}
	case r.HasVersion && r.Version.Counter < 0:
		return &Error{51758, "Location51758", "topologyVersion must have a non-negative counter"}
	}
	return nil
}

// wholeNumber reads an int32, an int64 or a whole double.
func wholeNumber(v bsoncore.Value) (int64, bool) {
	switch v.Type {
	case bsoncore.TypeInt32:
		n, ok := v.Int32OK()
		return int64(n), ok
	case bsoncore.TypeInt64:
		return v.Int64OK()
	case bsoncore.TypeDouble:
		f, ok := v.DoubleOK()
		if !ok || f != f || f < -9e18 || f > 9e18 || f != float64(int64(f)) {
			return 0, false
		}
		return int64(f), true
	}
	return 0, false
}

func typeMismatch(field string, got bsoncore.Type, want string) *Error {
	return &Error{14, "TypeMismatch",
		fmt.Sprintf("BSON field '%s' is the wrong type '%s', expected type '%s'", field, typeName(got), want)}
}

func missingField(field string) *Error {
	return &Error{40414, "Location40414", fmt.Sprintf("BSON field '%s' is missing but a required field", field)}
}

// typeName is the server's alias of a BSON type (as in its $type and
// TypeMismatch messages).
func typeName(t bsoncore.Type) string {
	switch t {
	case bsoncore.TypeDouble:
		return "double"
	case bsoncore.TypeEmbeddedDocument:
		return "object"
	case bsoncore.TypeArray:
		return "array"
	case bsoncore.TypeBinary:
		return "binData"
	case bsoncore.TypeUndefined:
		return "undefined"
	case bsoncore.TypeObjectID:
		return "objectId"
	case bsoncore.TypeBoolean:
		return "bool"
	case bsoncore.TypeDateTime:
		return "date"
	case bsoncore.TypeNull:
		return "null"
	case bsoncore.TypeRegex:
		return "regex"
	case bsoncore.TypeDBPointer:
		return "dbPointer"
	case bsoncore.TypeJavaScript:
		return "javascript"
	case bsoncore.TypeSymbol:
		return "symbol"
	case bsoncore.TypeCodeWithScope:
		return "javascriptWithScope"
	case bsoncore.TypeInt32:
		return "int"
	case bsoncore.TypeTimestamp:
		return "timestamp"
	case bsoncore.TypeInt64:
		return "long"
	case bsoncore.TypeDecimal128:
		return "decimal"
	case bsoncore.TypeMinKey:
		return "minKey"
	case bsoncore.TypeMaxKey:
		return "maxKey"
	}
	return fmt.Sprintf("type %d", byte(t))
}
