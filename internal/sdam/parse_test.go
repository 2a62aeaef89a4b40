package sdam

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

func doc(t testing.TB, d bson.D) bsoncore.Document {
	t.Helper()
	b, err := bson.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var testNow = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func TestParseServerTypes(t *testing.T) {
	ok := bson.E{Key: "ok", Value: 1}
	set := bson.E{Key: "setName", Value: "rs"}
	for _, tc := range []struct {
		name  string
		hello bson.D
		want  ServerType
	}{
		{"standalone", bson.D{ok, {Key: "isWritablePrimary", Value: true}}, Standalone},
		{"mongos", bson.D{ok, {Key: "msg", Value: "isdbgrid"}}, Mongos},
		{"ghost", bson.D{ok, {Key: "isreplicaset", Value: true}, set}, RSGhost},
		{"primary", bson.D{ok, set, {Key: "isWritablePrimary", Value: true}}, RSPrimary},
		{"legacy primary", bson.D{ok, set, {Key: "ismaster", Value: true}}, RSPrimary},
		{"isWritablePrimary wins over ismaster", bson.D{ok, set, {Key: "isWritablePrimary", Value: false}, {Key: "ismaster", Value: true}, {Key: "secondary", Value: true}}, RSSecondary},
		{"secondary", bson.D{ok, set, {Key: "secondary", Value: true}}, RSSecondary},
		{"hidden secondary", bson.D{ok, set, {Key: "secondary", Value: true}, {Key: "hidden", Value: true}}, RSOther},
		{"arbiter", bson.D{ok, set, {Key: "arbiterOnly", Value: true}}, RSArbiter},
		{"other", bson.D{ok, set}, RSOther},
		{"ok as double", bson.D{{Key: "ok", Value: 1.0}}, Standalone},
		{"ok as int64", bson.D{{Key: "ok", Value: int64(1)}}, Standalone},
		{"ok false", bson.D{{Key: "ok", Value: false}}, Unknown},
		{"ok 0", bson.D{{Key: "ok", Value: 0}, {Key: "isWritablePrimary", Value: true}}, Unknown},
		{"no ok", bson.D{{Key: "isWritablePrimary", Value: true}}, Unknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sd := ParseServerDescription("a:1", doc(t, tc.hello), 5*time.Millisecond, testNow)
			if sd.Type != tc.want {
				t.Fatalf("type %s (error %v), want %s", sd.Type, sd.Error, tc.want)
			}
			if (sd.Type == Unknown) != (sd.Error != nil) {
				t.Errorf("type %s with error %v", sd.Type, sd.Error)
			}
			if sd.HasRTT != (sd.Type != Unknown) || sd.Address != "a:1" || !sd.LastUpdateTime.Equal(testNow) {
				t.Errorf("rtt %v/%v address %q time %v", sd.AvgRTT, sd.HasRTT, sd.Address, sd.LastUpdateTime)
			}
		})
	}
}

func TestParseServerFields(t *testing.T) {
	eid := bson.ObjectID{1, 2, 3}
	pid := bson.ObjectID{9}
	lw := time.Date(2026, 1, 1, 0, 0, 0, int(123*time.Millisecond), time.UTC)
	sd := ParseServerDescription("a:27017", doc(t, bson.D{
		{Key: "ok", Value: 1}, {Key: "isWritablePrimary", Value: true}, {Key: "setName", Value: "rs"},
		{Key: "me", Value: "A:27017"}, {Key: "primary", Value: "A:27017"},
		{Key: "hosts", Value: bson.A{"A:27017", "B"}}, {Key: "passives", Value: bson.A{"[::1]"}},
		{Key: "arbiters", Value: bson.A{"C:3"}}, {Key: "tags", Value: bson.D{{Key: "dc", Value: "east"}}},
		{Key: "setVersion", Value: int64(7)}, {Key: "electionId", Value: eid},
		{Key: "lastWrite", Value: bson.D{{Key: "lastWriteDate", Value: bson.NewDateTimeFromTime(lw)}}},
		{Key: "minWireVersion", Value: 8}, {Key: "maxWireVersion", Value: 25},
		{Key: "logicalSessionTimeoutMinutes", Value: 30}, {Key: "helloOk", Value: true},
		{Key: "topologyVersion", Value: bson.D{{Key: "processId", Value: pid}, {Key: "counter", Value: int64(4)}}},
		{Key: "someFutureField", Value: bson.A{1, "x"}},
	}), time.Millisecond, testNow)
	if sd.Error != nil || sd.Type != RSPrimary {
		t.Fatalf("type %s error %v", sd.Type, sd.Error)
	}
	if sd.Me != "a:27017" || sd.Primary != "a:27017" {
		t.Errorf("me %q primary %q: not lowered", sd.Me, sd.Primary)
	}
	if !slices.Equal(sd.Hosts, []string{"a:27017", "b:27017"}) || !slices.Equal(sd.Passives, []string{"[::1]:27017"}) ||
		!slices.Equal(sd.Arbiters, []string{"c:3"}) {
		t.Errorf("hosts %v passives %v arbiters %v", sd.Hosts, sd.Passives, sd.Arbiters)
	}
	if sd.Tags["dc"] != "east" || len(sd.Tags) != 1 {
		t.Errorf("tags %v", sd.Tags)
	}
	if sd.SetVersion == nil || *sd.SetVersion != 7 || sd.ElectionID == nil || *sd.ElectionID != eid {
		t.Errorf("setVersion %v electionId %v", sd.SetVersion, sd.ElectionID)
	}
	if !sd.LastWriteDate.Equal(lw) {
		t.Errorf("lastWriteDate %v, want %v", sd.LastWriteDate, lw)
	}
	if sd.MinWireVersion != 8 || sd.MaxWireVersion != 25 || !sd.HelloOK {
		t.Errorf("wire %d..%d helloOk %v", sd.MinWireVersion, sd.MaxWireVersion, sd.HelloOK)
	}
	if sd.LogicalSessionTimeoutMinutes == nil || *sd.LogicalSessionTimeoutMinutes != 30 {
		t.Errorf("logicalSessionTimeoutMinutes %v", sd.LogicalSessionTimeoutMinutes)
	}
	if sd.TopologyVersion == nil || *sd.TopologyVersion != (TopologyVersion{ProcessID: pid, Counter: 4}) {
		t.Errorf("topologyVersion %v", sd.TopologyVersion)
	}
	if !sd.HasRTT || sd.AvgRTT != time.Millisecond {
		t.Errorf("rtt %v %v", sd.AvgRTT, sd.HasRTT)
	}
}

