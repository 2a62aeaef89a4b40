// The runners of the official server selection, in_window and max
// staleness suites (../shared/specs/server-selection and max-staleness),
// read at run time through specdir; nothing of the suites is copied here.
// Each file's read_preference is turned into a $readPreference document and
// goes through ParseReadPref, so the parser is exercised by the suites too.

package sdam_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/sdam"
	"github.com/mongobouncer/mongobouncer/internal/testutil/specdir"
)

// selSpecHeartbeat is the heartbeatFrequencyMS of a multi-threaded client,
// used when a file gives none (the max staleness README says to take the
// driver's default).
const selSpecHeartbeat = 10 * time.Second

// selSpecNow is the time passed to selection. The files stamp every server
// they rely on with lastUpdateTime, so it must not matter; it is far from
// their values to show that it does not.
var selSpecNow = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// selNumberLong is an int64 written either as a JSON number or as extended
// JSON {"$numberLong": "..."}.
type selNumberLong int64

func (n *selNumberLong) UnmarshalJSON(b []byte) error {
	var wrapped struct {
		NumberLong string `json:"$numberLong"`
	}
	if bytes.HasPrefix(bytes.TrimSpace(b), []byte("{")) {
		if err := json.Unmarshal(b, &wrapped); err != nil {
			return err
		}
		v, err := strconv.ParseInt(wrapped.NumberLong, 10, 64)
		*n = selNumberLong(v)
		return err
	}
	var v int64
	err := json.Unmarshal(b, &v)
	*n = selNumberLong(v)
	return err
}

type selSpecServer struct {
	Address        string            `json:"address"`
	Type           string            `json:"type"`
	AvgRTTMS       *float64          `json:"avg_rtt_ms"`
	Tags           map[string]string `json:"tags"`
	LastUpdateTime *selNumberLong    `json:"lastUpdateTime"`
	MaxWireVersion *int32            `json:"maxWireVersion"`
	LastWrite      *struct {
		LastWriteDate selNumberLong `json:"lastWriteDate"`
	} `json:"lastWrite"`
}

type selSpecTopology struct {
	Type    string          `json:"type"`
	Servers []selSpecServer `json:"servers"`
}

type selSpecReadPref struct {
	Mode                *string             `json:"mode"`
	TagSets             []map[string]string `json:"tag_sets"`
	MaxStalenessSeconds *json.Number        `json:"maxStalenessSeconds"`
}

// selSpecFile is a server_selection or max-staleness file. Unknown fields
// are refused, so a field the suites add cannot be ignored silently.
type selSpecFile struct {
	HeartbeatFrequencyMS *int64           `json:"heartbeatFrequencyMS"`
	Topology             selSpecTopology  `json:"topology_description"`
	Operation            string           `json:"operation"`
	ReadPreference       selSpecReadPref  `json:"read_preference"`
	Deprioritized        []selSpecServer  `json:"deprioritized_servers"`
	Suitable             *[]selSpecServer `json:"suitable_servers"`
	InLatencyWindow      *[]selSpecServer `json:"in_latency_window"`
	Error                bool             `json:"error"`
}

// selInWindowFile is an in_window file.
type selInWindowFile struct {
	Description string          `json:"description"`
	Topology    selSpecTopology `json:"topology_description"`
	Mocked      []struct {
		Address        string `json:"address"`
		OperationCount int    `json:"operation_count"`
	} `json:"mocked_topology_state"`
	Iterations int `json:"iterations"`
	Outcome    struct {
		Tolerance           float64            `json:"tolerance"`
		ExpectedFrequencies map[string]float64 `json:"expected_frequencies"`
	} `json:"outcome"`
}

func selDecode(t *testing.T, path string, v any) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("decode %s: %v", path, err)
	}
}

func selServerType(t *testing.T, name string) sdam.ServerType {
	t.Helper()
	for st := sdam.Unknown; st <= sdam.LoadBalancer; st++ {
		if st.String() == name {
			return st
		}
	}
	t.Fatalf("unknown server type %q", name)
	return 0
}

func selTopologyType(t *testing.T, name string) sdam.TopologyType {
	t.Helper()
	for tt := sdam.TopologyUnknown; tt <= sdam.LoadBalanced; tt++ {
		if tt.String() == name {
			return tt
		}
	}
	t.Fatalf("unknown topology type %q", name)
	return 0
}

