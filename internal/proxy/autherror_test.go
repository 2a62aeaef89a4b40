package proxy

// The error replies of failed upstream logins and selections: what a client
// is told, and what it is not (members, credentials).

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/routing"
	"github.com/mongobouncer/mongobouncer/internal/sdam"
	"github.com/mongobouncer/mongobouncer/internal/topology"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// A route whose service user the upstream refused answers its clients with
// AuthenticationFailed (18), naming the route, without retry labels: on
// the request's own failed connection, after another request's failure
// cleared the pool it waited in, and when selection gave up on servers
// Unknown because of it. Other failures keep their retryable codes.
func TestUpstreamAuthFailureReply(t *testing.T) {
	s := &Server{opts: Options{Observer: nopObserver{}}}
	refused := &upstream.AuthError{Mechanism: "SCRAM-SHA-256", Username: "svc", Source: "admin", Code: 18, CodeName: "AuthenticationFailed", Message: "Authentication failed."}
	connErr := &pool.ConnectionError{Address: "db1:27017", Err: &upstream.ConnectError{Addr: "db1:27017", Stage: "auth", Err: refused}}
	ours := &pool.ConnectionError{Address: "db1:27017", Err: &upstream.ConnectError{Addr: "db1:27017", Stage: "auth", Err: &upstream.AuthError{Mechanism: "SCRAM-SHA-256", Message: "bad signature"}}}
	cases := []struct {
		name string
		err  error
		code int32
	}{
		{"own connection", connErr, 18},
		{"pool cleared by it", &pool.PoolClearedError{Address: "db1:27017", Cause: connErr}, 18},
		{"selection gave up", &topology.SelectionError{Topology: "orders", Err: topology.ErrSelectionTimeout,
			Servers: []topology.ServerStatus{{Address: "db1:27017", State: topology.Unknown, Err: connErr}}}, 18},
		{"one server of two refused", &topology.SelectionError{Topology: "orders", Err: topology.ErrSelectionTimeout,
			Servers: []topology.ServerStatus{{Address: "db1:27017", Err: connErr}, {Address: "db2:27017", Err: errors.New("connection refused")}}}, command.CodeHostUnreachable},
		{"conversation we ended", ours, command.CodeHostUnreachable},
		{"pool cleared otherwise", &pool.PoolClearedError{Address: "db1:27017"}, command.CodeHostUnreachable},
	}
	for _, c := range cases {
		var req command.Request
		req.Inspect(mustDoc(t, bson.D{{Key: "insert", Value: "c"}, {Key: "$db", Value: "d"}}))
		body := s.upstreamError(&routing.Route{Name: "orders"}, c.err, &req, false)
		if code := body.Lookup("code").Int32(); code != c.code {
			t.Errorf("%s: code %d, want %d: %v", c.name, code, c.code, body)
			continue
		}
		if c.code != 18 {
			continue
		}
		msg, _ := body.Lookup("errmsg").StringValueOK()
		if name, _ := body.Lookup("codeName").StringValueOK(); name != "AuthenticationFailed" || !strings.Contains(msg, `route "orders"`) || !strings.Contains(msg, "authentication") {
			t.Errorf("%s: %v", c.name, body)
		}
		if _, err := body.LookupErr("errorLabels"); err == nil {
			t.Errorf("%s: retry labels on an authentication failure: %v", c.name, body)
		}
	}
}