func TestParseNulls(t *testing.T) {
	sd := ParseServerDescription("a:1", doc(t, bson.D{
		{Key: "ok", Value: 1}, {Key: "setName", Value: "rs"}, {Key: "secondary", Value: true},
		{Key: "electionId", Value: nil}, {Key: "setVersion", Value: nil},
		{Key: "logicalSessionTimeoutMinutes", Value: nil}, {Key: "topologyVersion", Value: nil},
		{Key: "lastWrite", Value: bson.D{}},
	}), 0, testNow)
	if sd.Error != nil || sd.Type != RSSecondary {
		t.Fatalf("type %s error %v", sd.Type, sd.Error)
	}
	if sd.ElectionID != nil || sd.SetVersion != nil || sd.LogicalSessionTimeoutMinutes != nil ||
		sd.TopologyVersion != nil || !sd.LastWriteDate.IsZero() {
		t.Errorf("nulls not nil: %+v", sd)
	}
}

func TestParseMalformed(t *testing.T) {
	ok := bson.E{Key: "ok", Value: 1}
	for _, tc := range []struct {
		field string
		e     bson.E
	}{
		{"ok", bson.E{Key: "ok", Value: "1"}},
		{"isWritablePrimary", bson.E{Key: "isWritablePrimary", Value: 1}},
		{"ismaster", bson.E{Key: "ismaster", Value: "yes"}},
		{"secondary", bson.E{Key: "secondary", Value: 1}},
		{"arbiterOnly", bson.E{Key: "arbiterOnly", Value: nil}},
		{"hidden", bson.E{Key: "hidden", Value: 1.0}},
		{"isreplicaset", bson.E{Key: "isreplicaset", Value: "true"}},
		{"helloOk", bson.E{Key: "helloOk", Value: 1}},
		{"msg", bson.E{Key: "msg", Value: 1}},
		{"setName", bson.E{Key: "setName", Value: 1}},
		{"me", bson.E{Key: "me", Value: bson.A{"a"}}},
		{"primary", bson.E{Key: "primary", Value: true}},
		{"hosts", bson.E{Key: "hosts", Value: "a:1"}},
		{"hosts[]", bson.E{Key: "hosts", Value: bson.A{"a:1", 2}}},
		{"passives", bson.E{Key: "passives", Value: bson.D{}}},
		{"arbiters[]", bson.E{Key: "arbiters", Value: bson.A{nil}}},
		{"tags", bson.E{Key: "tags", Value: bson.A{}}},
		{"tags.dc", bson.E{Key: "tags", Value: bson.D{{Key: "dc", Value: 1}}}},
		{"minWireVersion", bson.E{Key: "minWireVersion", Value: "8"}},
		{"maxWireVersion", bson.E{Key: "maxWireVersion", Value: int64(1) << 40}},
		{"maxWireVersion", bson.E{Key: "maxWireVersion", Value: 2.5}},
		{"setVersion", bson.E{Key: "setVersion", Value: "1"}},
		{"electionId", bson.E{Key: "electionId", Value: "000000000000000000000001"}},
		{"logicalSessionTimeoutMinutes", bson.E{Key: "logicalSessionTimeoutMinutes", Value: true}},
		{"lastWrite", bson.E{Key: "lastWrite", Value: 1}},
		{"lastWrite.lastWriteDate", bson.E{Key: "lastWrite", Value: bson.D{{Key: "lastWriteDate", Value: int64(1)}}}},
		{"topologyVersion", bson.E{Key: "topologyVersion", Value: "x"}},
		{"topologyVersion.processId", bson.E{Key: "topologyVersion", Value: bson.D{{Key: "counter", Value: int64(1)}}}},
		{"topologyVersion.processId", bson.E{Key: "topologyVersion", Value: bson.D{{Key: "processId", Value: 1}, {Key: "counter", Value: int64(1)}}}},
		{"topologyVersion.counter", bson.E{Key: "topologyVersion", Value: bson.D{{Key: "processId", Value: bson.ObjectID{}}}}},
		{"topologyVersion.counter", bson.E{Key: "topologyVersion", Value: bson.D{{Key: "processId", Value: bson.ObjectID{}}, {Key: "counter", Value: "1"}}}},
		{"code", bson.E{Key: "code", Value: "91"}},
	} {
		t.Run(tc.field, func(t *testing.T) {
			hello := bson.D{tc.e, ok, {Key: "isWritablePrimary", Value: true}, {Key: "setName", Value: "rs"}}
			if tc.field == "ok" {
				hello = hello[:1]
			}
			sd := ParseServerDescription("a:1", doc(t, hello), time.Millisecond, testNow)
			if sd.Type != Unknown || !errors.Is(sd.Error, ErrMalformedHello) {
				t.Fatalf("type %s error %v, want Unknown with a malformed hello error", sd.Type, sd.Error)
			}
			var fe *HelloFieldError
			if !errors.As(sd.Error, &fe) || fe.Field != tc.field {
				t.Errorf("error %v (%T), want a HelloFieldError for %q", sd.Error, sd.Error, tc.field)
			}
			if sd.HasRTT || sd.SetName != "" || sd.Hosts != nil {
				t.Errorf("a malformed reply left fields set: %+v", sd)
			}
		})
	}
}

