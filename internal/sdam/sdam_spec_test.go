// The official SDAM unit suite (../shared/specs/sdam, read at run time,
// never copied): every file of single, rs, sharded, load-balanced, errors
// and monitoring. The unified/ folder is not run here: its tests need a
// whole client talking to a real server (fail points on a live mongod),
// which this package, pure data, cannot be.

package sdam

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/testutil/specdir"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// specFolders are the unit folders; with their file counts the runner
// checks that none went missing.
var specFolders = []struct {
	name  string
	files int
}{
	{"single", 19}, {"rs", 77}, {"sharded", 9}, {"load-balanced", 1}, {"errors", 72}, {"monitoring", 8},
}

type specFile struct {
	Description string      `json:"description"`
	URI         string      `json:"uri"`
	Phases      []specPhase `json:"phases"`
}

type specPhase struct {
	Description       string                     `json:"description"`
	Responses         [][2]json.RawMessage       `json:"responses"`
	ApplicationErrors []specAppError             `json:"applicationErrors"`
	Outcome           map[string]json.RawMessage `json:"outcome"`
}

type specAppError struct {
	Address        string          `json:"address"`
	Generation     *uint64         `json:"generation"`
	MaxWireVersion int32           `json:"maxWireVersion"`
	When           string          `json:"when"`
	Type           string          `json:"type"`
	Response       json.RawMessage `json:"response"`
}

func TestSDAMSpec(t *testing.T) {
	for _, folder := range specFolders {
		t.Run(folder.name, func(t *testing.T) {
			dir := specdir.Dir(t, "sdam", folder.name)
			files := specdir.Files(t, dir, "*.json")
			if len(files) != folder.files {
				t.Errorf("%d files in %s, want %d", len(files), dir, folder.files)
			}
			for _, file := range files {
				name := strings.TrimSuffix(filepath.Base(file), ".json")
				t.Run(name, func(t *testing.T) { runSpecFile(t, file) })
			}
		})
	}
}

// runner is the client the suite drives: a topology, the pool generation
// of each server (clearing a pool increments it), and the events so far.
type runner struct {
	t      *testing.T
	cfg    Config
	td     TopologyDescription
	pools  map[string]uint64
	events []Event
	now    time.Time
}

func runSpecFile(t *testing.T, file string) {
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var sf specFile
	if err := json.Unmarshal(raw, &sf); err != nil {
		t.Fatal(err)
	}
	r := &runner{t: t, cfg: parseTestURI(t, sf.URI), pools: map[string]uint64{}, now: time.Unix(1_700_000_000, 0)}
	r.td = NewTopology(r.cfg)
	r.events = OpeningEvents(r.td)
	if r.cfg.LoadBalanced {
		for _, s := range r.td.Servers {
			r.apply(LoadBalancerServer(s.Address))
		}
	}
	for i, ph := range sf.Phases {
		t.Logf("phase %d: %s", i, ph.Description)
		for _, resp := range ph.Responses {
			r.response(resp)
		}
		for _, ae := range ph.ApplicationErrors {
			r.appError(ae)
		}
		if evs, ok := ph.Outcome["events"]; ok {
			checkEvents(t, i, evs, r.events)
			r.events = nil
		} else {
			r.checkOutcome(i, ph.Outcome)
		}
		if t.Failed() {
			t.FailNow()
		}
	}
}

func (r *runner) apply(sd ServerDescription) {
	next := Apply(r.td, r.cfg, sd)
	r.events = append(r.events, ChangeEvents(r.td, next, sd)...)
	for _, a := range Diff(r.td, next).Removed {
		delete(r.pools, a) // its pool is closed; a new one would start at 0
	}
	r.td = next
}

// do carries out an error decision the way internal/topology must.
func (r *runner) do(addr string, a ErrorAction) {
	if a.ClearPool {
		r.pools[addr]++
	}
	if a.MarkUnknown {
		r.apply(a.Unknown)
	}
}

// response feeds one hello outcome: {} is a network error.
func (r *runner) response(resp [2]json.RawMessage) {
	var addr string
	if err := json.Unmarshal(resp[0], &addr); err != nil {
		r.t.Fatal(err)
	}
	doc := extDoc(r.t, resp[1])
	r.now = r.now.Add(time.Second)
	cur, known := r.td.Server(addr)
	if len(doc) == 5 { // the empty document
		if known {
			r.do(addr, CheckFailed(cur, NetworkError, errors.New("network error (simulated)")))
		}
		return
	}
	sd := ParseServerDescription(addr, doc, 10*time.Millisecond, r.now)
	if sd.Type == Unknown && known {
		r.do(addr, CheckFailed(cur, CommandError, sd.Error))
		return
	}
	r.apply(sd)
}

