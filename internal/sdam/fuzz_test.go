package sdam

import (
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// FuzzParseServerDescription feeds arbitrary bytes as a hello reply: the
// parser must never panic, must make an Unknown description exactly when it
// reports an error, and the topology rules must digest whatever it makes in
// every kind of topology, keeping the servers sorted and unique.
func FuzzParseServerDescription(f *testing.F) {
	eid := bson.ObjectID{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2}
	tv := bson.D{{Key: "processId", Value: bson.ObjectID{1}}, {Key: "counter", Value: int64(2)}}
	for _, d := range []bson.D{
		{{Key: "ok", Value: 1}, {Key: "isWritablePrimary", Value: true}, {Key: "maxWireVersion", Value: 21}},
		{{Key: "ok", Value: 1}, {Key: "msg", Value: "isdbgrid"}, {Key: "maxWireVersion", Value: 21}},
		{{Key: "ok", Value: 1}, {Key: "isWritablePrimary", Value: true}, {Key: "setName", Value: "rs"},
			{Key: "hosts", Value: bson.A{"a:1", "B:2"}}, {Key: "passives", Value: bson.A{"c:3"}}, {Key: "arbiters", Value: bson.A{"d:4"}},
			{Key: "setVersion", Value: 3}, {Key: "electionId", Value: eid}, {Key: "maxWireVersion", Value: 21},
			{Key: "topologyVersion", Value: tv}, {Key: "logicalSessionTimeoutMinutes", Value: 30}},
		{{Key: "ok", Value: 1}, {Key: "secondary", Value: true}, {Key: "setName", Value: "rs"}, {Key: "me", Value: "e:5"},
			{Key: "primary", Value: "b:2"}, {Key: "hosts", Value: bson.A{"a:1", "b:2"}}, {Key: "tags", Value: bson.D{{Key: "dc", Value: "x"}}},
			{Key: "lastWrite", Value: bson.D{{Key: "lastWriteDate", Value: bson.DateTime(1700000000000)}}}},
		{{Key: "ok", Value: 1}, {Key: "isreplicaset", Value: true}},
		{{Key: "ok", Value: 1}, {Key: "arbiterOnly", Value: true}, {Key: "setName", Value: "other"}},
		{{Key: "ok", Value: 0}, {Key: "errmsg", Value: "not master"}, {Key: "code", Value: 10107}, {Key: "topologyVersion", Value: tv}},
		{{Key: "ok", Value: 1}, {Key: "writeConcernError", Value: bson.D{{Key: "code", Value: 91}, {Key: "errmsg", Value: "x"}}}},
		{{Key: "ok", Value: 1}, {Key: "hosts", Value: "a:1"}},
	} {
		b, err := bson.Marshal(d)
		if err != nil {
			f.Fatal(err)
		}
		f.Add([]byte(b))
	}
	f.Add([]byte{})
	f.Add([]byte{5, 0, 0, 0, 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0x7f, 3, 'a', 0})

	configs := []Config{
		{Seeds: []string{"a:1"}},
		{Seeds: []string{"a:1", "b:2"}},
		{Seeds: []string{"a:1", "b:2"}, SetName: "rs"},
		{Seeds: []string{"a:1"}, DirectConnection: true, SetName: "rs"},
		{Seeds: []string{"a:1"}, LoadBalanced: true},
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		sd := ParseServerDescription("a:1", data, time.Millisecond, testNow)
		if (sd.Type == Unknown) != (sd.Error != nil) {
			t.Fatalf("type %s with error %v", sd.Type, sd.Error)
		}
		if sd.Error != nil && sd.Error.Error() == "" {
			t.Fatal("empty error message")
		}
		for _, h := range slices.Concat(sd.Hosts, sd.Passives, sd.Arbiters, []string{sd.Me, sd.Primary}) {
			if !strings.HasSuffix(h, ".sock") && h != strings.ToLower(h) {
				t.Fatalf("address %q not lowered", h)
			}
		}
		for _, cfg := range configs {
			td := NewTopology(cfg)
			next := Apply(td, cfg, sd)
			checkTopologyInvariants(t, next)
			_ = ChangeEvents(td, next, sd)
			// A second member's view on top of the first.
			other := sd
			other.Address = "b:2"
			next2 := Apply(next, cfg, other)
			checkTopologyInvariants(t, next2)
		}
		if e, ok := CommandErrorFromReply(data); ok {
			_ = HandleAppError(sd, ReplicaSetWithPrimary, 0, e)
		}
	})
}

func checkTopologyInvariants(t *testing.T, td TopologyDescription) {
	t.Helper()
	if !slices.IsSortedFunc(td.Servers, func(a, b ServerDescription) int { return strings.Compare(a.Address, b.Address) }) {
		t.Fatalf("servers not sorted: %v", td.Servers)
	}
	for i := 1; i < len(td.Servers); i++ {
		if td.Servers[i].Address == td.Servers[i-1].Address {
			t.Fatalf("server %s twice", td.Servers[i].Address)
		}
	}
	if td.Type == Single && len(td.Servers) != 1 {
		t.Fatalf("Single with %d servers", len(td.Servers))
	}
	primaries := 0
	for _, s := range td.Servers {
		if s.Type == RSPrimary {
			primaries++
		}
	}
	// Single and LoadBalanced keep whatever their one server is.
	multi := td.Type != Single && td.Type != LoadBalanced
	if primaries > 1 || multi && (td.Type == ReplicaSetWithPrimary) != (primaries == 1) {
		t.Fatalf("type %s with %d primaries", td.Type, primaries)
	}
}
