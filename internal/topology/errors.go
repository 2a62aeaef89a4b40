package topology

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/sdam"
)

// ErrClosed is returned (wrapped in a *SelectionError) by SelectServer and
// WaitHello once the topology is closed.
var ErrClosed = errors.New("topology closed")

// ErrSelectionTimeout is the cause of a *SelectionError when
// ServerSelectionTimeout elapsed.
var ErrSelectionTimeout = errors.New("server selection timed out")

// HostUnreachableCode is the server error code a proxy should answer with
// when selection fails: HostUnreachable (6) is retried by drivers, and,
// unlike the state-change codes, does not make them drop their pool to us.
const HostUnreachableCode int32 = 6

// ServerStatus is one server's state at the moment selection gave up.
type ServerStatus struct {
	Address string
	State   ServerState
	Kind    Kind
	// Err is why the server is Unknown; nil for a Usable server that was not
	// selectable (for example a replica-set secondary).
	Err error
	// Removed, when not empty, says why discovery removed the server (a
	// member of another replica set, a standalone among members, ...).
	Removed string
}

// SelectionError reports that no server could be selected. Err is the cause:
// ErrSelectionTimeout, ErrClosed, or the context's error; errors.Is sees it.
// Clients should get it as a retryable HostUnreachable error (see Code).
type SelectionError struct {
	Topology string
	// Type is the topology's type when selection gave up.
	Type sdam.TopologyType
	// Waited is how long selection waited.
	Waited  time.Duration
	Servers []ServerStatus
	Err     error
}

// Error names the topology, the cause and every server with its last error.
func (e *SelectionError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "no usable server for %q after %v: %v", e.Topology, e.Waited.Round(time.Millisecond), e.Err)
	if e.Type != sdam.TopologyUnknown {
		fmt.Fprintf(&b, " (topology %s)", e.Type)
	}
	for i, s := range e.Servers {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString("; ")
		}
		if s.Removed != "" {
			fmt.Fprintf(&b, "%s was removed: %s", s.Address, s.Removed)
			continue
		}
		fmt.Fprintf(&b, "%s is %s", s.Address, s.State)
		if s.Kind != KindUnknown {
			fmt.Fprintf(&b, " %s", s.Kind)
		}
		if s.Err != nil {
			fmt.Fprintf(&b, " (%v)", s.Err)
		} else if s.State == Usable {
			b.WriteString(" (not selectable)")
		}
	}
	return b.String()
}

// ClientMessage is the message for a client. For a replica set it is
// Error without the member list: mongobouncer is a mongos to its clients,
// and the members it discovered, with their addresses and errors, stay in
// its own log; the message gives the cause, the topology type and how many
// servers there are in each role. Any other topology's servers are the
// ones the route's connection string names (a standalone, a mongos list),
// and naming the one that is down is what the application's log needs, so
// the message is Error.
func (e *SelectionError) ClientMessage() string {
	if e.Type != sdam.ReplicaSetNoPrimary && e.Type != sdam.ReplicaSetWithPrimary {
		return e.Error()
	}
	var b strings.Builder
	cause := "no server selected"
	for _, c := range []error{ErrSelectionTimeout, ErrClosed, context.Canceled, context.DeadlineExceeded} {
		if errors.Is(e.Err, c) {
			cause = c.Error()
			break
		}
	}
	fmt.Fprintf(&b, "no usable server for %q after %v: %s", e.Topology, e.Waited.Round(time.Millisecond), cause)
	if e.Type != sdam.TopologyUnknown {
		fmt.Fprintf(&b, " (topology %s)", e.Type)
	}
	roles := map[string]int{}
	var names []string
	for _, s := range e.Servers {
		role := "unknown"
		switch {
		case s.Removed != "":
			role = "removed"
		case s.State == Usable:
			role = s.Kind.String()
		}
		if roles[role] == 0 {
			names = append(names, role)
		}
		roles[role]++
	}
	slices.Sort(names)
	for i, r := range names {
		if i == 0 {
			fmt.Fprintf(&b, ": %d servers: ", len(e.Servers))
		} else {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%d %s", roles[r], r)
	}
	return b.String()
}

// Unwrap returns the cause.
func (e *SelectionError) Unwrap() error { return e.Err }

// Code returns HostUnreachableCode, the error code to give clients.
func (e *SelectionError) Code() int32 { return HostUnreachableCode }

// CodeName returns "HostUnreachable".
func (e *SelectionError) CodeName() string { return "HostUnreachable" }
