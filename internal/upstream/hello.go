package upstream

import (
	"fmt"
	"runtime"
	"unicode/utf8"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Version is the driver version mongobouncer reports in the client metadata
// of its handshakes. Builds may set it with -ldflags -X.
var Version = "0.1.0-dev"

// maxAppNameLen is the handshake spec's limit on application.name, in bytes.
const maxAppNameLen = 128

// TopologyVersion is the hello field that awaitable hello and SDAM use to
// order topology changes.
type TopologyVersion struct {
	// ProcessID identifies the server process.
	ProcessID bson.ObjectID
	// Counter increases with each topology change within the process.
	Counter int64
}

// Hello is what an upstream said in reply to the handshake hello. Fields the
// server omitted keep their zero value; Raw has everything.
type Hello struct {
	IsWritablePrimary bool
	Secondary         bool
	ArbiterOnly       bool
	ReadOnly          bool
	HelloOk           bool
	Msg               string
	SetName           string
	Hosts             []string
	Passives          []string
	Arbiters          []string
	Primary           string
	Me                string

	MinWireVersion      int32
	MaxWireVersion      int32
	MaxBSONObjectSize   int32
	MaxMessageSizeBytes int32
	MaxWriteBatchSize   int32
	// LogicalSessionTimeoutMinutes is nil when the server does not support
	// sessions.
	LogicalSessionTimeoutMinutes *int32
	ConnectionID                 int64

	// ServiceID is set, and HasServiceID true, when the server sent a
	// serviceId (load-balanced mode).
	ServiceID    bson.ObjectID
	HasServiceID bool

	// Compression is the server's list of accepted compressors, as it sent
	// it (a server lists them in the client's order, but the client's
	// order decides, not this one).
	Compression        []string
	SaslSupportedMechs []string
	// SpeculativeAuthenticate is the server's answer to the
	// speculativeAuthenticate of the handshake (the first step of the
	// authentication conversation), nil when it gave none.
	SpeculativeAuthenticate bsoncore.Document
	// TopologyVersion is nil when the server did not send one.
	TopologyVersion *TopologyVersion

	// Raw is the whole reply, an owned copy.
	Raw bsoncore.Document
}

// ParseHello decodes a hello reply, from a handshake or a monitoring check. raw must be a validated document; it is
// retained, so the caller passes an owned copy. Fields with an unexpected
// type are an error rather than silently zero: a server that says something
// we misread is worse than one we refuse.
func ParseHello(raw bsoncore.Document) (*Hello, error) {
	h := &Hello{Raw: raw}
	elems, err := raw.Elements()
	if err != nil {
		return nil, err
	}
	for _, e := range elems {
		v := e.Value()
		key := e.Key()
		var ok = true
		switch key {
		case "isWritablePrimary", "ismaster":
			// Either spelling; hello uses the first, legacy isMaster the second.
			var b bool
			b, ok = v.BooleanOK()
			h.IsWritablePrimary = h.IsWritablePrimary || b
		case "secondary":
			h.Secondary, ok = v.BooleanOK()
		case "arbiterOnly":
			h.ArbiterOnly, ok = v.BooleanOK()
		case "readOnly":
			h.ReadOnly, ok = v.BooleanOK()
		case "helloOk":
			h.HelloOk, ok = v.BooleanOK()
		case "msg":
			h.Msg, ok = v.StringValueOK()
		case "setName":
			h.SetName, ok = v.StringValueOK()
		case "primary":
			h.Primary, ok = v.StringValueOK()
		case "me":
			h.Me, ok = v.StringValueOK()
		case "hosts":
			h.Hosts, ok = stringArray(v)
		case "passives":
			h.Passives, ok = stringArray(v)
		case "arbiters":
			h.Arbiters, ok = stringArray(v)
		case "compression":
			h.Compression, ok = stringArray(v)
		case "saslSupportedMechs":
			h.SaslSupportedMechs, ok = stringArray(v)
		case "speculativeAuthenticate":
			h.SpeculativeAuthenticate, ok = v.DocumentOK()
		case "minWireVersion":
			h.MinWireVersion, ok = int32Value(v)
		case "maxWireVersion":
			h.MaxWireVersion, ok = int32Value(v)
		case "maxBsonObjectSize":
			h.MaxBSONObjectSize, ok = int32Value(v)
		case "maxMessageSizeBytes":
			h.MaxMessageSizeBytes, ok = int32Value(v)
		case "maxWriteBatchSize":
			h.MaxWriteBatchSize, ok = int32Value(v)
		case "logicalSessionTimeoutMinutes":
			if v.Type == bsoncore.TypeNull {
				break
			}
			var m int32
			if m, ok = int32Value(v); ok {
				h.LogicalSessionTimeoutMinutes = &m
			}
		case "connectionId":
			h.ConnectionID, ok = v.AsInt64OK()
		case "serviceId":
			var oid bson.ObjectID
			if oid, ok = v.ObjectIDOK(); ok {
				h.ServiceID, h.HasServiceID = oid, true
			}
		case "topologyVersion":
			h.TopologyVersion, ok = topologyVersion(v)
		}
		if !ok {
			return nil, fmt.Errorf("hello reply field %q has unexpected type %s", key, v.Type)
		}
	}
	return h, nil
}

// int32Value accepts any BSON number that fits an int32 exactly: servers
// send int32, but some implementations send doubles or int64s.
func int32Value(v bsoncore.Value) (int32, bool) {
	switch v.Type {
	case bsoncore.TypeInt32:
		return v.Int32OK()
	case bsoncore.TypeInt64:
		n, ok := v.Int64OK()
		if !ok || n != int64(int32(n)) {
			return 0, false
		}
		return int32(n), true
	case bsoncore.TypeDouble:
		f, ok := v.DoubleOK()
		if !ok || f != float64(int32(f)) {
			return 0, false
		}
		return int32(f), true
	}
	return 0, false
}

func stringArray(v bsoncore.Value) ([]string, bool) {
	arr, ok := v.ArrayOK()
	if !ok {
		return nil, false
	}
	vals, err := arr.Values()
	if err != nil {
		return nil, false
	}
	out := make([]string, 0, len(vals))
	for _, x := range vals {
		s, ok := x.StringValueOK()
		if !ok {
			return nil, false
		}
		out = append(out, s)
	}
	return out, true
}

// ParseTopologyVersion reads a topologyVersion document ({processId,
// counter}), as hello replies and state-change error replies carry it; nil
// when it is malformed.
func ParseTopologyVersion(doc bsoncore.Document) *TopologyVersion {
	tv, _ := topologyVersion(bsoncore.Value{Type: bsoncore.TypeEmbeddedDocument, Data: doc})
	return tv
}

func topologyVersion(v bsoncore.Value) (*TopologyVersion, bool) {
	doc, ok := v.DocumentOK()
	if !ok {
		return nil, false
	}
	var tv TopologyVersion
	if tv.ProcessID, ok = doc.Lookup("processId").ObjectIDOK(); !ok {
		return nil, false
	}
	if tv.Counter, ok = doc.Lookup("counter").AsInt64OK(); !ok {
		return nil, false
	}
	return &tv, true
}

// buildHello builds the handshake command, without $db (RoundTrip adds it).
// It is the same for every connection of a Dialer, so it is built once.
func buildHello(o *Options) bsoncore.Document {
	app := truncateUTF8(o.AppName, maxAppNameLen)
	client := bsoncore.NewDocumentBuilder().
		AppendDocument("application", bsoncore.NewDocumentBuilder().AppendString("name", app).Build()).
		AppendDocument("driver", bsoncore.NewDocumentBuilder().
			AppendString("name", "mongobouncer").
			AppendString("version", Version).Build()).
		AppendDocument("os", bsoncore.NewDocumentBuilder().
			AppendString("type", runtime.GOOS).
			AppendString("architecture", runtime.GOARCH).Build()).
		AppendString("platform", runtime.Version()).
		Build()
	b := bsoncore.NewDocumentBuilder().
		AppendInt32("hello", 1).
		AppendBoolean("helloOk", true).
		AppendDocument("client", client)
	if len(o.Compressors) > 0 {
		arr := bsoncore.NewArrayBuilder()
		for _, c := range o.Compressors {
			arr.AppendString(c)
		}
		b.AppendArray("compression", arr.Build())
	}
	if o.LoadBalanced {
		b.AppendBoolean("loadBalanced", true)
	}
	return b.Build()
}

// truncateUTF8 cuts s to at most n bytes without splitting a rune.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
