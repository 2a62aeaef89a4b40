package e2e

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongobouncer/mongobouncer/internal/app"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// authCounter reads a mongobouncer_auth_* counter from the app's metrics.
func authCounter(t *testing.T, a *app.App, name, label, value string) float64 {
	t.Helper()
	mfs, err := a.Metrics().Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestAuthUserStaleCredentialsAndRestrictions (issue 27, items 6 and 9),
// through the whole stack with a driver: a password changed upstream
// works after one failed attempt (the failed proof looks the user up
// again; updateUser gave it a new salt, so the next attempt uses it) and
// the old one stops; a user dropped upstream stops after a failed proof
// even with its right password; authenticationRestrictions are checked
// against the client's real address (127.0.0.1 here); the metrics count.
func TestAuthUserStaleCredentialsAndRestrictions(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true, Users: []fakemongo.User{
			{Name: "svc", Password: "svc-pw"},
			{Name: "mbauth", Password: "mbauth-pw"},
			{Name: "upuser", Password: "up-pw"},
			{Name: "far", Password: "far-pw", Restrictions: []fakemongo.Restriction{{ClientSource: []string{"10.0.0.0/8"}}}},
			{Name: "near", Password: "near-pw", Restrictions: []fakemongo.Restriction{{ClientSource: []string{"127.0.0.0/8"}, ServerAddress: []string{"127.0.0.1"}}}},
		}})
		users := filepath.Join(t.TempDir(), "users.txt")
		if err := os.WriteFile(users, []byte(`"mbauth@admin" "mbauth-pw"`+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		extra := fmt.Sprintf("auth_type = \"scram\"\nauth_file = %q\nauth_user = \"mbauth@admin\"\nauth_user_service_routes = true\nauth_cache_ttl = \"1h\"\n", users)
		uri := fmt.Sprintf("mongodb://svc:svc-pw@%s/?directConnection=true", up.Addr())
		a, addr, _ := fileBouncerLogging(t, baseTOML(uri, extra), nil)
		ctx := ctxT(t, 60*time.Second)
		ping := func(user, pw string) error {
			err := authDriver(t, addr, "SCRAM-SHA-256", user, pw).Ping(ctx, nil)
			if err != nil {
				var ce mongo.CommandError
				if !errors.As(err, &ce) || ce.Code != 18 {
					t.Fatalf("%s: %v, want ok or code 18", user, err)
				}
			}
			return err
		}
		if err := ping("upuser", "up-pw"); err != nil {
			t.Fatal(err)
		}
		if err := up.SetUserPassword("upuser", "admin", "new-pw"); err != nil {
			t.Fatal(err)
		}
		if ping("upuser", "new-pw") == nil {
			t.Fatal("the new password worked against the old salt")
		}
		if err := ping("upuser", "new-pw"); err != nil {
			t.Fatalf("the new password after a failed attempt: %v", err)
		}
		if ping("upuser", "up-pw") == nil {
			t.Fatal("the old password still works")
		}

		if err := up.DropUser("upuser", "admin"); err != nil {
			t.Fatal(err)
		}
		if ping("upuser", "guess") == nil {
			t.Fatal("a guess worked")
		}
		if ping("upuser", "new-pw") == nil {
			t.Fatal("a dropped user still logs in after a failed proof")
		}

		if ping("far", "far-pw") == nil {
			t.Fatal("a user restricted to 10.0.0.0/8 logged in from 127.0.0.1")
		}
		if err := ping("near", "near-pw"); err != nil {
			t.Fatalf("a user restricted to 127.0.0.0/8 from 127.0.0.1: %v", err)
		}

		for _, c := range []struct {
			name, label, value string
		}{
			{"mongobouncer_auth_failures_total", "reason", "bad_proof"},
			{"mongobouncer_auth_failures_total", "reason", "unknown_user"},
			{"mongobouncer_auth_failures_total", "reason", "restricted"},
			{"mongobouncer_auth_lookups_total", "result", "found"},
			{"mongobouncer_auth_lookups_total", "result", "not_found"},
		} {
			if authCounter(t, a, c.name, c.label, c.value) < 1 {
				t.Errorf("%s{%s=%q} not counted", c.name, c.label, c.value)
			}
		}
	})
}
