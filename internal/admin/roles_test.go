package admin

import (
	"encoding/json"
	"net/http"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// replicaSetPools is one route over a three-member replica set: a primary,
// a secondary, and a member the monitor cannot reach.
func replicaSetPools() []PoolInfo {
	return []PoolInfo{
		{Route: "rs", Server: "127.0.0.1:27019", State: "paused", Role: RoleUnknown,
			LastError: "upstream: connect to 127.0.0.1:27019 (dial): connection refused"},
		{Route: "rs", Server: "127.0.0.1:27017", State: "ready", Usable: true, Role: RolePrimary, RTTMs: 1.25},
		{Route: "rs", Server: "127.0.0.1:27018", State: "ready", Usable: true, Role: RoleSecondary, RTTMs: 3.5},
	}
}

// showPools names every member with its role, round-trip time and last
// error over the wire, with the types mongosh should show: role and
// lastError strings (lastError present, and empty, for a healthy member),
// rttMs a double.
func TestShowPoolsMemberFields(t *testing.T) {
	f := newFake()
	f.pools = replicaSetPools()
	reply := run(t, newTestHandler(f), loopback, bson.D{{Key: "showPools", Value: 1}})
	wantOK(t, reply)
	want := sortedPools(f.pools)
	for i, w := range want {
		d := reply.Lookup("pools", string(rune('0'+i))).Document()
		role, ok := d.Lookup("role").StringValueOK()
		if !ok || role != w.Role {
			t.Errorf("pool %d role %v, want the string %q", i, d.Lookup("role"), w.Role)
		}
		rtt := d.Lookup("rttMs")
		if rtt.Type != bsoncore.TypeDouble || rtt.Double() != w.RTTMs {
			t.Errorf("pool %d rttMs %v (%v), want the double %v", i, rtt, rtt.Type, w.RTTMs)
		}
		lastErr, ok := d.Lookup("lastError").StringValueOK()
		if !ok || lastErr != w.LastError {
			t.Errorf("pool %d lastError %v, want the string %q", i, d.Lookup("lastError"), w.LastError)
		}
	}
}

// /admin/pools has the same fields, under the same names.
func TestHTTPPoolsMemberFields(t *testing.T) {
	f := newFake()
	f.pools = replicaSetPools()
	h := NewHTTPHandler(f, nil, nil)
	var body struct{ Pools []map[string]any }
	decodeJSON(t, do(t, h, http.MethodGet, "/admin/pools"), &body)
	want := sortedPools(f.pools)
	if len(body.Pools) != len(want) {
		t.Fatalf("%d pools, want %d", len(body.Pools), len(want))
	}
	for i, w := range want {
		p := body.Pools[i]
		if p["server"] != w.Server || p["role"] != w.Role || p["rttMs"] != w.RTTMs || p["lastError"] != w.LastError {
			t.Errorf("pool %d: %v, want server %s role %q rttMs %v lastError %q", i, p, w.Server, w.Role, w.RTTMs, w.LastError)
		}
	}
}

// showServers tells each connection's server role, over the wire and HTTP.
func TestShowServersRole(t *testing.T) {
	f := newFake()
	reply := run(t, newTestHandler(f), loopback, bson.D{{Key: "showServers", Value: 1}})
	wantOK(t, reply)
	// Sorted: the "*" route's secondary first, then "orders"' primary.
	for i, want := range []string{RoleSecondary, RolePrimary, RolePrimary} {
		if got, ok := reply.Lookup("servers", string(rune('0'+i)), "role").StringValueOK(); !ok || got != want {
			t.Errorf("server %d role %q, want %q", i, got, want)
		}
	}
	var body struct{ Servers []json.RawMessage }
	decodeJSON(t, do(t, NewHTTPHandler(f, nil, nil), http.MethodGet, "/admin/servers"), &body)
	for i, want := range []string{RoleSecondary, RolePrimary, RolePrimary} {
		var s struct{ Role *string }
		if err := json.Unmarshal(body.Servers[i], &s); err != nil || s.Role == nil || *s.Role != want {
			t.Errorf("server %d: %s, want role %q", i, body.Servers[i], want)
		}
	}
}
