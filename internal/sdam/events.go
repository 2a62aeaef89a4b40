// SDAM monitoring as data: the spec's Server Description Equality, the
// difference between two TopologyDescriptions, and the SDAM events a change
// publishes, in the order the monitoring suite expects. The caller turns
// the events into logs or metrics; this package publishes nothing.

package sdam

import (
	"maps"
	"slices"
)

// Equal is the spec's Server Description Equality: two descriptions are
// equal when the fields the spec marks (=) are: error, type, wire versions,
// me, hosts, passives, arbiters (as sets), tags, setName, electionId,
// setVersion, primary, logicalSessionTimeoutMinutes and topologyVersion.
// Round trip time and update times are not compared, so a routine check
// that changes nothing publishes no event. Errors compare by message.
func (s ServerDescription) Equal(o ServerDescription) bool {
	return s.Address == o.Address &&
		s.Type == o.Type &&
		errorText(s.Error) == errorText(o.Error) && (s.Error == nil) == (o.Error == nil) &&
		s.MinWireVersion == o.MinWireVersion && s.MaxWireVersion == o.MaxWireVersion &&
		s.Me == o.Me &&
		sameSet(s.Hosts, o.Hosts) && sameSet(s.Passives, o.Passives) && sameSet(s.Arbiters, o.Arbiters) &&
		maps.Equal(s.Tags, o.Tags) &&
		s.SetName == o.SetName &&
		equalPtr(s.ElectionID, o.ElectionID) &&
		equalPtr(s.SetVersion, o.SetVersion) &&
		s.Primary == o.Primary &&
		equalPtr(s.LogicalSessionTimeoutMinutes, o.LogicalSessionTimeoutMinutes) &&
		equalPtr(s.TopologyVersion, o.TopologyVersion)
}

// Equal reports whether two TopologyDescriptions are the same for
// monitoring: same type, set name, newest (electionId, setVersion),
// compatibility, session timeout, and the same servers by Server
// Description Equality. An unchanged topology publishes no
// topologyDescriptionChanged event.
func (t TopologyDescription) Equal(o TopologyDescription) bool {
	return t.Type == o.Type &&
		t.SetName == o.SetName &&
		equalPtr(t.MaxSetVersion, o.MaxSetVersion) &&
		equalPtr(t.MaxElectionID, o.MaxElectionID) &&
		errorText(t.CompatibilityError) == errorText(o.CompatibilityError) &&
		equalPtr(t.LogicalSessionTimeoutMinutes, o.LogicalSessionTimeoutMinutes) &&
		slices.EqualFunc(t.Servers, o.Servers, ServerDescription.Equal)
}

// TopologyDiff is how the servers of a topology changed, by address, each
// list sorted.
type TopologyDiff struct {
	// Added servers must be monitored; Removed ones must have their
	// monitor stopped and their pool closed.
	Added, Removed []string
	// Changed servers are in both, with descriptions not Equal.
	Changed []string
}

// Diff compares the servers of prev and next.
func Diff(prev, next TopologyDescription) TopologyDiff {
	var d TopologyDiff
	for _, s := range next.Servers {
		old, ok := prev.Server(s.Address)
		switch {
		case !ok:
			d.Added = append(d.Added, s.Address)
		case !old.Equal(s):
			d.Changed = append(d.Changed, s.Address)
		}
	}
	for _, s := range prev.Servers {
		if !next.has(s.Address) {
			d.Removed = append(d.Removed, s.Address)
		}
	}
	slices.Sort(d.Added)
	slices.Sort(d.Removed)
	slices.Sort(d.Changed)
	return d
}

// EventType names an SDAM monitoring event.
type EventType int

// The SDAM events this package produces (heartbeat events belong to the
// monitor, and topologyClosed to whoever closes the topology).
const (
	TopologyOpening EventType = iota + 1
	ServerOpening
	ServerDescriptionChanged
	ServerClosed
	TopologyDescriptionChanged
)

var eventTypeNames = [...]string{
	TopologyOpening:            "topologyOpeningEvent",
	ServerOpening:              "serverOpeningEvent",
	ServerDescriptionChanged:   "serverDescriptionChangedEvent",
	ServerClosed:               "serverClosedEvent",
	TopologyDescriptionChanged: "topologyDescriptionChangedEvent",
}

// String returns the event's name in the monitoring specification.
func (t EventType) String() string {
	if t > 0 && int(t) < len(eventTypeNames) {
		return eventTypeNames[t]
	}
	return "EventType(?)"
}

// Event is one SDAM monitoring event. Address is set for the server
// events; PreviousServer and NewServer for ServerDescriptionChanged;
// PreviousTopology and NewTopology for TopologyDescriptionChanged.
type Event struct {
	Type                          EventType
	Address                       string
	PreviousServer, NewServer     ServerDescription
	PreviousTopology, NewTopology TopologyDescription
}

// OpeningEvents are the events of a topology's construction: it opens, its
// description changes from the empty Unknown one to td, and each of its
// servers opens.
func OpeningEvents(td TopologyDescription) []Event {
	ev := []Event{
		{Type: TopologyOpening},
		{Type: TopologyDescriptionChanged, PreviousTopology: TopologyDescription{}, NewTopology: td},
	}
	for _, s := range td.Servers {
		ev = append(ev, Event{Type: ServerOpening, Address: s.Address})
	}
	return ev
}

// ChangeEvents are the events of next := Apply(prev, cfg, sd): the
// description change of sd's server unless Equal (when sd's reply removed
// its own server, the change to sd itself), an opening for each added
// server, a closing for each removed one, and the topology's description
// change unless Equal. Nothing happened if sd was ignored.
func ChangeEvents(prev, next TopologyDescription, sd ServerDescription) []Event {
	var ev []Event
	if old, ok := prev.Server(sd.Address); ok {
		cur, stayed := next.Server(sd.Address)
		if !stayed {
			cur = sd
		}
		if !old.Equal(cur) {
			ev = append(ev, Event{Type: ServerDescriptionChanged, Address: sd.Address, PreviousServer: old, NewServer: cur})
		}
	}
	d := Diff(prev, next)
	for _, a := range d.Added {
		ev = append(ev, Event{Type: ServerOpening, Address: a})
	}
	for _, a := range d.Removed {
		ev = append(ev, Event{Type: ServerClosed, Address: a})
	}
	if !prev.Equal(next) {
		ev = append(ev, Event{Type: TopologyDescriptionChanged, PreviousTopology: prev, NewTopology: next})
	}
	return ev
}

func errorText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func equalPtr[T comparable](a, b *T) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// sameSet compares two address lists as sets (the spec's hosts, passives
// and arbiters are sets; servers may list them in any order).
func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	if slices.Equal(a, b) {
		return true
	}
	as, bs := slices.Clone(a), slices.Clone(b)
	slices.Sort(as)
	slices.Sort(bs)
	return slices.Equal(as, bs)
}
