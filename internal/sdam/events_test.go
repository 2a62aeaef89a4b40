package sdam

import (
	"errors"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

func TestServerDescriptionEqual(t *testing.T) {
	v1, v2 := int64(1), int64(2)
	base := ServerDescription{
		Address: "a:1", Type: RSSecondary, SetName: "rs", Hosts: []string{"a:1", "b:1"},
		Tags: map[string]string{"dc": "x"}, SetVersion: &v1, MaxWireVersion: 21,
		AvgRTT: time.Millisecond, HasRTT: true, LastUpdateTime: testNow,
	}
	same := base
	same.Hosts = []string{"b:1", "a:1"}
	same.SetVersion = &v1
	same.AvgRTT, same.LastUpdateTime = time.Second, testNow.Add(time.Hour)
	same.LastWriteDate = testNow
	if !base.Equal(same) {
		t.Error("RTT, times and host order count for equality")
	}
	for name, change := range map[string]func(*ServerDescription){
		"type":            func(s *ServerDescription) { s.Type = RSOther },
		"error":           func(s *ServerDescription) { s.Error = errors.New("x") },
		"hosts":           func(s *ServerDescription) { s.Hosts = []string{"a:1"} },
		"passives":        func(s *ServerDescription) { s.Passives = []string{"c:1"} },
		"arbiters":        func(s *ServerDescription) { s.Arbiters = []string{"c:1"} },
		"tags":            func(s *ServerDescription) { s.Tags = nil },
		"setVersion":      func(s *ServerDescription) { s.SetVersion = &v2 },
		"electionId":      func(s *ServerDescription) { s.ElectionID = &bson.ObjectID{1} },
		"primary":         func(s *ServerDescription) { s.Primary = "b:1" },
		"me":              func(s *ServerDescription) { s.Me = "a:1" },
		"wire":            func(s *ServerDescription) { s.MinWireVersion = 1 },
		"session timeout": func(s *ServerDescription) { s.LogicalSessionTimeoutMinutes = &v1 },
		"topologyVersion": func(s *ServerDescription) { s.TopologyVersion = &TopologyVersion{} },
	} {
		other := base
		change(&other)
		if base.Equal(other) || other.Equal(base) {
			t.Errorf("a different %s is equal", name)
		}
	}
	e1, e2 := base, base
	e1.Error, e2.Error = errors.New("same"), errors.New("same")
	if !e1.Equal(e2) {
		t.Error("errors with the same message differ")
	}
}

func TestChangeEvents(t *testing.T) {
	cfg := Config{Seeds: []string{"a:1", "b:1"}}
	td := NewTopology(cfg)
	ev := OpeningEvents(td)
	if len(ev) != 4 || ev[0].Type != TopologyOpening || ev[1].Type != TopologyDescriptionChanged ||
		ev[2].Address != "a:1" || ev[3].Address != "b:1" || ev[3].Type != ServerOpening {
		t.Fatalf("opening events %+v", ev)
	}
	// A standalone among two seeds removes itself: its change is reported,
	// then its closing.
	sd := ServerDescription{Address: "a:1", Type: Standalone, MaxWireVersion: 21}
	next := Apply(td, cfg, sd)
	ev = ChangeEvents(td, next, sd)
	if len(ev) != 3 || ev[0].Type != ServerDescriptionChanged || ev[0].NewServer.Type != Standalone ||
		ev[1].Type != ServerClosed || ev[1].Address != "a:1" || ev[2].Type != TopologyDescriptionChanged {
		t.Fatalf("self removal events %+v", ev)
	}
	// A primary adds a server.
	p := primaryDesc("b:1", "b:1", "c:1")
	td, next = next, Apply(next, cfg, p)
	ev = ChangeEvents(td, next, p)
	if len(ev) != 3 || ev[0].Type != ServerDescriptionChanged || ev[1].Type != ServerOpening || ev[1].Address != "c:1" ||
		ev[2].Type != TopologyDescriptionChanged || ev[2].NewTopology.Type != ReplicaSetWithPrimary {
		t.Fatalf("primary events %+v", ev)
	}
	// The same reply again, with a new RTT: nothing to publish.
	p.AvgRTT = time.Hour
	again := Apply(next, cfg, p)
	if ev := ChangeEvents(next, again, p); len(ev) != 0 {
		t.Fatalf("unchanged reply published %+v", ev)
	}
	if s, _ := again.Server("b:1"); s.AvgRTT != time.Hour {
		t.Error("an equal description was not stored (its RTT is lost)")
	}
	for typ := TopologyOpening; typ <= TopologyDescriptionChanged; typ++ {
		if typ.String() == "EventType(?)" {
			t.Errorf("event type %d has no name", typ)
		}
	}
}
