// Making server descriptions: from a hello reply (SDAM "Parsing a hello or
// legacy hello response"), from a failed check, and for a load balancer.

package sdam

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// ErrMalformedHello is matched (errors.Is) by the error of every description
// made from a hello reply that is not valid BSON or has a field of the wrong
// type. Such a reply makes the server Unknown: trusting part of it could put
// a server in the wrong role.
var ErrMalformedHello = errors.New("malformed hello reply")

// HelloFieldError says which field of a hello reply had the wrong type (or
// value). It matches ErrMalformedHello.
type HelloFieldError struct {
	// Field is the path of the field, for example "lastWrite.lastWriteDate".
	Field string
	// Got is the BSON type found (0 when the field is missing); Want says
	// what the field must be.
	Got  bsoncore.Type
	Want string
}

// Error implements error.
func (e *HelloFieldError) Error() string {
	if e.Got == 0 {
		return fmt.Sprintf("malformed hello reply: field %q is missing, want %s", e.Field, e.Want)
	}
	return fmt.Sprintf("malformed hello reply: field %q is %s, want %s", e.Field, e.Got, e.Want)
}

// Is makes errors.Is(err, ErrMalformedHello) true.
func (e *HelloFieldError) Is(target error) bool { return target == ErrMalformedHello }

// HelloCommandError is a hello reply without "ok: 1": the server answered
// but the check failed, so the server is Unknown (and, per server
// monitoring, its pool is cleared like after any failed check).
type HelloCommandError struct {
	Code     int32
	CodeName string
	Message  string
}

// Error implements error.
func (e *HelloCommandError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = "no errmsg"
	}
	if e.CodeName != "" {
		return fmt.Sprintf("hello failed: %s (%s, code %d)", msg, e.CodeName, e.Code)
	}
	return fmt.Sprintf("hello failed: %s (code %d)", msg, e.Code)
}

// ParseServerDescription makes the description of the server at addr from
// its hello (or legacy hello) reply, measured with round trip time rtt (the
// caller's average, see ServerDescription.AvgRTT) and made at now.
//
// A reply without "ok: 1" gives an Unknown description whose Error is a
// *HelloCommandError. A reply that is not valid BSON, or has a field of the
// wrong type, gives an Unknown description whose Error matches
// ErrMalformedHello; it never panics. Host names in me, hosts, passives,
// arbiters and primary are lowered, so they compare equal to the lowered
// seeds and addresses the topology keeps.
func ParseServerDescription(addr string, hello bsoncore.Document, rtt time.Duration, now time.Time) ServerDescription {
	sd, err := parseHello(addr, hello)
	if err != nil {
		return ServerDescription{Address: addr, Type: Unknown, Error: err, LastUpdateTime: now}
	}
	sd.LastUpdateTime = now
	if sd.Type != Unknown {
		sd.AvgRTT, sd.HasRTT = rtt, true
	}
	return sd
}

// UnknownServer is the description of a server whose check failed with err,
// or that an application error marked Unknown; tv is the topologyVersion of
// a state change error, nil otherwise.
func UnknownServer(addr string, err error, tv *TopologyVersion) ServerDescription {
	return ServerDescription{Address: addr, Type: Unknown, Error: err, TopologyVersion: tv}
}

// LoadBalancerServer is the description of the server of a LoadBalanced
// topology. A load balancer is never checked (the load balancer spec): the
// caller applies this description once, right after NewTopology.
func LoadBalancerServer(addr string) ServerDescription {
	return ServerDescription{Address: addr, Type: LoadBalancer}
}

// helloFields holds what the type derivation needs besides the description.
type helloFields struct {
	ok                                  bool
	okSeen                              bool
	writablePrimary, writablePrimarySet bool
	ismaster                            bool
	secondary, arbiterOnly, hidden      bool
	isReplicaSet                        bool
	msg                                 string
	errmsg, codeName                    string
	code                                int32
}

func parseHello(addr string, hello bsoncore.Document) (ServerDescription, error) {
	sd := ServerDescription{Address: addr}
	if err := hello.Validate(); err != nil {
		return sd, fmt.Errorf("%w: %v", ErrMalformedHello, err)
	}
	elems, err := hello.Elements()
	if err != nil {
		return sd, fmt.Errorf("%w: %v", ErrMalformedHello, err)
	}
	var f helloFields
	for _, e := range elems {
		if err := parseField(&sd, &f, e.Key(), e.Value()); err != nil {
			return ServerDescription{Address: addr}, err
		}
	}
	if !f.ok {
		e := &HelloCommandError{Code: f.code, CodeName: f.codeName, Message: f.errmsg}
		if !f.okSeen {
			e.Message = "reply has no ok field"
		}
		return ServerDescription{Address: addr}, e
	}
	primary := f.ismaster
	if f.writablePrimarySet {
		primary = f.writablePrimary
	}
	switch {
	case f.isReplicaSet:
		sd.Type = RSGhost
	case sd.SetName != "":
		switch {
		case primary:
			sd.Type = RSPrimary
		case f.hidden:
			sd.Type = RSOther
		case f.secondary:
			sd.Type = RSSecondary
		case f.arbiterOnly:
			sd.Type = RSArbiter
		default:
			sd.Type = RSOther
		}
	case f.msg == "isdbgrid":
		sd.Type = Mongos
	default:
		sd.Type = Standalone
	}
	return sd, nil
}

