package sdam

import (
	"errors"
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

// FuzzApply drives the state machine with sequences of well-formed but
// arbitrary descriptions (the kind of input the hello parser lets through),
// from every kind of initial topology, and checks what must hold after
// every step whatever the replies were.
func FuzzApply(f *testing.F) {
	f.Add([]byte{0, 3, 0, 0b00111, 1, 1, 1, 4, 0, 0b00111, 0, 1})
	f.Add([]byte{0, 4, 0, 0b11111, 0, 0, 2, 3, 0, 0b00011, 2, 2, 0, 3, 0, 0b00001, 1, 3})
	f.Add([]byte{1, 2, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 3, 7, 1, 0b00100, 9, 9})
	// Found by fuzzing: a LoadBalancer description outside a LoadBalanced
	// topology stayed in the replica set that topology became.
	f.Add([]byte("8Y0000200200"))
	addrs := []string{"a:1", "b:1", "c:1", "d:1", "e:1"}
	types := []ServerType{Unknown, Standalone, Mongos, RSPrimary, RSSecondary, RSArbiter, RSOther, RSGhost, LoadBalancer}
	configs := []Config{
		{Seeds: []string{"a:1"}},
		{Seeds: []string{"a:1", "b:1"}},
		{Seeds: []string{"a:1", "b:1"}, SetName: "rs"},
		{Seeds: []string{"a:1"}, DirectConnection: true, SetName: "rs"},
		{Seeds: []string{"a:1"}, LoadBalanced: true},
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		const step = 6
		for _, cfg := range configs {
			td := NewTopology(cfg)
			for i := 0; i+step <= len(data) && i < 30*step; i += step {
				b := data[i : i+step]
				sd := ServerDescription{
					Address:        addrs[int(b[0])%len(addrs)],
					Type:           types[int(b[1])%len(types)],
					MaxWireVersion: []int32{8, 17, 21, 7}[int(b[1]>>4)%4],
					SetName:        []string{"rs", "rs", "other", ""}[int(b[2])%4],
				}
				switch {
				case sd.Type == Unknown:
					sd.Error = errors.New("check failed")
				case sd.Type.IsReplicaSetMember() && sd.Type != RSGhost && sd.SetName == "":
					sd.SetName = "rs" // the parser makes no member without a set name
				}
				for j, a := range addrs {
					if b[3]&(1<<j) != 0 {
						sd.Hosts = append(sd.Hosts, a)
					}
				}
				if b[2]&0x10 != 0 {
					sd.Me = addrs[int(b[2]>>5)%len(addrs)]
				}
				if b[3]&0x80 != 0 {
					sd.Primary = addrs[int(b[3]>>5)%len(addrs)]
				}
				if b[4] != 0 {
					sd.ElectionID = &bson.ObjectID{11: b[4]}
				}
				if b[5] != 0 {
					v := int64(b[5] % 8)
					sd.SetVersion = &v
					if b[5]&0x80 != 0 {
						lstm := int64(b[5] % 16)
						sd.LogicalSessionTimeoutMinutes = &lstm
					}
				}
				next := Apply(td, cfg, sd)
				checkTopologyInvariants(t, next)
				checkStateInvariants(t, cfg, next)
				_ = ChangeEvents(td, next, sd)
				td = next
			}
		}
	})
}

// checkStateInvariants checks what the rules guarantee of a topology of
// each type, and recomputes the session timeout independently.
func checkStateInvariants(t *testing.T, cfg Config, td TopologyDescription) {
	t.Helper()
	for _, s := range td.Servers {
		switch td.Type {
		case ReplicaSetNoPrimary, ReplicaSetWithPrimary:
			if s.Type == Standalone || s.Type == Mongos || s.Type == LoadBalancer {
				t.Fatalf("%s in %s", s.Type, td.Type)
			}
			if s.Type.IsReplicaSetMember() && s.Type != RSGhost && s.SetName != td.SetName {
				t.Fatalf("member of %q in replica set %q", s.SetName, td.SetName)
			}
		case Sharded:
			if s.Type != Unknown && s.Type != Mongos && s.Type != RSGhost {
				t.Fatalf("%s in Sharded", s.Type)
			}
		case LoadBalanced:
			if s.Type != LoadBalancer && s.Type != Unknown {
				t.Fatalf("%s in LoadBalanced", s.Type)
			}
		}
	}
	if cfg.SetName != "" && td.SetName != cfg.SetName {
		t.Fatalf("set name %q, configured %q", td.SetName, cfg.SetName)
	}
	var want *int64
	for _, s := range td.Servers {
		if !s.Type.DataBearing() {
			continue
		}
		if s.LogicalSessionTimeoutMinutes == nil {
			want = nil
			break
		}
		if want == nil || *s.LogicalSessionTimeoutMinutes < *want {
			want = s.LogicalSessionTimeoutMinutes
		}
	}
	if !equalPtr(want, td.LogicalSessionTimeoutMinutes) {
		t.Fatalf("logicalSessionTimeoutMinutes %v, want %v", fmtPtr(td.LogicalSessionTimeoutMinutes), fmtPtr(want))
	}
}
