// Unit tests of the $readPreference parser and of Validate beyond what the
// official suites cover (those only send well-formed documents), and the
// parser's fuzz target.

package sdam_test

import (
	"errors"
	"maps"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/sdam"
)

func rpDoc(t testing.TB, d bson.D) bsoncore.Document {
	t.Helper()
	raw, err := bson.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func TestParseReadPrefValid(t *testing.T) {
	cases := []struct {
		name string
		doc  bson.D
		want sdam.ReadPref
	}{
		{"primary", bson.D{{Key: "mode", Value: "primary"}}, sdam.ReadPref{}},
		{"primaryPreferred", bson.D{{Key: "mode", Value: "primaryPreferred"}}, sdam.ReadPref{Mode: sdam.PrimaryPreferred}},
		{"secondary", bson.D{{Key: "mode", Value: "secondary"}}, sdam.ReadPref{Mode: sdam.Secondary}},
		{"secondaryPreferred", bson.D{{Key: "mode", Value: "secondaryPreferred"}}, sdam.ReadPref{Mode: sdam.SecondaryPreferred}},
		{"nearest", bson.D{{Key: "mode", Value: "nearest"}}, sdam.ReadPref{Mode: sdam.Nearest}},
		{"tags in order, empty set kept", bson.D{{Key: "mode", Value: "secondary"}, {Key: "tags", Value: bson.A{
			bson.D{{Key: "dc", Value: "ny"}, {Key: "rack", Value: "1"}}, bson.D{}}}},
			sdam.ReadPref{Mode: sdam.Secondary, TagSets: []sdam.TagSet{{"dc": "ny", "rack": "1"}, {}}}},
		{"maxStaleness int32", bson.D{{Key: "mode", Value: "nearest"}, {Key: "maxStalenessSeconds", Value: int32(120)}},
			sdam.ReadPref{Mode: sdam.Nearest, MaxStaleness: 120 * time.Second}},
		{"maxStaleness int64", bson.D{{Key: "mode", Value: "nearest"}, {Key: "maxStalenessSeconds", Value: int64(90)}},
			sdam.ReadPref{Mode: sdam.Nearest, MaxStaleness: 90 * time.Second}},
		{"maxStaleness integral double", bson.D{{Key: "mode", Value: "nearest"}, {Key: "maxStalenessSeconds", Value: 100.0}},
			sdam.ReadPref{Mode: sdam.Nearest, MaxStaleness: 100 * time.Second}},
		{"maxStaleness -1 is none", bson.D{{Key: "mode", Value: "secondary"}, {Key: "maxStalenessSeconds", Value: int32(-1)}},
			sdam.ReadPref{Mode: sdam.Secondary}},
		{"maxStaleness -1.0 is none", bson.D{{Key: "mode", Value: "secondary"}, {Key: "maxStalenessSeconds", Value: -1.0}},
			sdam.ReadPref{Mode: sdam.Secondary}},
		{"maxStaleness huge int64 clamps", bson.D{{Key: "mode", Value: "secondary"}, {Key: "maxStalenessSeconds", Value: int64(math.MaxInt64)}},
			sdam.ReadPref{Mode: sdam.Secondary, MaxStaleness: time.Duration(math.MaxInt64)}},
		{"maxStaleness huge double clamps", bson.D{{Key: "mode", Value: "secondary"}, {Key: "maxStalenessSeconds", Value: 1e300}},
			sdam.ReadPref{Mode: sdam.Secondary, MaxStaleness: time.Duration(math.MaxInt64)}},
		{"hedge ignored", bson.D{{Key: "mode", Value: "nearest"}, {Key: "hedge", Value: bson.D{{Key: "enabled", Value: true}}}},
			sdam.ReadPref{Mode: sdam.Nearest}},
		{"unknown fields ignored", bson.D{{Key: "future", Value: 1}, {Key: "mode", Value: "secondary"}, {Key: "tags", Value: bson.A{bson.D{{Key: "a", Value: "b"}}}}},
			sdam.ReadPref{Mode: sdam.Secondary, TagSets: []sdam.TagSet{{"a": "b"}}}},
		{"primary with only empty tag sets", bson.D{{Key: "mode", Value: "primary"}, {Key: "tags", Value: bson.A{bson.D{}}}},
			sdam.ReadPref{TagSets: []sdam.TagSet{{}}}},
		{"primary with maxStaleness -1", bson.D{{Key: "mode", Value: "primary"}, {Key: "maxStalenessSeconds", Value: int32(-1)}},
			sdam.ReadPref{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := sdam.ParseReadPref(rpDoc(t, c.doc))
			if err != nil {
				t.Fatalf("ParseReadPref: %v", err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("got %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestParseReadPrefErrors(t *testing.T) {
	sec := bson.E{Key: "mode", Value: "secondary"}
	cases := []struct {
		name  string
		doc   bsoncore.Document // when set, used instead of d
		d     bson.D
		field string
		kind  error
		says  string
	}{
		{name: "empty document", d: bson.D{}, field: "mode", says: "missing"},
		{name: "mode in Pascal case", d: bson.D{{Key: "mode", Value: "Secondary"}}, field: "mode", says: `unknown mode "Secondary"`},
		{name: "mode in lower case", d: bson.D{{Key: "mode", Value: "secondarypreferred"}}, field: "mode", says: "unknown mode"},
		{name: "mode empty", d: bson.D{{Key: "mode", Value: ""}}, field: "mode", says: "unknown mode"},
		{name: "mode not a string", d: bson.D{{Key: "mode", Value: int32(1)}}, field: "mode", says: "must be a string"},
		{name: "mode twice", d: bson.D{sec, {Key: "mode", Value: "nearest"}}, field: "mode", says: "more than once"},
		{name: "tags not an array", d: bson.D{sec, {Key: "tags", Value: bson.D{{Key: "dc", Value: "ny"}}}}, field: "tags", says: "must be an array"},
		{name: "tags empty", d: bson.D{sec, {Key: "tags", Value: bson.A{}}}, field: "tags", says: "at least one"},
		{name: "tag set not a document", d: bson.D{sec, {Key: "tags", Value: bson.A{"dc:ny"}}}, field: "tags", says: "element 0 must be a document"},
		{name: "tag value not a string", d: bson.D{sec, {Key: "tags", Value: bson.A{bson.D{}, bson.D{{Key: "rack", Value: int32(1)}}}}}, field: "tags", says: `tag "rack" of set 1 must be a string`},
		{name: "tag twice in a set", d: bson.D{sec, {Key: "tags", Value: bson.A{bson.D{{Key: "dc", Value: "ny"}, {Key: "dc", Value: "sf"}}}}}, field: "tags", says: "appears twice"},
		{name: "tags twice", d: bson.D{sec, {Key: "tags", Value: bson.A{bson.D{}}}, {Key: "tags", Value: bson.A{bson.D{}}}}, field: "tags", says: "more than once"},
		{name: "maxStaleness zero", d: bson.D{sec, {Key: "maxStalenessSeconds", Value: int32(0)}}, field: "maxStalenessSeconds", says: "got 0"},
		{name: "maxStaleness -2", d: bson.D{sec, {Key: "maxStalenessSeconds", Value: int64(-2)}}, field: "maxStalenessSeconds", says: "got -2"},
		{name: "maxStaleness -2.0", d: bson.D{sec, {Key: "maxStalenessSeconds", Value: -2.0}}, field: "maxStalenessSeconds", says: "got -2"},
		{name: "maxStaleness 0.5", d: bson.D{sec, {Key: "maxStalenessSeconds", Value: 0.5}}, field: "maxStalenessSeconds", says: "must be an integer, got 0.5"},
		{name: "maxStaleness fraction", d: bson.D{sec, {Key: "maxStalenessSeconds", Value: 120.5}}, field: "maxStalenessSeconds", says: "must be an integer"},
		{name: "maxStaleness NaN", d: bson.D{sec, {Key: "maxStalenessSeconds", Value: math.NaN()}}, field: "maxStalenessSeconds", says: "must be an integer"},
		{name: "maxStaleness infinite", d: bson.D{sec, {Key: "maxStalenessSeconds", Value: math.Inf(1)}}, field: "maxStalenessSeconds", says: "must be an integer"},
		{name: "maxStaleness a string", d: bson.D{sec, {Key: "maxStalenessSeconds", Value: "120"}}, field: "maxStalenessSeconds", says: "must be a number"},
		{name: "maxStaleness twice", d: bson.D{sec, {Key: "maxStalenessSeconds", Value: int32(120)}, {Key: "maxStalenessSeconds", Value: int32(120)}}, field: "maxStalenessSeconds", says: "more than once"},
		{name: "hedge not a document", d: bson.D{sec, {Key: "hedge", Value: true}}, field: "hedge", says: "must be a document"},
		{name: "hedge twice", d: bson.D{sec, {Key: "hedge", Value: bson.D{}}, {Key: "hedge", Value: bson.D{}}}, field: "hedge", says: "more than once"},
		{name: "primary with tags", d: bson.D{{Key: "mode", Value: "primary"}, {Key: "tags", Value: bson.A{bson.D{}, bson.D{{Key: "dc", Value: "ny"}}}}}, field: "tags", kind: sdam.ErrPrimaryWithOptions, says: `{"dc": "ny"}`},
		{name: "primary with maxStaleness", d: bson.D{{Key: "mode", Value: "primary"}, {Key: "maxStalenessSeconds", Value: int32(120)}}, field: "maxStalenessSeconds", kind: sdam.ErrPrimaryWithOptions, says: "mode primary"},
		{name: "primary with hedge", d: bson.D{{Key: "hedge", Value: bson.D{}}, {Key: "mode", Value: "primary"}}, field: "hedge", kind: sdam.ErrPrimaryWithOptions, says: "mode primary"},
		{name: "truncated document", doc: bsoncore.Document{0x10, 0, 0, 0, 0x02, 'm'}, says: "malformed document"},
		{name: "length past the end", doc: bsoncore.Document{0xff, 0, 0, 0, 0}, says: "malformed document"},
		{name: "nil document", doc: bsoncore.Document{}, says: "malformed document"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			doc := c.doc
			if doc == nil {
				doc = rpDoc(t, c.d)
			}
			rp, err := sdam.ParseReadPref(doc)
			if err == nil {
				t.Fatalf("no error, got %+v", rp)
			}
			if !reflect.DeepEqual(rp, sdam.ReadPref{}) {
				t.Errorf("a failed parse returned %+v, want the zero ReadPref", rp)
			}
			var rpe *sdam.ReadPrefError
			if !errors.As(err, &rpe) || !errors.Is(err, sdam.ErrInvalidReadPref) {
				t.Fatalf("error %T %v is not a *ReadPrefError matching ErrInvalidReadPref", err, err)
			}
			if rpe.Field != c.field {
				t.Errorf("Field = %q, want %q (%v)", rpe.Field, c.field, err)
			}
			if c.kind != nil && !errors.Is(err, c.kind) {
				t.Errorf("error %v does not match %v", err, c.kind)
			}
			if c.kind == nil && (errors.Is(err, sdam.ErrPrimaryWithOptions) || errors.Is(err, sdam.ErrMaxStalenessTooSmall)) {
				t.Errorf("error %v matches a kind it should not", err)
			}
			if !strings.Contains(err.Error(), c.says) {
				t.Errorf("error %q does not say %q", err, c.says)
			}
		})
	}
}

func TestParseModeNames(t *testing.T) {
	for m := sdam.Primary; m <= sdam.Nearest; m++ {
		got, err := sdam.ParseMode(m.String())
		if err != nil || got != m {
			t.Errorf("ParseMode(%q) = %v, %v", m.String(), got, err)
		}
	}
	if s := sdam.Mode(42).String(); s != "Mode(42)" {
		t.Errorf("Mode(42).String() = %q", s)
	}
	long := strings.Repeat("x", 10_000)
	_, err := sdam.ParseMode(long)
	if err == nil || len(err.Error()) > 300 {
		t.Errorf("ParseMode of a long name: error %d bytes long: %.100v", len(err.Error()), err)
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		name      string
		rp        sdam.ReadPref
		heartbeat time.Duration
		kind      error // nil: valid
	}{
		{"default", sdam.ReadPref{}, 10 * time.Second, nil},
		{"no max staleness", sdam.ReadPref{Mode: sdam.Nearest}, time.Hour, nil},
		{"smallest", sdam.ReadPref{Mode: sdam.Secondary, MaxStaleness: 90 * time.Second}, 10 * time.Second, nil},
		{"below smallest", sdam.ReadPref{Mode: sdam.Secondary, MaxStaleness: 89 * time.Second}, 500 * time.Millisecond, sdam.ErrMaxStalenessTooSmall},
		{"heartbeat plus idle write exactly", sdam.ReadPref{Mode: sdam.Secondary, MaxStaleness: 130 * time.Second}, 120 * time.Second, nil},
		{"below heartbeat plus idle write", sdam.ReadPref{Mode: sdam.Secondary, MaxStaleness: 129 * time.Second}, 120 * time.Second, sdam.ErrMaxStalenessTooSmall},
		{"primary with max staleness", sdam.ReadPref{MaxStaleness: 120 * time.Second}, 10 * time.Second, sdam.ErrPrimaryWithOptions},
		{"primary with tags", sdam.ReadPref{TagSets: []sdam.TagSet{{"dc": "ny"}}}, 10 * time.Second, sdam.ErrPrimaryWithOptions},
		{"primary with empty tag set", sdam.ReadPref{TagSets: []sdam.TagSet{{}}}, 10 * time.Second, nil},
		{"negative max staleness", sdam.ReadPref{Mode: sdam.Secondary, MaxStaleness: -time.Second}, 10 * time.Second, sdam.ErrInvalidReadPref},
		{"unknown mode", sdam.ReadPref{Mode: 9}, 10 * time.Second, sdam.ErrInvalidReadPref},
	}
	for _, c := range cases {
		err := c.rp.Validate(c.heartbeat)
		if (err == nil) != (c.kind == nil) || (c.kind != nil && !errors.Is(err, c.kind)) {
			t.Errorf("%s: Validate = %v, want %v", c.name, err, c.kind)
		}
	}
}

func TestReadPrefString(t *testing.T) {
	rp := sdam.ReadPref{Mode: sdam.SecondaryPreferred, TagSets: []sdam.TagSet{{"rack": "1", "dc": "ny"}, {}}, MaxStaleness: 120 * time.Second}
	want := `secondaryPreferred tagSets=[{"dc": "ny", "rack": "1"}, {}] maxStalenessSeconds=120`
	if got := rp.String(); got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if got := (sdam.ReadPref{}).String(); got != "primary" {
		t.Errorf("zero ReadPref String() = %q", got)
	}
}

// tagSetsBSON writes tag sets as $readPreference's tags, each set's keys
// sorted (a map keeps no order).
func tagSetsBSON(sets []map[string]string) bson.A {
	tags := bson.A{}
	for _, ts := range sets {
		set := bson.D{}
		for _, k := range slices.Sorted(maps.Keys(ts)) {
			set = append(set, bson.E{Key: k, Value: ts[k]})
		}
		tags = append(tags, set)
	}
	return tags
}

// rpEncode is the inverse of ParseReadPref for the fuzz target's round
// trip: tags sorted by key (a TagSet keeps no order).
func rpEncode(rp sdam.ReadPref) bson.D {
	d := bson.D{{Key: "mode", Value: rp.Mode.String()}}
	if len(rp.TagSets) > 0 {
		tags := make([]map[string]string, len(rp.TagSets))
		for i, ts := range rp.TagSets {
			tags[i] = ts
		}
		d = append(d, bson.E{Key: "tags", Value: tagSetsBSON(tags)})
	}
	if rp.MaxStaleness > 0 {
		d = append(d, bson.E{Key: "maxStalenessSeconds", Value: int64(rp.MaxStaleness / time.Second)})
	}
	return d
}

// FuzzParseReadPref: no input panics; an accepted document gives a valid
// mode, a non-negative whole-second max staleness, satisfies the mode rule,
// survives encoding and parsing again unchanged, and can drive selection.
func FuzzParseReadPref(f *testing.F) {
	seeds := []bson.D{
		{{Key: "mode", Value: "primary"}},
		{{Key: "mode", Value: "nearest"}, {Key: "tags", Value: bson.A{bson.D{{Key: "dc", Value: "ny"}}, bson.D{}}}, {Key: "maxStalenessSeconds", Value: int32(120)}},
		{{Key: "mode", Value: "secondaryPreferred"}, {Key: "maxStalenessSeconds", Value: -1.0}, {Key: "hedge", Value: bson.D{{Key: "enabled", Value: true}}}},
		{{Key: "mode", Value: "primaryPreferred"}, {Key: "maxStalenessSeconds", Value: int64(1 << 62)}},
		{{Key: "mode", Value: "primary"}, {Key: "tags", Value: bson.A{bson.D{{Key: "a", Value: "b"}}}}},
		{{Key: "mode", Value: "secondary"}, {Key: "tags", Value: bson.A{bson.D{{Key: "a", Value: "b"}, {Key: "a", Value: "c"}}}}},
		{{Key: "mode", Value: "secondary"}, {Key: "maxStalenessSeconds", Value: 0.5}},
		{{Key: "mode", Value: "Nearest"}},
		{{Key: "tags", Value: bson.A{}}},
	}
	for _, s := range seeds {
		f.Add([]byte(rpDoc(f, s)))
	}
	f.Add([]byte{0x05, 0, 0, 0, 0})
	f.Add([]byte{0x10, 0, 0, 0, 0x02, 'm'})
	td := &sdam.TopologyDescription{Type: sdam.ReplicaSetWithPrimary, Servers: []sdam.ServerDescription{
		{Address: "a:1", Type: sdam.RSPrimary, HasRTT: true, AvgRTT: time.Millisecond, LastUpdateTime: time.Unix(100, 0), LastWriteDate: time.Unix(99, 0)},
		{Address: "b:1", Type: sdam.RSSecondary, HasRTT: true, AvgRTT: 2 * time.Millisecond, Tags: map[string]string{"dc": "ny"}, LastUpdateTime: time.Unix(100, 0), LastWriteDate: time.Unix(50, 0)},
	}}
	f.Fuzz(func(t *testing.T, data []byte) {
		rp, err := sdam.ParseReadPref(data)
		if err != nil {
			var rpe *sdam.ReadPrefError
			if !errors.As(err, &rpe) || !errors.Is(err, sdam.ErrInvalidReadPref) {
				t.Fatalf("untyped error %T %v", err, err)
			}
			_ = err.Error()
			return
		}
		if rp.Mode < sdam.Primary || rp.Mode > sdam.Nearest {
			t.Fatalf("mode %v out of range", rp.Mode)
		}
		if rp.MaxStaleness < 0 || (rp.MaxStaleness%time.Second != 0 && rp.MaxStaleness != time.Duration(math.MaxInt64)) {
			t.Fatalf("max staleness %v", rp.MaxStaleness)
		}
		if err := rp.Validate(0); err != nil && !errors.Is(err, sdam.ErrMaxStalenessTooSmall) {
			t.Fatalf("accepted a read preference Validate refuses: %v", err)
		}
		if rp.MaxStaleness != time.Duration(math.MaxInt64) {
			again, err := sdam.ParseReadPref(rpDoc(t, rpEncode(rp)))
			if err != nil {
				t.Fatalf("re-encoded %v fails: %v", rp, err)
			}
			if len(rp.TagSets) == 0 {
				again.TagSets, rp.TagSets = nil, nil
			}
			if !reflect.DeepEqual(again, rp) {
				t.Fatalf("round trip: %+v became %+v", rp, again)
			}
		}
		_ = rp.String()
		for _, write := range []bool{false, true} {
			s, _ := sdam.SuitableServers(td, write, rp, 10*time.Second, time.Unix(200, 0))
			_ = sdam.PickInWindow(sdam.InLatencyWindow(s, sdam.DefaultLocalThreshold), nil, nil)
		}
	})
}

// Problems lists every broken rule (the configuration reports them all at
// once); Validate is its first, and a heartbeat floor matches both kinds.
func TestReadPrefProblems(t *testing.T) {
	rp := sdam.ReadPref{Mode: sdam.Primary, MaxStaleness: 30 * time.Second, TagSets: []sdam.TagSet{{"dc": "east"}}}
	errs := rp.Problems(10 * time.Second)
	if len(errs) != 3 || errs[0].Field != "maxStalenessSeconds" || errs[1].Field != "tags" || !errors.Is(errs[2], sdam.ErrMaxStalenessTooSmall) {
		t.Fatalf("Problems = %v, want max staleness with primary, tags with primary, too small", errs)
	}
	if err := rp.Validate(10 * time.Second); err != errs[0] && err.Error() != errs[0].Error() {
		t.Fatalf("Validate = %v, want the first problem %v", err, errs[0])
	}
	floor := sdam.ReadPref{Mode: sdam.Nearest, MaxStaleness: 95 * time.Second}.Validate(90 * time.Second)
	if !errors.Is(floor, sdam.ErrMaxStalenessBelowHeartbeat) || !errors.Is(floor, sdam.ErrMaxStalenessTooSmall) {
		t.Fatalf("below heartbeat + idle write: %v, want both kinds", floor)
	}
	if errs := (sdam.ReadPref{Mode: sdam.Nearest, MaxStaleness: 100 * time.Second}).Problems(90 * time.Second); errs != nil {
		t.Fatalf("at the floor: %v, want none", errs)
	}
}