func (r *runner) appError(ae specAppError) {
	cur, ok := r.td.Server(ae.Address)
	if !ok {
		r.t.Fatalf("application error for %s, which is not in the topology", ae.Address)
	}
	if ae.When != "afterHandshakeCompletes" && ae.When != "beforeHandshakeCompletes" {
		r.t.Fatalf("unknown when %q", ae.When)
	}
	var e AppError
	switch {
	case ae.Type == "command":
		var found bool
		if e, found = CommandErrorFromReply(extDoc(r.t, ae.Response)); !found {
			return // e.g. only writeErrors: no error for SDAM
		}
		e.HandshakeCompleted = ae.When == "afterHandshakeCompletes"
	case ae.Type != "network" && ae.Type != "timeout":
		r.t.Fatalf("unknown application error type %q", ae.Type)
	case ae.When == "afterHandshakeCompletes":
		e = AppError{Kind: NetworkError, HandshakeCompleted: true}
		if ae.Type == "timeout" {
			e.Kind = NetworkTimeout
		}
	default:
		// The connection broke or timed out during the handshake: built
		// as internal/topology builds it from the dialer's error, which
		// applies CMAP's backpressure label.
		e = ConnectFailure(StageHello, true, ae.Type == "timeout", 0, nil)
	}
	e.Generation = r.pools[ae.Address]
	if ae.Generation != nil {
		e.Generation = *ae.Generation
	}
	e.MaxWireVersion = ae.MaxWireVersion
	r.do(ae.Address, HandleAppError(cur, r.td.Type, r.pools[ae.Address], e))
}

func (r *runner) checkOutcome(phase int, out map[string]json.RawMessage) {
	t := r.t
	td := r.td
	for key, raw := range out {
		switch key {
		case "topologyType":
			if got, want := td.Type.String(), jsonString(t, raw); got != want {
				t.Errorf("phase %d: topologyType %s, want %s", phase, got, want)
			}
		case "setName":
			if got, want := td.SetName, jsonString(t, raw); got != want {
				t.Errorf("phase %d: setName %q, want %q", phase, got, want)
			}
		case "logicalSessionTimeoutMinutes":
			checkInt(t, phase, "topology logicalSessionTimeoutMinutes", td.LogicalSessionTimeoutMinutes, raw)
		case "maxSetVersion":
			checkInt(t, phase, "maxSetVersion", td.MaxSetVersion, raw)
		case "maxElectionId":
			checkOID(t, phase, "maxElectionId", td.MaxElectionID, raw)
		case "compatible":
			var want bool
			if err := json.Unmarshal(raw, &want); err != nil {
				t.Fatal(err)
			}
			if got := td.CompatibilityError == nil; got != want {
				t.Errorf("phase %d: compatible %v (%v), want %v", phase, got, td.CompatibilityError, want)
			}
		case "servers":
			r.checkServers(phase, raw)
		default:
			t.Errorf("phase %d: outcome key %q not checked by this runner", phase, key)
		}
	}
}

func (r *runner) checkServers(phase int, raw json.RawMessage) {
	t := r.t
	var want map[string]map[string]json.RawMessage
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range r.td.Servers {
		got = append(got, s.Address)
	}
	var wantAddrs []string
	for a := range want {
		wantAddrs = append(wantAddrs, a)
	}
	slices.Sort(wantAddrs)
	if !slices.Equal(got, wantAddrs) {
		t.Errorf("phase %d: servers %v, want %v", phase, got, wantAddrs)
		return
	}
	for addr, fields := range want {
		sd, _ := r.td.Server(addr)
		where := "phase " + strconv.Itoa(phase) + ": " + addr
		for key, raw := range fields {
			switch key {
			case "type":
				if got, want := sd.Type.String(), jsonString(t, raw); got != want {
					t.Errorf("%s: type %s (error %v), want %s", where, got, sd.Error, want)
				}
			case "setName":
				if got, want := sd.SetName, jsonString(t, raw); got != want {
					t.Errorf("%s: setName %q, want %q", where, got, want)
				}
			case "setVersion":
				checkInt(t, phase, addr+" setVersion", sd.SetVersion, raw)
			case "electionId":
				checkOID(t, phase, addr+" electionId", sd.ElectionID, raw)
			case "logicalSessionTimeoutMinutes":
				checkInt(t, phase, addr+" logicalSessionTimeoutMinutes", sd.LogicalSessionTimeoutMinutes, raw)
			case "minWireVersion", "maxWireVersion":
				got := sd.MinWireVersion
				if key == "maxWireVersion" {
					got = sd.MaxWireVersion
				}
				// null: the server reported none, which is 0.
				n := int64(got)
				checkInt(t, phase, addr+" "+key, &n, raw)
			case "topologyVersion":
				checkTV(t, phase, addr, sd.TopologyVersion, raw)
			case "pool":
				var p struct{ Generation uint64 }
				if err := json.Unmarshal(raw, &p); err != nil {
					t.Fatal(err)
				}
				if got := r.pools[addr]; got != p.Generation {
					t.Errorf("%s: pool generation %d, want %d", where, got, p.Generation)
				}
			case "error":
				want := jsonString(t, raw)
				if sd.Error == nil || !strings.Contains(sd.Error.Error(), want) {
					t.Errorf("%s: error %v, want one containing %q", where, sd.Error, want)
				}
			default:
				t.Errorf("%s: server key %q not checked by this runner", where, key)
			}
		}
	}
}

