package gate

import (
	"errors"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// Before a login the smaller of the two limits holds, after it
// max_message_size; the size error names the pre-login limit only when it
// is the one exceeded.
func TestReadLimitAndSizeError(t *testing.T) {
	if got := PreLoginLimit(0); got != DefaultMaxPreLoginMessageSize {
		t.Fatalf("unset pre-login limit %d", got)
	}
	if got := ReadLimit(true, 48_000_000, PreLoginLimit(20_000)); got != 20_000 {
		t.Fatalf("limit before login %d, want 20000", got)
	}
	if got := ReadLimit(true, 10_000, 20_000); got != 10_000 {
		t.Fatalf("limit before login under a smaller max_message_size %d", got)
	}
	if got := ReadLimit(false, 48_000_000, 20_000); got != 48_000_000 {
		t.Fatalf("limit after login %d", got)
	}
	if err := SizeError(30_000, 20_000, true); !strings.Contains(err.Error(), "max_prelogin_message_size") || !errors.Is(err, wire.ErrMessageTooLarge) {
		t.Fatalf("pre-login size error: %v", err)
	}
	if err := SizeError(3, 20_000, true); strings.Contains(err.Error(), "max_prelogin_message_size") {
		t.Fatalf("a message under the header's size blamed on the pre-login limit: %v", err)
	}
}

// Only ping and buildInfo are answered before a login, and never on the
// admin console's database or without one.
func TestPreLoginAnswered(t *testing.T) {
	for _, tc := range []struct {
		name, db string
		want     bool
	}{
		{"ping", "shop", true}, {"buildInfo", "shop", true}, {"buildinfo", "x", true},
		{"ping", "", false}, {"ping", "pgbouncer", false}, {"find", "shop", false}, {"hello", "shop", false},
	} {
		if got := PreLoginAnswered(tc.name, tc.db, "pgbouncer"); got != tc.want {
			t.Errorf("%s on %q: %v, want %v", tc.name, tc.db, got, tc.want)
		}
	}
}

// buildInfo before a login names the release series the wire version
// guarantees, and the hello's document limit.
func TestBuildInfo(t *testing.T) {
	for _, tc := range []struct {
		wire int32
		want string
	}{{25, "8.0.0"}, {24, "7.0.0"}, {21, "7.0.0"}, {13, "5.0.0"}, {9, "4.4.0"}, {6, "3.6.0"}, {0, "3.6.0"}} {
		doc := BuildInfo(tc.wire, 16<<20)
		if v, _ := doc.Lookup("version").StringValueOK(); v != tc.want {
			t.Errorf("wire %d: version %q, want %q", tc.wire, v, tc.want)
		}
		if n, _ := doc.Lookup("maxBsonObjectSize").Int32OK(); n != 16<<20 {
			t.Errorf("maxBsonObjectSize %d", n)
		}
		if err := bsoncore.Document(doc).Validate(); err != nil {
			t.Fatal(err)
		}
	}
}