func TestParseInvalidBSON(t *testing.T) {
	good := doc(t, bson.D{{Key: "ok", Value: 1}, {Key: "hosts", Value: bson.A{"a:1"}}})
	for name, b := range map[string][]byte{
		"empty":     nil,
		"truncated": good[:len(good)-3],
		"length":    append([]byte{0xff, 0xff, 0, 0}, good[4:]...),
		"no end":    append(slices.Clone(good[:len(good)-1]), 1),
	} {
		t.Run(name, func(t *testing.T) {
			sd := ParseServerDescription("a:1", b, 0, testNow)
			if sd.Type != Unknown || !errors.Is(sd.Error, ErrMalformedHello) {
				t.Fatalf("type %s error %v", sd.Type, sd.Error)
			}
		})
	}
}

func TestParseCommandError(t *testing.T) {
	sd := ParseServerDescription("a:1", doc(t, bson.D{
		{Key: "ok", Value: 0}, {Key: "errmsg", Value: "shutting down"}, {Key: "code", Value: 91}, {Key: "codeName", Value: "ShutdownInProgress"},
	}), 0, testNow)
	var ce *HelloCommandError
	if sd.Type != Unknown || !errors.As(sd.Error, &ce) || ce.Code != 91 || errors.Is(sd.Error, ErrMalformedHello) {
		t.Fatalf("type %s error %v", sd.Type, sd.Error)
	}
	if msg := sd.Error.Error(); !strings.Contains(msg, "shutting down") || !strings.Contains(msg, "ShutdownInProgress") {
		t.Errorf("message %q", msg)
	}
	sd = ParseServerDescription("a:1", doc(t, bson.D{{Key: "isWritablePrimary", Value: true}}), 0, testNow)
	if !errors.As(sd.Error, &ce) || !strings.Contains(sd.Error.Error(), "no ok field") {
		t.Errorf("no ok: error %v", sd.Error)
	}
}

func TestNormalizeAddress(t *testing.T) {
	for in, want := range map[string]string{
		"A":                 "a:27017",
		"A:1":               "a:1",
		"[::1]":             "[::1]:27017",
		"[FE80::1]:5":       "[fe80::1]:5",
		"/tmp/Mongo-1.sock": "/tmp/Mongo-1.sock",
		"":                  "",
	} {
		if got := normalizeAddress(in); got != want {
			t.Errorf("normalizeAddress(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestUnknownAndLoadBalancer(t *testing.T) {
	err := errors.New("boom")
	tv := &TopologyVersion{Counter: 3}
	u := UnknownServer("a:1", err, tv)
	if u.Type != Unknown || u.Error != err || u.TopologyVersion != tv || u.HasRTT {
		t.Errorf("%+v", u)
	}
	if lb := LoadBalancerServer("a:1"); lb.Type != LoadBalancer || lb.Address != "a:1" || lb.Error != nil {
		t.Errorf("%+v", lb)
	}
}
