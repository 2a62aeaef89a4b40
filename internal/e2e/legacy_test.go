package e2e

import (
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// legacyCmd sends cmd as an OP_QUERY on db.$cmd with flags and returns the
// OP_REPLY's document, checking the opcode and responseTo.
func legacyCmd(r *rawClient, flags int32, db string, cmd any) bson.Raw {
	r.t.Helper()
	r.id++
	r.sendRaw(wire.AppendQuery(nil, r.id, flags, db+".$cmd", 0, -1, docOf(r.t, cmd)))
	rep := r.recv()
	if rep.header.OpCode != wire.OpReply || rep.header.ResponseTo != r.id {
		r.t.Fatalf("OP_QUERY answered with %v responseTo %d, want an OP_REPLY to %d", rep.header.OpCode, rep.header.ResponseTo, r.id)
	}
	return rep.body
}

// TestLegacyOpQueryReadPreference: commands sent as OP_QUERY reach the
// replica-set member that server-selection.md's OP_QUERY rules choose (the
// $readPreference modifier, else SecondaryOk as secondaryPreferred, else
// the primary), writes go to the primary whatever the flag, and replies
// come back as OP_REPLY on a connection that goes on with OP_MSG.
func TestLegacyOpQueryReadPreference(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		rs := fakemongo.StartReplicaSet(t, fakemongo.ReplicaSetOptions{
			Tags: map[int]map[string]string{1: {"dc": "east"}, 2: {"dc": "west"}},
		})
		_, addr := rsBouncer(t, rs, nil)
		c := dialRaw(t, addr)
		if r := legacyCmd(c, 0, "admin", bson.D{{Key: "isMaster", Value: 1}}); okOf(r) != 1 {
			t.Fatalf("legacy hello: %v", r)
		}

		ins := counts(rs, "insert")
		for i := range 5 {
			r := legacyCmd(c, querySecondaryOk, "db", bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{bson.D{{Key: "_id", Value: i}}}}})
			if okOf(r) != 1 {
				t.Fatalf("insert: %v", r)
			}
		}
		if got := since(ins, counts(rs, "insert")); got[0] != 5 || got[1]+got[2] != 0 {
			t.Fatalf("inserts with SecondaryOk by member %v, want all 5 on the primary (member 0)", got)
		}

		find := bson.D{{Key: "find", Value: "c"}, {Key: "filter", Value: bson.D{}}}
		west := bson.D{{Key: "mode", Value: "secondary"}, {Key: "tags", Value: bson.A{bson.D{{Key: "dc", Value: "west"}}}}}
		for _, tc := range []struct {
			name    string
			flags   int32
			cmd     bson.D
			allowed []int
		}{
			{"no flag: primary", 0, find, []int{0}},
			{"SecondaryOk: secondaryPreferred", querySecondaryOk, find, []int{1, 2}},
			{"$readPreference secondary dc:west", querySecondaryOk, bson.D{{Key: "$query", Value: find}, {Key: "$readPreference", Value: west}}, []int{2}},
			{"$readPreference primary with the flag", querySecondaryOk, bson.D{{Key: "$query", Value: find}, {Key: "$readPreference", Value: bson.D{{Key: "mode", Value: "primary"}}}}, []int{0}},
		} {
			const n = 20
			before := counts(rs, "find")
			for range n {
				r := legacyCmd(c, tc.flags, "db", tc.cmd)
				if okOf(r) != 1 {
					t.Fatalf("%s: %v", tc.name, r)
				}
				if docs, _ := r.Lookup("cursor", "firstBatch").ArrayOK(); len(docs) == 0 {
					t.Fatalf("%s: no documents in %v", tc.name, r)
				}
			}
			got := since(before, counts(rs, "find"))
			var on int64
			for _, i := range tc.allowed {
				on += got[i]
			}
			if on != n || sum(got) != n {
				t.Errorf("%s: finds by member %v, want all %d on members %v", tc.name, got, n, tc.allowed)
			}
		}

		// A bad read preference is refused as over OP_MSG, and the client
		// stays; so does an exhaust request.
		r := legacyCmd(c, querySecondaryOk, "db", bson.D{{Key: "$query", Value: find}, {Key: "$readPreference", Value: bson.D{{Key: "mode", Value: "sometimes"}}}})
		if okOf(r) != 0 || codeOf(r) != 9 {
			t.Fatalf("unknown mode: %v, want code 9", r)
		}
		r = legacyCmd(c, queryExhaust, "db", find)
		if okOf(r) != 0 || codeOf(r) != 2 {
			t.Fatalf("exhaust OP_QUERY command: %v, want code 2", r)
		}
		if r := c.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "db"}}); okOf(r) != 1 {
			t.Fatalf("OP_MSG after OP_QUERY commands: %v", r)
		}
	})
}

// OP_QUERY flags, as drivers set them (the proxy's own constants are
// unexported).
const (
	querySecondaryOk int32 = 1 << 2
	queryExhaust     int32 = 1 << 6
)