// parseField reads one top-level field of a hello reply. Unknown fields are
// ignored: servers add fields, and a reply must not fail for that.
func parseField(sd *ServerDescription, f *helloFields, key string, v bsoncore.Value) error {
	var err error
	switch key {
	case "ok":
		f.okSeen = true
		f.ok, err = okValue(key, v)
	case "isWritablePrimary":
		f.writablePrimary, err = boolValue(key, v)
		f.writablePrimarySet = true
	case "ismaster":
		f.ismaster, err = boolValue(key, v)
	case "secondary":
		f.secondary, err = boolValue(key, v)
	case "arbiterOnly":
		f.arbiterOnly, err = boolValue(key, v)
	case "hidden":
		f.hidden, err = boolValue(key, v)
	case "isreplicaset":
		f.isReplicaSet, err = boolValue(key, v)
	case "helloOk":
		sd.HelloOK, err = boolValue(key, v)
	case "msg":
		f.msg, err = stringValue(key, v)
	case "errmsg":
		f.errmsg, err = stringValue(key, v)
	case "codeName":
		f.codeName, err = stringValue(key, v)
	case "code":
		f.code, err = int32Value(key, v)
	case "setName":
		sd.SetName, err = stringValue(key, v)
	case "me":
		sd.Me, err = stringValue(key, v)
		sd.Me = normalizeAddress(sd.Me)
	case "primary":
		sd.Primary, err = stringValue(key, v)
		sd.Primary = normalizeAddress(sd.Primary)
	case "hosts":
		sd.Hosts, err = addressList(key, v)
	case "passives":
		sd.Passives, err = addressList(key, v)
	case "arbiters":
		sd.Arbiters, err = addressList(key, v)
	case "tags":
		sd.Tags, err = tagsValue(key, v)
	case "minWireVersion":
		sd.MinWireVersion, err = int32Value(key, v)
	case "maxWireVersion":
		sd.MaxWireVersion, err = int32Value(key, v)
	case "setVersion":
		sd.SetVersion, err = optionalInt64(key, v)
	case "logicalSessionTimeoutMinutes":
		sd.LogicalSessionTimeoutMinutes, err = optionalInt64(key, v)
	case "electionId":
		sd.ElectionID, err = optionalObjectID(key, v)
	case "lastWrite":
		sd.LastWriteDate, err = lastWriteDate(key, v)
	case "topologyVersion":
		sd.TopologyVersion, err = ParseTopologyVersion(v)
	}
	return err
}

// ParseTopologyVersion reads a topologyVersion field (of a hello reply or of
// a state change error): a document {processId: ObjectId, counter: int64}.
// Null gives nil; anything else malformed gives an error matching
// ErrMalformedHello.
func ParseTopologyVersion(v bsoncore.Value) (*TopologyVersion, error) {
	const key = "topologyVersion"
	if v.Type == bsoncore.TypeNull {
		return nil, nil
	}
	doc, ok := v.DocumentOK()
	if !ok {
		return nil, &HelloFieldError{Field: key, Got: v.Type, Want: "a document"}
	}
	pid, err := doc.LookupErr("processId")
	if err != nil {
		return nil, &HelloFieldError{Field: key + ".processId", Got: 0, Want: "an ObjectId"}
	}
	oid, ok := pid.ObjectIDOK()
	if !ok {
		return nil, &HelloFieldError{Field: key + ".processId", Got: pid.Type, Want: "an ObjectId"}
	}
	cv, err := doc.LookupErr("counter")
	if err != nil {
		return nil, &HelloFieldError{Field: key + ".counter", Got: 0, Want: "an integer"}
	}
	counter, err := int64Value(key+".counter", cv)
	if err != nil {
		return nil, err
	}
	return &TopologyVersion{ProcessID: bson.ObjectID(oid), Counter: counter}, nil
}

// okValue accepts what servers send for ok: a number (1 or 0) or, from
// some old servers and proxies, a boolean.
func okValue(key string, v bsoncore.Value) (bool, error) {
	switch v.Type {
	case bsoncore.TypeDouble, bsoncore.TypeInt32, bsoncore.TypeInt64:
		n, _ := v.AsFloat64OK()
		return n == 1, nil
	case bsoncore.TypeBoolean:
		return v.Boolean(), nil
	}
	return false, &HelloFieldError{Field: key, Got: v.Type, Want: "a number"}
}

