package proxy

import (
	"github.com/mongobouncer/mongobouncer/internal/command"

	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// OurMaxWireVersion is the newest wire version mongobouncer understands
// (MongoDB 8.0). Clients are told min(this, every upstream's).
const OurMaxWireVersion = 25

// helloRequest is what a client's hello/isMaster asks for.
type helloRequest struct {
	legacyName   bool // isMaster/ismaster: reply with "ismaster" instead of "isWritablePrimary"
	helloOk      bool
	loadBalanced bool
	compression  []string // compressors the client offers, in its order
	appName      string
	apiVersion   string
	// apiVersionType is the BSON type of an apiVersion that is not a
	// string (0 otherwise). apiVersion then holds the type's name, so that
	// the check refusing versions other than "1" refuses it too, and
	// apiVersionError answers as a server does (TypeMismatch).
	apiVersionType bsoncore.Type
}

// parseHello reads a hello/isMaster command document. Unknown fields are
// ignored, as a server does.
func parseHello(body bsoncore.Document, name string) helloRequest {
	hr := helloRequest{legacyName: name != "hello"}
	if v, err := body.LookupErr("helloOk"); err == nil {
		hr.helloOk, _ = v.BooleanOK()
	}
	if v, err := body.LookupErr("loadBalanced"); err == nil {
		hr.loadBalanced, _ = v.BooleanOK()
	}
	if v, err := body.LookupErr("compression"); err == nil {
		if arr, ok := v.ArrayOK(); ok {
			if vals, err := arr.Values(); err == nil {
				for _, c := range vals {
					if s, ok := c.StringValueOK(); ok {
						hr.compression = append(hr.compression, s)
					}
				}
			}
		}
	}
	if v, err := body.LookupErr("client", "application", "name"); err == nil {
		hr.appName, _ = v.StringValueOK()
	}
	if v, err := body.LookupErr("apiVersion"); err == nil {
		if str, ok := v.StringValueOK(); ok {
			hr.apiVersion = str
		} else {
			hr.apiVersionType = v.Type
			hr.apiVersion = bsonTypeName(v.Type)
		}
	}
	return hr
}

// apiVersionError is the reply to a hello whose apiVersion is refused:
// TypeMismatch (14) for one that is not a string, as a server answers,
// else APIVersionError (322).
func (hr *helloRequest) apiVersionError() bsoncore.Document {
	if hr.apiVersionType != 0 {
		return command.ErrorReply(14, "TypeMismatch",
			fmt.Sprintf("mongobouncer: BSON field 'apiVersion' is the wrong type '%s', expected type 'string'", hr.apiVersion))
	}
	return command.ErrorReply(322, "APIVersionError", fmt.Sprintf("mongobouncer: API version %q is not supported", hr.apiVersion))
}

// bsonTypeName is the server's alias of a BSON type (as in its $type and
// TypeMismatch messages).
func bsonTypeName(t bsoncore.Type) string {
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

// limits are the figures a hello reply passes on from the upstreams.
type limits struct {
	minWire, maxWire  int32
	maxBSON, maxMsg   int32
	maxBatch          int32
	sessionTimeoutMin int32
}

// defaultLimits are MongoDB's own defaults, used until an upstream has
// answered a hello.
var defaultLimits = limits{
	minWire: 0, maxWire: OurMaxWireVersion,
	maxBSON: 16 * 1024 * 1024, maxMsg: 48_000_000, maxBatch: 100_000,
	sessionTimeoutMin: 30,
}

// plainHello is the reply to hr, a hello, outside a drain.
func (s *Server) plainHello(hr helloRequest, lim limits, connID int64, compressor string) bsoncore.Document {
	return helloReply(hr, lim, connID, compressor, s.serviceID, s.topo.processID, s.topo.counter.Load())
}

// helloReply builds the reply mongobouncer gives as a mongos. compressor is
// the agreed compressor name or "". It carries the topologyVersion
// {processID, counter}, with which drivers stream their monitoring
// (awaithello.go).
func helloReply(hr helloRequest, lim limits, connID int64, compressor string, serviceID, processID bson.ObjectID, counter int64) bsoncore.Document {
	idx, doc := bsoncore.AppendDocumentStart(make([]byte, 0, 384))
	if hr.legacyName {
		doc = bsoncore.AppendBooleanElement(doc, "ismaster", true)
	} else {
		doc = bsoncore.AppendBooleanElement(doc, "isWritablePrimary", true)
	}
	doc = bsoncore.AppendStringElement(doc, "msg", "isdbgrid")
	doc = bsoncore.AppendInt32Element(doc, "maxBsonObjectSize", lim.maxBSON)
	doc = bsoncore.AppendInt32Element(doc, "maxMessageSizeBytes", lim.maxMsg)
	doc = bsoncore.AppendInt32Element(doc, "maxWriteBatchSize", lim.maxBatch)
	doc = bsoncore.AppendDateTimeElement(doc, "localTime", time.Now().UnixMilli())
	doc = bsoncore.AppendInt32Element(doc, "logicalSessionTimeoutMinutes", lim.sessionTimeoutMin)
	doc = bsoncore.AppendInt64Element(doc, "connectionId", connID)
	doc = bsoncore.AppendInt32Element(doc, "minWireVersion", lim.minWire)
	doc = bsoncore.AppendInt32Element(doc, "maxWireVersion", lim.maxWire)
	doc = bsoncore.AppendBooleanElement(doc, "readOnly", false)
	tidx, d := bsoncore.AppendDocumentElementStart(doc, "topologyVersion")
	d = bsoncore.AppendObjectIDElement(d, "processId", processID)
	d = bsoncore.AppendInt64Element(d, "counter", counter)
	doc, _ = bsoncore.AppendDocumentEnd(d, tidx)
	if compressor != "" {
		aidx, d := bsoncore.AppendArrayElementStart(doc, "compression")
		d = bsoncore.AppendStringElement(d, "0", compressor)
		doc, _ = bsoncore.AppendArrayEnd(d, aidx)
	}
	if hr.helloOk {
		doc = bsoncore.AppendBooleanElement(doc, "helloOk", true)
	}
	if hr.loadBalanced {
		doc = bsoncore.AppendObjectIDElement(doc, "serviceId", serviceID)
	}
	doc = bsoncore.AppendDoubleElement(doc, "ok", 1)
	doc, _ = bsoncore.AppendDocumentEnd(doc, idx)
	return doc
}