// parseTestURI reads the hosts and the replicaSet, directConnection and
// loadBalanced options of the suite's mongodb:// URIs.
func parseTestURI(t *testing.T, uri string) Config {
	rest, ok := strings.CutPrefix(uri, "mongodb://")
	if !ok {
		t.Fatalf("uri %q: not mongodb://", uri)
	}
	hosts, query, _ := strings.Cut(rest, "?")
	hosts, _, _ = strings.Cut(hosts, "/")
	var cfg Config
	for h := range strings.SplitSeq(hosts, ",") {
		cfg.Seeds = append(cfg.Seeds, normalizeAddress(h))
	}
	for opt := range strings.SplitSeq(query, "&") {
		if opt == "" {
			continue
		}
		k, v, _ := strings.Cut(opt, "=")
		switch strings.ToLower(k) {
		case "replicaset":
			cfg.SetName = v
		case "directconnection":
			cfg.DirectConnection = v == "true"
		case "loadbalanced":
			cfg.LoadBalanced = v == "true"
		default:
			t.Fatalf("uri %q: option %q not understood", uri, k)
		}
	}
	return cfg
}

// extDoc reads an extended JSON document (relaxed: plain numbers are int32
// or int64 as BSON would have them).
func extDoc(t *testing.T, raw json.RawMessage) bsoncore.Document {
	var d bson.D
	if err := bson.UnmarshalExtJSON(raw, false, &d); err != nil {
		t.Fatalf("%s: %v", raw, err)
	}
	b, err := bson.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// extValue reads one extended JSON value.
func extValue(t *testing.T, raw json.RawMessage) bsoncore.Value {
	doc := extDoc(t, json.RawMessage(`{"v":`+string(raw)+`}`))
	return doc.Lookup("v")
}

// jsonString reads a string; null and an absent key give "".
func jsonString(t *testing.T, raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var s *string
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatalf("%s: %v", raw, err)
	}
	if s == nil {
		return ""
	}
	return *s
}

func checkInt(t *testing.T, phase int, what string, got *int64, raw json.RawMessage) {
	t.Helper()
	v := extValue(t, raw)
	if v.Type == bsoncore.TypeNull {
		if got != nil && !(strings.HasSuffix(what, "WireVersion") && *got == 0) {
			t.Errorf("phase %d: %s %d, want null", phase, what, *got)
		}
		return
	}
	want, err := int64Value(what, v)
	if err != nil {
		t.Fatal(err)
	}
	if got == nil || *got != want {
		t.Errorf("phase %d: %s %v, want %d", phase, what, fmtPtr(got), want)
	}
}

func checkOID(t *testing.T, phase int, what string, got *bson.ObjectID, raw json.RawMessage) {
	t.Helper()
	v := extValue(t, raw)
	if v.Type == bsoncore.TypeNull {
		if got != nil {
			t.Errorf("phase %d: %s %s, want null", phase, what, got.Hex())
		}
		return
	}
	want, ok := v.ObjectIDOK()
	if !ok {
		t.Fatalf("%s: %s is not an ObjectId", what, raw)
	}
	if got == nil || *got != bson.ObjectID(want) {
		t.Errorf("phase %d: %s %v, want %s", phase, what, fmtPtr(got), bson.ObjectID(want).Hex())
	}
}

func checkTV(t *testing.T, phase int, addr string, got *TopologyVersion, raw json.RawMessage) {
	t.Helper()
	want, err := ParseTopologyVersion(extValue(t, raw))
	if err != nil {
		t.Fatal(err)
	}
	if !equalPtr(got, want) {
		t.Errorf("phase %d: %s topologyVersion %v, want %v", phase, addr, fmtPtr(got), fmtPtr(want))
	}
}

func fmtPtr[T any](p *T) any {
	if p == nil {
		return "null"
	}
	return *p
}
