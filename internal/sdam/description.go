// Package sdam is Server Discovery and Monitoring as pure data: server
// descriptions made from hello replies, the topology state machine that
// applies them (server-discovery-and-monitoring.md), the application-error
// rules, and server selection with read preferences, the latency window and
// max staleness (server-selection.md, max-staleness.md).
//
// It does no I/O, starts no goroutine and reads no clock of its own: the
// caller passes times in. internal/topology runs the monitors and the pools
// and feeds this package; the official conformance suites run against the
// very same code. It imports nothing internal.
package sdam

import (
	"strconv"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// ServerType is SDAM's ServerType.
type ServerType int

// The server types, with SDAM's names (see String).
const (
	Unknown ServerType = iota
	Standalone
	Mongos
	PossiblePrimary
	RSPrimary
	RSSecondary
	RSArbiter
	RSOther
	RSGhost
	LoadBalancer
)

var serverTypeNames = [...]string{
	Unknown:         "Unknown",
	Standalone:      "Standalone",
	Mongos:          "Mongos",
	PossiblePrimary: "PossiblePrimary",
	RSPrimary:       "RSPrimary",
	RSSecondary:     "RSSecondary",
	RSArbiter:       "RSArbiter",
	RSOther:         "RSOther",
	RSGhost:         "RSGhost",
	LoadBalancer:    "LoadBalancer",
}

// String returns the specification's name of the type.
func (t ServerType) String() string {
	if t >= 0 && int(t) < len(serverTypeNames) {
		return serverTypeNames[t]
	}
	return "ServerType(" + strconv.Itoa(int(t)) + ")"
}

// IsReplicaSetMember reports whether the type belongs to a replica set
// (RSPrimary, RSSecondary, RSArbiter, RSOther or RSGhost).
func (t ServerType) IsReplicaSetMember() bool {
	return t >= RSPrimary && t <= RSGhost
}

// DataBearing reports whether a server of this type holds data and can
// serve operations: Standalone, Mongos, RSPrimary, RSSecondary,
// LoadBalancer.
func (t ServerType) DataBearing() bool {
	switch t {
	case Standalone, Mongos, RSPrimary, RSSecondary, LoadBalancer:
		return true
	}
	return false
}

// TopologyType is SDAM's TopologyType.
type TopologyType int

// The topology types, with SDAM's names (see String).
const (
	TopologyUnknown TopologyType = iota
	Single
	ReplicaSetNoPrimary
	ReplicaSetWithPrimary
	Sharded
	LoadBalanced
)

var topologyTypeNames = [...]string{
	TopologyUnknown:       "Unknown",
	Single:                "Single",
	ReplicaSetNoPrimary:   "ReplicaSetNoPrimary",
	ReplicaSetWithPrimary: "ReplicaSetWithPrimary",
	Sharded:               "Sharded",
	LoadBalanced:          "LoadBalanced",
}

// String returns the specification's name of the type.
func (t TopologyType) String() string {
	if t >= 0 && int(t) < len(topologyTypeNames) {
		return topologyTypeNames[t]
	}
	return "TopologyType(" + strconv.Itoa(int(t)) + ")"
}

// TopologyVersion orders the hello replies and errors of one server process
// (awaitable hello and the error rules compare it).
type TopologyVersion struct {
	ProcessID bson.ObjectID
	Counter   int64
}

// ServerDescription is what is known of one server: SDAM's
// ServerDescription. It is a value; a change makes a new one. Optional
// fields are pointers, nil when the server did not send them.
type ServerDescription struct {
	// Address is "host:port", the host lowered (or a Unix socket path).
	Address string
	Type    ServerType
	// Error is why the server is Unknown, nil otherwise.
	Error error

	// AvgRTT is the moving average of hello round trips; HasRTT is false
	// before the first sample.
	AvgRTT time.Duration
	HasRTT bool
	// LastUpdateTime is when the description was made (from the caller's
	// clock); max staleness compares it between servers.
	LastUpdateTime time.Time
	// LastWriteDate is lastWrite.lastWriteDate from hello, zero if absent.
	LastWriteDate time.Time

	MinWireVersion int32
	MaxWireVersion int32

	Me       string
	Hosts    []string
	Passives []string
	Arbiters []string
	Tags     map[string]string
	SetName  string
	// SetVersion and ElectionID order primaries (the stale-primary rules).
	SetVersion *int64
	ElectionID *bson.ObjectID
	Primary    string

	LogicalSessionTimeoutMinutes *int64
	TopologyVersion              *TopologyVersion
	HelloOK                      bool
}

// TopologyDescription is SDAM's TopologyDescription: the type, the servers
// and what the replica-set rules remember between replies. It is a value;
// applying a change makes a new one.
type TopologyDescription struct {
	Type TopologyType
	// SetName is the replica set's name, from the URI or the first member
	// that reported one.
	SetName string
	// MaxSetVersion and MaxElectionID are the highest seen from a primary.
	MaxSetVersion *int64
	MaxElectionID *bson.ObjectID
	// Servers, sorted by Address.
	Servers []ServerDescription
	// CompatibilityError says why the topology is incompatible (a server's
	// wire versions do not overlap ours); nil when compatible.
	CompatibilityError error
	// LogicalSessionTimeoutMinutes is the minimum over the data-bearing
	// servers, nil when any of them lacks it.
	LogicalSessionTimeoutMinutes *int64
}

// Server returns the description of the server at addr, and whether the
// topology has it.
func (t *TopologyDescription) Server(addr string) (ServerDescription, bool) {
	for _, s := range t.Servers {
		if s.Address == addr {
			return s, true
		}
	}
	return ServerDescription{}, false
}
