package app

import (
	"reflect"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/metrics"
)

// fillDistinct sets every field of the struct v points to a distinct
// non-zero value, so that a mapping that drops or swaps a field shows.
func fillDistinct(t *testing.T, v any) {
	t.Helper()
	s := reflect.ValueOf(v).Elem()
	for i := range s.NumField() {
		f, n := s.Field(i), int64(i+1)
		switch {
		case f.Type() == reflect.TypeFor[time.Time]():
			f.Set(reflect.ValueOf(time.Unix(1e9+n, 0)))
		case f.Kind() == reflect.String:
			f.SetString("v" + string(rune('a'+i)))
		case f.CanInt():
			f.SetInt(n)
		case f.CanUint():
			f.SetUint(uint64(n))
		default:
			t.Fatalf("%s.%s: no test value for %s", s.Type(), s.Type().Field(i).Name, f.Type())
		}
	}
}

// sameFields checks that every field of the admin snapshot got the value of
// the metrics field of the same name, and that none is left without one.
func sameFields(t *testing.T, from, to any) {
	t.Helper()
	src, dst := reflect.ValueOf(from), reflect.ValueOf(to)
	for i := range dst.NumField() {
		name := dst.Type().Field(i).Name
		sf := src.FieldByName(name)
		if !sf.IsValid() {
			t.Errorf("%s.%s has no counterpart in %s: map it from metrics", dst.Type(), name, src.Type())
			continue
		}
		if got, want := dst.Field(i).Interface(), sf.Interface(); got != want {
			t.Errorf("%s.%s = %v, want %v", dst.Type(), name, got, want)
		}
	}
	if src.NumField() != dst.NumField() {
		t.Errorf("%s has %d fields, %s %d: a field is not mapped", src.Type(), src.NumField(), dst.Type(), dst.NumField())
	}
}

// SHOW STATS and SHOW SERVERS data cross from metrics to admin through
// app's mapping; it must carry every field unchanged.
func TestSnapshotMappingCarriesEveryField(t *testing.T) {
	var tot metrics.Totals
	fillDistinct(t, &tot)
	sameFields(t, tot, statsInfo(tot))

	var c metrics.ServerConn
	fillDistinct(t, &c)
	out := serverConnInfos([]metrics.ServerConn{c})
	if len(out) != 1 {
		t.Fatalf("got %d connections, want 1", len(out))
	}
	sameFields(t, c, out[0])

	if serverConnInfos(nil) != nil {
		t.Error("no connections must stay nil (null in the admin JSON)")
	}
}
