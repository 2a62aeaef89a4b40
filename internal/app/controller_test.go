package app

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/admin"
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
// ownFields are admin fields that app fills from elsewhere.
func sameFields(t *testing.T, from, to any, ownFields ...string) {
	t.Helper()
	src, dst := reflect.ValueOf(from), reflect.ValueOf(to)
	for i := range dst.NumField() {
		name := dst.Type().Field(i).Name
		if slices.Contains(ownFields, name) {
			continue
		}
		sf := src.FieldByName(name)
		if !sf.IsValid() {
			t.Errorf("%s.%s has no counterpart in %s: map it from metrics", dst.Type(), name, src.Type())
			continue
		}
		if got, want := dst.Field(i).Interface(), sf.Interface(); got != want {
			t.Errorf("%s.%s = %v, want %v", dst.Type(), name, got, want)
		}
	}
	if src.NumField()+len(ownFields) != dst.NumField() {
		t.Errorf("%s has %d fields, %s %d: a field is not mapped", src.Type(), src.NumField(), dst.Type(), dst.NumField())
	}
}

// SHOW STATS and SHOW SERVERS data cross from metrics to admin through
// app's mapping; it must carry every field unchanged.
func TestSnapshotMappingCarriesEveryField(t *testing.T) {
	var tot metrics.Totals
	fillDistinct(t, &tot)
	sameFields(t, tot, statsInfo(tot), "DBWaits", "DBEvictions", "UserClientRefused") // from the topologies and the proxy: e2e TestPassThroughMaxDBConnections, TestMaxUserClientConn

	var c metrics.ServerConn
	fillDistinct(t, &c)
	// Role comes from the topology: the server's role by route and
	// address, unknown for a server its route no longer has.
	roles := map[[2]string]string{{c.Route, c.Server}: admin.RoleSecondary}
	out := serverConnInfos([]metrics.ServerConn{c}, roles)
	if len(out) != 1 {
		t.Fatalf("got %d connections, want 1", len(out))
	}
	sameFields(t, c, out[0], "Role")
	if out[0].Role != admin.RoleSecondary {
		t.Errorf("role %q, want %q", out[0].Role, admin.RoleSecondary)
	}
	if out := serverConnInfos([]metrics.ServerConn{c}, nil); out[0].Role != admin.RoleUnknown {
		t.Errorf("role of a server the route no longer has: %q, want %q", out[0].Role, admin.RoleUnknown)
	}

	if serverConnInfos(nil, roles) != nil {
		t.Error("no connections must stay nil (null in the admin JSON)")
	}
}
