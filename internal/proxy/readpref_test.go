package proxy

// Which commands are reads that a read preference may send away from the
// primary (routing has where a read goes), read-preference error replies,
// and the softening of upstream shutdown codes.

import (
	"errors"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/routing"
	"github.com/mongobouncer/mongobouncer/internal/sdam"
	"github.com/mongobouncer/mongobouncer/internal/topology"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// testRoute is a route over a topology nobody answers: criteria only reads
// the route's settings and the heartbeat interval.
func testRoute(t *testing.T, rp *sdam.ReadPref) *routing.Route {
	t.Helper()
	d := upstream.NewDialer(upstream.Options{})
	topo, err := topology.New("t", topology.Options{Hosts: []string{"127.0.0.1:1"}, Pool: pool.DefaultOptions(),
		Dialer: d, MonitorDialer: d})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(topo.Close)
	r := &routing.Route{Name: "t", Topology: topo, ReadPref: rp}
	if _, err := routing.NewTable([]*routing.Route{r}, 10, 10); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestCriteria(t *testing.T) {
	secondary := bson.D{{Key: "mode", Value: "secondary"}}
	lsid := bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: make([]byte, 16)}}}
	plain := testRoute(t, nil)
	nearest := testRoute(t, &sdam.ReadPref{Mode: sdam.Nearest})
	cases := []struct {
		name    string
		route   *routing.Route
		cmd     bson.D
		mode    sdam.Mode // Primary: the zero Criteria
		add     bool
		wantErr bool
	}{
		{"find without a read preference", plain, bson.D{{Key: "find", Value: "c"}}, sdam.Primary, false, false},
		{"find with secondary", plain, bson.D{{Key: "find", Value: "c"}, {Key: "$readPreference", Value: secondary}}, sdam.Secondary, false, false},
		{"insert with secondary", plain, bson.D{{Key: "insert", Value: "c"}, {Key: "$readPreference", Value: secondary}}, sdam.Primary, false, false},
		{"createIndexes with secondary", plain, bson.D{{Key: "createIndexes", Value: "c"}, {Key: "$readPreference", Value: secondary}}, sdam.Primary, false, false},
		{"aggregate with $out", plain, bson.D{{Key: "aggregate", Value: "c"}, {Key: "pipeline", Value: bson.A{bson.D{{Key: "$match", Value: bson.D{}}}, bson.D{{Key: "$out", Value: "o"}}}}, {Key: "$readPreference", Value: secondary}}, sdam.Primary, false, false},
		{"in a transaction", plain, bson.D{{Key: "find", Value: "c"}, {Key: "lsid", Value: lsid}, {Key: "txnNumber", Value: int64(1)}, {Key: "autocommit", Value: false}, {Key: "$readPreference", Value: secondary}}, sdam.Primary, false, false},
		{"getMore follows its cursor", plain, bson.D{{Key: "getMore", Value: int64(5)}, {Key: "$readPreference", Value: secondary}}, sdam.Primary, false, false},
		{"unknown mode", plain, bson.D{{Key: "find", Value: "c"}, {Key: "$readPreference", Value: bson.D{{Key: "mode", Value: "anywhere"}}}}, sdam.Primary, false, true},
		{"route default", nearest, bson.D{{Key: "find", Value: "c"}}, sdam.Nearest, true, false},
		{"route default never sends writes away", nearest, bson.D{{Key: "update", Value: "c"}}, sdam.Primary, false, false},
	}
	for _, c := range cases {
		body := mustDoc(t, append(c.cmd, bson.E{Key: "$db", Value: "d"}))
		var req command.Request
		req.Inspect(body)
		crit, add, err := criteria(c.route, &req, body)
		if c.wantErr {
			var rpe *routing.ReadPrefError
			if !errors.As(err, &rpe) {
				t.Errorf("%s: error %v, want a *routing.ReadPrefError", c.name, err)
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

// A bad $readPreference gets FailedToParse, not a retryable code: retrying
// cannot help.
func TestReadPrefErrorReply(t *testing.T) {
	s := &Server{opts: Options{Observer: nopObserver{}}}
	var req command.Request
	req.Inspect(mustDoc(t, bson.D{{Key: "find", Value: "c"}, {Key: "$db", Value: "d"}}))
	body := s.upstreamError(&routing.Route{Name: "r"}, &routing.ReadPrefError{Err: errors.New("bad mode")}, &req, false)
	if code := body.Lookup("code").Int32(); code != command.CodeFailedToParse {
		t.Errorf("code %d", code)
	}
	if _, err := body.LookupErr("errorLabels"); err == nil {
		t.Errorf("labels on a parse error: %v", body)
	}
}

// A member's shutdown codes reach clients as HostUnreachable: a driver
// would otherwise clear its whole pool to mongobouncer, which is not
// shutting down. Other codes, and codes of another type, are left alone.
func TestSoftenShutdown(t *testing.T) {
	for _, c := range []struct {
		doc     bson.D
		changed bool
		code    int32
		wcCode  int32
	}{
		{bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: int32(91)}, {Key: "codeName", Value: "ShutdownInProgress"}}, true, 6, 0},
		{bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: int32(11600)}}, true, 6, 0},
		{bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: int32(10107)}}, false, 10107, 0},
		{bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: int64(91)}}, false, 0, 0},
		{bson.D{{Key: "ok", Value: 1.0}, {Key: "writeConcernError", Value: bson.D{{Key: "code", Value: int32(91)}}}}, true, 0, 6},
		{bson.D{{Key: "ok", Value: 1.0}, {Key: "writeErrors", Value: bson.A{bson.D{{Key: "code", Value: int32(91)}}}}}, false, 0, 0},
	} {
		body := mustDoc(t, c.doc)
		if got := command.SoftenShutdown(body); got != c.changed {
			t.Errorf("%v: changed %v", c.doc, got)
		}
		if err := body.Validate(); err != nil {
			t.Fatalf("%v: invalid after the rewrite: %v", c.doc, err)
		}
		if v, err := body.LookupErr("code"); err == nil && v.Type == bsoncore.TypeInt32 && v.Int32() != c.code {
			t.Errorf("%v: code %d, want %d", c.doc, v.Int32(), c.code)
		}
		if v, err := body.LookupErr("writeConcernError", "code"); err == nil && v.Int32() != c.wcCode {
			t.Errorf("%v: writeConcernError.code %d, want %d", c.doc, v.Int32(), c.wcCode)
		}
	}
}
