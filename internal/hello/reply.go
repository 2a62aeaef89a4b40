package hello

// The reply side: the document a mongos answers a hello with, the limits
// it passes on from the upstreams, and the compression agreement.

import (
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// MaxWireVersion is the newest wire version mongobouncer understands
// (MongoDB 8.0). Clients are told min(this, every upstream's).
const MaxWireVersion = 25

// Limits are the figures a hello reply passes on from the upstreams.
type Limits struct {
	MinWire, MaxWire  int32
	MaxBSON, MaxMsg   int32
	MaxBatch          int32
	SessionTimeoutMin int32
}

// DefaultLimits are MongoDB's own defaults, used until an upstream has
// answered a hello.
var DefaultLimits = Limits{
	MinWire: 0, MaxWire: MaxWireVersion,
	MaxBSON: 16 * 1024 * 1024, MaxMsg: 48_000_000, MaxBatch: 100_000,
	SessionTimeoutMin: 30,
}

// FillZero replaces limits an upstream left out with MongoDB's defaults.
func (l *Limits) FillZero() {
	if l.MaxBSON <= 0 {
		l.MaxBSON = DefaultLimits.MaxBSON
	}
	if l.MaxMsg <= 0 {
		l.MaxMsg = DefaultLimits.MaxMsg
	}
	if l.MaxBatch <= 0 {
		l.MaxBatch = DefaultLimits.MaxBatch
	}
	if l.MaxWire <= 0 {
		l.MaxWire = DefaultLimits.MaxWire
	}
}

// Agree is the compressor a hello reply names: the first of the client's
// (in its order) that offered accepts, "" for none.
func Agree(client []string, offered func(name string) bool) string {
	for _, want := range client {
		if offered(want) {
			return want
		}
	}
	return ""
}

// Reply is the reply to r as a mongos gives it. compressor is the agreed
// one or ""; serviceID is given to a load-balanced client; tv is the
// topologyVersion, with which drivers stream their monitoring.
func Reply(r *Request, lim Limits, connID int64, compressor string, serviceID bson.ObjectID, tv TopologyVersion) bsoncore.Document {
	idx, doc := bsoncore.AppendDocumentStart(make([]byte, 0, 384))
	if r.LegacyName {
		doc = bsoncore.AppendBooleanElement(doc, "ismaster", true)
	} else {
		doc = bsoncore.AppendBooleanElement(doc, "isWritablePrimary", true)
	}
	doc = bsoncore.AppendStringElement(doc, "msg", "isdbgrid")
	doc = bsoncore.AppendInt32Element(doc, "maxBsonObjectSize", lim.MaxBSON)
	doc = bsoncore.AppendInt32Element(doc, "maxMessageSizeBytes", lim.MaxMsg)
	doc = bsoncore.AppendInt32Element(doc, "maxWriteBatchSize", lim.MaxBatch)
	doc = bsoncore.AppendDateTimeElement(doc, "localTime", time.Now().UnixMilli())
	doc = bsoncore.AppendInt32Element(doc, "logicalSessionTimeoutMinutes", lim.SessionTimeoutMin)
	doc = bsoncore.AppendInt64Element(doc, "connectionId", connID)
	doc = bsoncore.AppendInt32Element(doc, "minWireVersion", lim.MinWire)
	doc = bsoncore.AppendInt32Element(doc, "maxWireVersion", lim.MaxWire)
	doc = bsoncore.AppendBooleanElement(doc, "readOnly", false)
	doc = appendVersion(doc, tv)
	if compressor != "" {
		aidx, d := bsoncore.AppendArrayElementStart(doc, "compression")
		d = bsoncore.AppendStringElement(d, "0", compressor)
		doc, _ = bsoncore.AppendArrayEnd(d, aidx)
	}
	if r.HelloOK {
		doc = bsoncore.AppendBooleanElement(doc, "helloOk", true)
	}
	if r.LoadBalanced {
		doc = bsoncore.AppendObjectIDElement(doc, "serviceId", serviceID)
	}
	doc = bsoncore.AppendDoubleElement(doc, "ok", 1)
	doc, _ = bsoncore.AppendDocumentEnd(doc, idx)
	return doc
}

// appendVersion appends the topologyVersion element tv to doc.
func appendVersion(doc []byte, tv TopologyVersion) []byte {
	idx, d := bsoncore.AppendDocumentElementStart(doc, "topologyVersion")
	d = bsoncore.AppendObjectIDElement(d, "processId", tv.ProcessID)
	d = bsoncore.AppendInt64Element(d, "counter", tv.Counter)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// withElements returns doc, a whole document, with the elements add
// appends inserted before its end.
func withElements(doc bsoncore.Document, extra int, add func([]byte) []byte) bsoncore.Document {
	out := make([]byte, 0, len(doc)+extra)
	out = append(out, doc[:len(doc)-1]...)
	out = add(out)
	out = append(out, 0)
	bsoncore.UpdateLength(out, 0, int32(len(out)))
	return out
}
