package fakemongo

import (
	"errors"
	"slices"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// A removed member leaves every hello's hosts, setVersion rises, and the
// member answers as mongod's REMOVED state does: no set, isreplicaset, and
// no reads, writes or election.
func TestReplicaSetRemoveMember(t *testing.T) {
	rs := StartReplicaSet(t, ReplicaSetOptions{})
	m := rs.Members()
	if _, err := rs.RemoveMember(0); !errors.Is(err, ErrReplicaSetState) {
		t.Fatalf("removing the primary: %v, want ErrReplicaSetState", err)
	}
	v, err := rs.RemoveMember(1)
	if err != nil || v != 2 {
		t.Fatalf("RemoveMember = %d, %v", v, err)
	}
	want := []string{m[0].Addr(), m[2].Addr()}
	if !slices.Equal(rs.Hosts(), want) || m[1].State() != StateRemoved {
		t.Fatalf("hosts %v, member 1 %v", rs.Hosts(), m[1].State())
	}
	for _, i := range []int{0, 2} {
		r := helloOf(t, m[i])
		if got := stringsOf(t, r, "hosts"); !slices.Equal(got, want) {
			t.Fatalf("member %d hosts %v, want %v", i, got, want)
		}
		wantInt(t, r, "setVersion", 2)
		if c, _ := r.Lookup("topologyVersion", "counter").AsInt64OK(); c != 1 {
			t.Fatalf("member %d counter %d after the reconfig", i, c)
		}
	}
	r := helloOf(t, m[1])
	mustOK(t, r)
	wantBool(t, r, "isreplicaset", true)
	wantBool(t, r, "isWritablePrimary", false)
	wantBool(t, r, "secondary", false)
	wantAbsent(t, r, "setName", "hosts", "primary", "me", "setVersion")

	c := dialRaw(t, m[1].Server())
	find := d{{"find", "c"}, {"$readPreference", d{{"mode", "secondaryPreferred"}}}, {"$db", "db"}}
	if r := c.roundTrip(find); codeOf(r) != 13436 {
		t.Fatalf("find on a removed member: %v", r)
	}
	ins := d{{"insert", "c"}, {"documents", bson.A{bson.D{{Key: "_id", Value: 1}}}}, {"$db", "db"}}
	if r := c.roundTrip(ins); codeOf(r) != 10107 {
		t.Fatalf("insert on a removed member: %v", r)
	}
	if _, err := rs.RemoveMember(1); !errors.Is(err, ErrReplicaSetState) {
		t.Fatalf("removing twice: %v", err)
	}
	if err := rs.Elect(1); !errors.Is(err, ErrReplicaSetState) {
		t.Fatalf("electing a removed member: %v", err)
	}
	if idx, err := rs.Failover(); err != nil || idx != 2 {
		t.Fatalf("Failover = %d, %v; want member 2, member 1 being removed", idx, err)
	}
}