func boolValue(key string, v bsoncore.Value) (bool, error) {
	b, ok := v.BooleanOK()
	if !ok {
		return false, &HelloFieldError{Field: key, Got: v.Type, Want: "a boolean"}
	}
	return b, nil
}

func stringValue(key string, v bsoncore.Value) (string, error) {
	s, ok := v.StringValueOK()
	if !ok {
		return "", &HelloFieldError{Field: key, Got: v.Type, Want: "a string"}
	}
	return s, nil
}

// int64Value accepts int32, int64 and a double holding an integer (the
// shell and some drivers write numbers as doubles).
func int64Value(key string, v bsoncore.Value) (int64, error) {
	switch v.Type {
	case bsoncore.TypeInt32:
		return int64(v.Int32()), nil
	case bsoncore.TypeInt64:
		return v.Int64(), nil
	case bsoncore.TypeDouble:
		d := v.Double()
		if d == math.Trunc(d) && d >= math.MinInt64 && d < math.MaxInt64 {
			return int64(d), nil
		}
	}
	return 0, &HelloFieldError{Field: key, Got: v.Type, Want: "an integer"}
}

func int32Value(key string, v bsoncore.Value) (int32, error) {
	n, err := int64Value(key, v)
	if err != nil {
		return 0, err
	}
	if n < math.MinInt32 || n > math.MaxInt32 {
		return 0, &HelloFieldError{Field: key, Got: v.Type, Want: "a 32-bit integer"}
	}
	return int32(n), nil
}

func optionalInt64(key string, v bsoncore.Value) (*int64, error) {
	if v.Type == bsoncore.TypeNull {
		return nil, nil
	}
	n, err := int64Value(key, v)
	if err != nil {
		return nil, err
	}
	return &n, nil
}

func optionalObjectID(key string, v bsoncore.Value) (*bson.ObjectID, error) {
	if v.Type == bsoncore.TypeNull {
		return nil, nil
	}
	oid, ok := v.ObjectIDOK()
	if !ok {
		return nil, &HelloFieldError{Field: key, Got: v.Type, Want: "an ObjectId"}
	}
	id := bson.ObjectID(oid)
	return &id, nil
}

func addressList(key string, v bsoncore.Value) ([]string, error) {
	arr, ok := v.ArrayOK()
	if !ok {
		return nil, &HelloFieldError{Field: key, Got: v.Type, Want: "an array of strings"}
	}
	vals, err := arr.Values()
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrMalformedHello, key, err)
	}
	out := make([]string, 0, len(vals))
	for _, hv := range vals {
		s, ok := hv.StringValueOK()
		if !ok {
			return nil, &HelloFieldError{Field: key + "[]", Got: hv.Type, Want: "a string"}
		}
		out = append(out, normalizeAddress(s))
	}
	return out, nil
}

func tagsValue(key string, v bsoncore.Value) (map[string]string, error) {
	doc, ok := v.DocumentOK()
	if !ok {
		return nil, &HelloFieldError{Field: key, Got: v.Type, Want: "a document of strings"}
	}
	elems, err := doc.Elements()
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrMalformedHello, key, err)
	}
	tags := make(map[string]string, len(elems))
	for _, e := range elems {
		s, ok := e.Value().StringValueOK()
		if !ok {
			return nil, &HelloFieldError{Field: key + "." + e.Key(), Got: e.Value().Type, Want: "a string"}
		}
		tags[e.Key()] = s
	}
	return tags, nil
}

func lastWriteDate(key string, v bsoncore.Value) (time.Time, error) {
	doc, ok := v.DocumentOK()
	if !ok {
		return time.Time{}, &HelloFieldError{Field: key, Got: v.Type, Want: "a document"}
	}
	d, err := doc.LookupErr("lastWriteDate")
	if err != nil {
		return time.Time{}, nil
	}
	ms, ok := d.DateTimeOK()
	if !ok {
		return time.Time{}, &HelloFieldError{Field: key + ".lastWriteDate", Got: d.Type, Want: "a date"}
	}
	return time.UnixMilli(ms).UTC(), nil
}

// normalizeAddress lowers a host:port (RFC 4343: host names are case
// insensitive) and gives a bare host the default port, so the same server
// always has the same address string. Unix socket paths are kept as they
// are: a path is case sensitive.
func normalizeAddress(s string) string {
	if s == "" || strings.HasSuffix(s, ".sock") {
		return s
	}
	s = strings.ToLower(s)
	if strings.HasPrefix(s, "[") {
		if strings.HasSuffix(s, "]") {
			return s + ":27017"
		}
		return s
	}
	if !strings.Contains(s, ":") {
		return s + ":27017"
	}
	return s
}
