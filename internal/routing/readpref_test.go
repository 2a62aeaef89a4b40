package routing

// Where a read may go: its own $readPreference, else the route's default,
// else the primary; never a secondary for an aggregate that writes.

import (
	"errors"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/sdam"
	"github.com/mongobouncer/mongobouncer/internal/topology"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// testRoute is a route, in a table, over a topology nobody answers:
// Criteria only reads the route's settings and the heartbeat interval.
func testRoute(t *testing.T, rp *sdam.ReadPref) *Route {
	t.Helper()
	return hostsRoute(t, rp, "127.0.0.1:1")
}

// multiRoute is a route over two seeds nobody answers: Multi from the
// start.
func multiRoute(t *testing.T) *Route {
	t.Helper()
	return hostsRoute(t, nil, "127.0.0.1:1", "127.0.0.1:2")
}

func hostsRoute(t *testing.T, rp *sdam.ReadPref, hosts ...string) *Route {
	t.Helper()
	d := upstream.NewDialer(upstream.Options{})
	topo, err := topology.New("t", topology.Options{Hosts: hosts, Pool: pool.DefaultOptions(),
		Dialer: d, MonitorDialer: d})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(topo.Close)
	r := &Route{Name: "t", Topology: topo, ReadPref: rp}
	if _, err := NewTable([]*Route{r}, 10, 10); err != nil {
		t.Fatal(err)
	}
	return r
}

func mustDoc(t *testing.T, d bson.D) bsoncore.Document {
	t.Helper()
	b, err := bson.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestCriteria(t *testing.T) {
	secondary := bson.D{{Key: "mode", Value: "secondary"}}
	plain := testRoute(t, nil)
	nearest := testRoute(t, &sdam.ReadPref{Mode: sdam.Nearest})
	if plain.DefaultReadPref() != nil {
		t.Fatal("a route without a default read preference adds one")
	}
	if el := bsoncore.Element(nearest.DefaultReadPref()); el.Key() != "$readPreference" || el.Value().Document().Lookup("mode").StringValue() != "nearest" {
		t.Fatalf("default read preference element %v", el)
	}
	cases := []struct {
		name    string
		route   *Route
		cmd     bson.D
		rp      any       // nil: none
		mode    sdam.Mode // Primary: the zero Criteria
		add     bool
		wantErr bool
	}{
		{"find without a read preference", plain, bson.D{{Key: "find", Value: "c"}}, nil, sdam.Primary, false, false},
		{"find with secondary", plain, bson.D{{Key: "find", Value: "c"}}, secondary, sdam.Secondary, false, false},
		{"primary mode", plain, bson.D{{Key: "find", Value: "c"}}, bson.D{{Key: "mode", Value: "primary"}}, sdam.Primary, false, false},
		{"aggregate with $out", plain, bson.D{{Key: "aggregate", Value: "c"}, {Key: "pipeline", Value: bson.A{bson.D{{Key: "$match", Value: bson.D{}}}, bson.D{{Key: "$out", Value: "o"}}}}}, secondary, sdam.Primary, false, false},
		{"aggregate with $merge", plain, bson.D{{Key: "aggregate", Value: "c"}, {Key: "pipeline", Value: bson.A{bson.D{{Key: "$merge", Value: "o"}}}}}, secondary, sdam.Primary, false, false},
		{"aggregate that reads", plain, bson.D{{Key: "aggregate", Value: "c"}, {Key: "pipeline", Value: bson.A{bson.D{{Key: "$match", Value: bson.D{}}}}}}, secondary, sdam.Secondary, false, false},
		{"a pipeline that is not an aggregate's", plain, bson.D{{Key: "find", Value: "c"}, {Key: "pipeline", Value: bson.A{bson.D{{Key: "$out", Value: "o"}}}}}, secondary, sdam.Secondary, false, false},
		{"aggregate with $out, route default", nearest, bson.D{{Key: "aggregate", Value: "c"}, {Key: "pipeline", Value: bson.A{bson.D{{Key: "$out", Value: "o"}}}}}, nil, sdam.Primary, false, false},
		{"unknown mode", plain, bson.D{{Key: "find", Value: "c"}}, bson.D{{Key: "mode", Value: "anywhere"}}, sdam.Primary, false, true},
		{"not a document", plain, bson.D{{Key: "find", Value: "c"}}, []byte{1}, sdam.Primary, false, true},
		{"max staleness too small", plain, bson.D{{Key: "find", Value: "c"}}, bson.D{{Key: "mode", Value: "secondary"}, {Key: "maxStalenessSeconds", Value: 5}}, sdam.Primary, false, true},
		{"route default", nearest, bson.D{{Key: "find", Value: "c"}}, nil, sdam.Nearest, true, false},
		{"the command's own beats the default", nearest, bson.D{{Key: "find", Value: "c"}}, secondary, sdam.Secondary, false, false},
	}
	for _, c := range cases {
		var rp []byte
		switch v := c.rp.(type) {
		case bson.D:
			rp = mustDoc(t, v)
		case []byte:
			rp = v
		}
		crit, add, err := c.route.Criteria(mustDoc(t, append(c.cmd, bson.E{Key: "$db", Value: "d"})), rp)
		if c.wantErr {
			var rpe *ReadPrefError
			if !errors.As(err, &rpe) {
				t.Errorf("%s: error %v, want a *ReadPrefError", c.name, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		mode := sdam.Primary
		if crit.ReadPref != nil {
			mode = crit.ReadPref.Mode
			if mode == sdam.Primary {
				t.Errorf("%s: a primary read preference must be the zero Criteria", c.name)
			}
		}
		if mode != c.mode || add != c.add {
			t.Errorf("%s: mode %v add %v, want %v %v", c.name, mode, add, c.mode, c.add)
		}
	}
}

// pipelineWrites reads any document without panicking.
func FuzzPipelineWrites(f *testing.F) {
	for _, d := range []bson.D{
		{{Key: "aggregate", Value: "c"}, {Key: "pipeline", Value: bson.A{bson.D{{Key: "$out", Value: "o"}}}}},
		{{Key: "aggregate", Value: "c"}, {Key: "pipeline", Value: bson.A{}}},
		{{Key: "aggregate", Value: "c"}, {Key: "pipeline", Value: "x"}},
	} {
		b, _ := bson.Marshal(d)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		_ = pipelineWrites(bsoncore.Document(b))
	})
}