// On a pass-through route the refusals name pass-through, and so does a
// salt the upstream does not share (ErrPassThroughMismatch, mongobouncer's
// own verdict, code 0) and a client whose login left no secret: code 18
// without retry labels, since retrying cannot help.
func TestPassThroughFailureReply(t *testing.T) {
	s := &Server{opts: Options{Observer: nopObserver{}}}
	auth := func(e *upstream.AuthError) error {
		return &pool.ConnectionError{Address: "db1:27017", Err: &upstream.ConnectError{Addr: "db1:27017", Stage: "auth", Err: e}}
	}
	for name, err := range map[string]error{
		"refused":   auth(&upstream.AuthError{Mechanism: "SCRAM-SHA-256", Username: "bob", Code: 18, Message: "Authentication failed."}),
		"mismatch":  auth(&upstream.AuthError{Mechanism: "SCRAM-SHA-256", Username: "bob", Message: "salt differs", Err: upstream.ErrPassThroughMismatch}),
		"no secret": errNoPassThroughSecret,
	} {
		var req command.Request
		req.Inspect(mustDoc(t, bson.D{{Key: "find", Value: "c"}, {Key: "$db", Value: "d"}}))
		body := s.upstreamError(&routing.Route{Name: "pt", PassThrough: true}, err, &req, false)
		msg, _ := body.Lookup("errmsg").StringValueOK()
		if code := body.Lookup("code").Int32(); code != 18 || !strings.Contains(msg, "pass-through") || !strings.Contains(msg, `route "pt"`) {
			t.Errorf("%s: %v", name, body)
		}
		if _, err := body.LookupErr("errorLabels"); err == nil {
			t.Errorf("%s: retry labels: %v", name, body)
		}
	}
}

// A selection error names every member with its address and error: the
// client's reply gives only the cause and the counts by role (no member
// list leaks to clients), while the log keeps the addresses.
func TestSelectionErrorReplyHidesMembers(t *testing.T) {
	var logs strings.Builder
	s := &Server{opts: Options{Observer: nopObserver{}}, log: slog.New(slog.NewTextHandler(&logs, nil))}
	err := &topology.SelectionError{Topology: "orders", Err: topology.ErrSelectionTimeout, Type: sdam.ReplicaSetNoPrimary,
		Waited: 30 * time.Second, Servers: []topology.ServerStatus{
			{Address: "db1.internal:27017", State: topology.Unknown, Err: errors.New("dial tcp 10.0.0.1:27017: connection refused")},
			{Address: "db2.internal:27017", State: topology.Usable, Kind: topology.KindRSSecondary},
			{Address: "db3.internal:27017", State: topology.Usable, Kind: topology.KindRSSecondary},
			{Address: "db4.internal:27017", Removed: "it is a member of replica set \"other\""},
		}}
	var req command.Request
	req.Inspect(mustDoc(t, bson.D{{Key: "insert", Value: "c"}, {Key: "$db", Value: "d"}}))
	body := s.upstreamError(&routing.Route{Name: "orders"}, err, &req, false)
	msg, _ := body.Lookup("errmsg").StringValueOK()
	for _, leak := range []string{"db1", "db2", "db3", "db4", "10.0.0.1", "other"} {
		if strings.Contains(msg, leak) {
			t.Errorf("the client's message names %q: %s", leak, msg)
		}
	}
	for _, want := range []string{"no upstream server available", `"orders"`, "server selection timed out", "ReplicaSetNoPrimary",
		"4 servers", "2 RSSecondary", "1 unknown", "1 removed"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the client's message lacks %q: %s", want, msg)
		}
	}
	if code := body.Lookup("code").Int32(); code != command.CodeHostUnreachable {
		t.Errorf("code %d", code)
	}
	for _, want := range []string{"db1.internal:27017", "connection refused", "db4.internal:27017"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log lacks %q: %s", want, logs.String())
		}
	}

	// A route's own upstream (a standalone, a mongos list) is no
	// discovered member: the client's message names it.
	err = &topology.SelectionError{Topology: "orders", Err: topology.ErrSelectionTimeout, Type: sdam.TopologyUnknown,
		Waited: time.Second, Servers: []topology.ServerStatus{
			{Address: "db1.internal:27017", State: topology.Unknown, Err: errors.New("connection refused")},
		}}
	body = s.upstreamError(&routing.Route{Name: "orders"}, err, &req, false)
	if msg, _ := body.Lookup("errmsg").StringValueOK(); !strings.Contains(msg, "db1.internal:27017") || !strings.Contains(msg, "connection refused") {
		t.Errorf("a standalone route's message does not name its upstream: %s", msg)
	}
}