func selMillis(ms float64) time.Duration {
	return time.Duration(math.Round(ms * float64(time.Millisecond)))
}

func selServer(t *testing.T, s selSpecServer) sdam.ServerDescription {
	t.Helper()
	sd := sdam.ServerDescription{Address: s.Address, Type: selServerType(t, s.Type), Tags: s.Tags}
	if s.AvgRTTMS != nil {
		sd.AvgRTT, sd.HasRTT = selMillis(*s.AvgRTTMS), true
	}
	if s.LastUpdateTime != nil {
		sd.LastUpdateTime = time.UnixMilli(int64(*s.LastUpdateTime))
	}
	if s.LastWrite != nil {
		sd.LastWriteDate = time.UnixMilli(int64(s.LastWrite.LastWriteDate))
	}
	if s.MaxWireVersion != nil {
		sd.MaxWireVersion = *s.MaxWireVersion
	}
	return sd
}

func selTopology(t *testing.T, st selSpecTopology) *sdam.TopologyDescription {
	t.Helper()
	td := &sdam.TopologyDescription{Type: selTopologyType(t, st.Type)}
	for _, s := range st.Servers {
		td.Servers = append(td.Servers, selServer(t, s))
	}
	return td
}

// selReadPrefDoc turns a file's read_preference into the $readPreference
// document a driver would send: the files spell modes in Pascal case
// ("SecondaryPreferred"), the document in camel case; a missing mode is
// the default, primary; tag_sets is sent as tags.
func selReadPrefDoc(t *testing.T, rp selSpecReadPref) bsoncore.Document {
	t.Helper()
	mode := "primary"
	if rp.Mode != nil {
		mode = strings.ToLower((*rp.Mode)[:1]) + (*rp.Mode)[1:]
	}
	d := bson.D{{Key: "mode", Value: mode}}
	if rp.TagSets != nil {
		d = append(d, bson.E{Key: "tags", Value: tagSetsBSON(rp.TagSets)})
	}
	if rp.MaxStalenessSeconds != nil {
		n, err := rp.MaxStalenessSeconds.Int64()
		if err != nil {
			t.Fatalf("maxStalenessSeconds %s: %v", *rp.MaxStalenessSeconds, err)
		}
		d = append(d, bson.E{Key: "maxStalenessSeconds", Value: n})
	}
	raw, err := bson.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// selAddrs renders servers as a sorted "address type" list, the form the
// runners compare (the files give sets).
func selAddrs(servers []sdam.ServerDescription) []string {
	out := make([]string, 0, len(servers))
	for _, s := range servers {
		out = append(out, s.Address+" "+s.Type.String())
	}
	slices.Sort(out)
	return out
}

func selExpected(t *testing.T, servers []selSpecServer) []string {
	t.Helper()
	sds := make([]sdam.ServerDescription, 0, len(servers))
	for _, s := range servers {
		sds = append(sds, sdam.ServerDescription{Address: s.Address, Type: selServerType(t, s.Type)})
	}
	return selAddrs(sds)
}

// selRun runs one server_selection or max-staleness file.
func selRun(t *testing.T, path string) {
	var f selSpecFile
	selDecode(t, path, &f)
	td := selTopology(t, f.Topology)
	heartbeat := selSpecHeartbeat
	if f.HeartbeatFrequencyMS != nil {
		heartbeat = time.Duration(*f.HeartbeatFrequencyMS) * time.Millisecond
	}
	var write bool
	switch f.Operation {
	case "", "read": // max-staleness files are all reads and do not say
	case "write":
		write = true
	default:
		t.Fatalf("unknown operation %q", f.Operation)
	}
	var deprioritized []string
	for _, s := range f.Deprioritized {
		deprioritized = append(deprioritized, s.Address)
	}

	rp, err := sdam.ParseReadPref(selReadPrefDoc(t, f.ReadPreference))
	var suitable []sdam.ServerDescription
	if err == nil {
		suitable, err = sdam.SuitableServersDeprioritized(td, write, rp, heartbeat, selSpecNow, deprioritized)
	}
	if f.Error {
		if err == nil {
			t.Fatalf("want an error, got none (suitable %v)", selAddrs(suitable))
		}
		if !errors.Is(err, sdam.ErrInvalidReadPref) {
			t.Fatalf("want an invalid read preference error, got %T %v", err, err)
		}
		t.Logf("error as expected: %v", err)
		return
	}
	if err != nil {
		t.Fatalf("selection: %v", err)
	}
	if f.Suitable == nil || f.InLatencyWindow == nil {
		t.Fatal("file has neither error nor suitable_servers and in_latency_window")
	}
	if got, want := selAddrs(suitable), selExpected(t, *f.Suitable); !slices.Equal(got, want) {
		t.Errorf("suitable servers: got %v, want %v", got, want)
	}
	window := sdam.InLatencyWindow(suitable, sdam.DefaultLocalThreshold)
	if got, want := selAddrs(window), selExpected(t, *f.InLatencyWindow); !slices.Equal(got, want) {
		t.Errorf("in latency window: got %v, want %v", got, want)
	}
	if len(deprioritized) == 0 {
		// Without deprioritized servers both entry points must agree.
		plain, err := sdam.SuitableServers(td, write, rp, heartbeat, selSpecNow)
		if err != nil || !slices.Equal(selAddrs(plain), selAddrs(suitable)) {
			t.Errorf("SuitableServers = %v, %v; SuitableServersDeprioritized gave %v", selAddrs(plain), err, selAddrs(suitable))
		}
	}
}

// selRunTree runs every file matching pattern under the suite directory,
// one subtest per file named by its path without ".json".
func selRunTree(t *testing.T, dir, pattern string) {
	files := specdir.Files(t, dir, pattern)
	for _, path := range files {
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.ToSlash(strings.TrimSuffix(rel, ".json"))
		t.Run(name, func(t *testing.T) { selRun(t, path) })
	}
	t.Logf("%d files", len(files))
}

func TestServerSelectionSpec(t *testing.T) {
	selRunTree(t, specdir.Dir(t, "server-selection", "server_selection"), "*/*/*.json")
}

func TestMaxStalenessSpec(t *testing.T) {
	selRunTree(t, specdir.Dir(t, "max-staleness"), "*/*.json")
}

// TestServerSelectionInWindowSpec selects iterations times from each
// file's topology with mode nearest, the operation counts held at the
// mocked values, and compares the frequencies with the expected ones
// within the tolerance (exactly when 0 or 1). The RNG is seeded, so a run
// is reproducible.
func TestServerSelectionInWindowSpec(t *testing.T) {
	dir := specdir.Dir(t, "server-selection", "in_window")
	for _, path := range specdir.Files(t, dir, "*.json") {
		name := strings.TrimSuffix(filepath.Base(path), ".json")
		t.Run(name, func(t *testing.T) {
			var f selInWindowFile
			selDecode(t, path, &f)
			if f.Iterations <= 0 || f.Iterations > 1_000_000 {
				t.Fatalf("iterations %d out of the bounds of this runner", f.Iterations)
			}
			td := selTopology(t, f.Topology)
			counts := map[string]int{}
			for _, m := range f.Mocked {
				counts[m.Address] = m.OperationCount
			}
			suitable, err := sdam.SuitableServers(td, false, sdam.ReadPref{Mode: sdam.Nearest}, selSpecHeartbeat, selSpecNow)
			if err != nil {
				t.Fatal(err)
			}
			window := sdam.InLatencyWindow(suitable, sdam.DefaultLocalThreshold)
			inUse := func(addr string) int {
				c, ok := counts[addr]
				if !ok {
					t.Errorf("operation count asked for %q, which the file does not mock", addr)
				}
				return c
			}
			rng := rand.New(rand.NewPCG(1, 2))
			picked := map[string]int{}
			for range f.Iterations {
				picked[sdam.PickInWindow(window, inUse, rng.IntN).Address]++
			}
			for addr := range picked {
				if _, ok := f.Outcome.ExpectedFrequencies[addr]; !ok {
					t.Errorf("selected %q, which has no expected frequency", addr)
				}
			}
			for addr, want := range f.Outcome.ExpectedFrequencies {
				got := float64(picked[addr]) / float64(f.Iterations)
				ok := math.Abs(got-want) <= f.Outcome.Tolerance
				if want == 0 || want == 1 {
					ok = got == want
				}
				if !ok {
					t.Errorf("%s: frequency %.4f, want %v ± %v", addr, got, want, f.Outcome.Tolerance)
				}
			}
			t.Log(fmt.Sprint(picked))
		})
	}
}
