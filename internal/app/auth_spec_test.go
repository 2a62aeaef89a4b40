package app

// The runner of the auth spec's connection-string suite (auth/legacy): a
// connection string in, a credential or an error out. It reads the suite
// from ../shared/specs at run time (its licence forbids copying it here).

import (
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/specdir"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// authUnsupported are the mechanisms mongobouncer refuses for its upstream
// connections, with why. A case the spec calls valid with one of them must
// be refused with an error naming the mechanism; nothing else is skipped.
var authUnsupported = map[string]string{
	"PLAIN":        "LDAP proxy authentication sends the password in clear; not implemented",
	"GSSAPI":       "Kerberos needs a GSSAPI library and a keytab; not implemented",
	"MONGODB-AWS":  "needs AWS credential discovery and request signing; not implemented",
	"MONGODB-OIDC": "needs token callbacks or cloud integrations; not implemented",
}

type authSpecCase struct {
	Description string              `json:"description"`
	URI         string              `json:"uri"`
	Valid       bool                `json:"valid"`
	Credential  *authSpecCredential `json:"credential"`
}

type authSpecCredential struct {
	Username            *string        `json:"username"`
	Password            *string        `json:"password"`
	Source              string         `json:"source"`
	Mechanism           *string        `json:"mechanism"`
	MechanismProperties map[string]any `json:"mechanism_properties"`
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// TestAuthSpec runs every case of auth/legacy/connection-string.json.
func TestAuthSpec(t *testing.T) {
	dir := specdir.Dir(t, "auth", "legacy")
	ran := 0
	for _, file := range specdir.Files(t, dir, "*.json") {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var suite struct {
			Tests []authSpecCase `json:"tests"`
		}
		if err := json.Unmarshal(b, &suite); err != nil {
			t.Fatalf("%s: %v", filepath.Base(file), err)
		}
		for _, c := range suite.Tests {
			ran++
			t.Run(c.Description, func(t *testing.T) { runAuthSpecCase(t, c) })
		}
	}
	if ran == 0 {
		t.Fatal("no case ran")
	}
}

func runAuthSpecCase(t *testing.T, c authSpecCase) {
	cs, err := config.ParseConnString(c.URI)
	var cred *upstream.Credential
	if err == nil {
		cred, err = upstreamCredential(cs)
	}
	if err == nil && cred != nil {
		// What newTopology would build: the authenticator's own checks
		// count too.
		_, err = upstream.NewAuthenticator(*cred)
	}
	if !c.Valid {
		if err == nil {
			t.Fatalf("%s: accepted, credential %+v; the spec says invalid", c.URI, cred)
		}
		return
	}
	if c.Credential != nil && c.Credential.Mechanism != nil {
		if why, unsupported := authUnsupported[*c.Credential.Mechanism]; unsupported {
			if !errors.Is(err, errUnsupportedMechanism) || !strings.Contains(err.Error(), *c.Credential.Mechanism) {
				t.Fatalf("%s: %v; want a refusal naming %s (%s)", c.URI, err, *c.Credential.Mechanism, why)
			}
			return
		}
	}
	if err != nil {
		t.Fatalf("%s: %v", c.URI, err)
	}
	want := c.Credential
	switch {
	case want == nil && cred == nil:
		return
	case want == nil:
		t.Fatalf("%s: credential %+v, want none", c.URI, cred)
	case cred == nil:
		t.Fatalf("%s: no credential, want %+v", c.URI, *want)
	}
	if cred.Username != deref(want.Username) || cred.Password != deref(want.Password) ||
		cred.Source != want.Source || cred.Mechanism != deref(want.Mechanism) {
		t.Fatalf("%s: credential %v (password %t), want user %q source %q mechanism %q (password %t)", c.URI, cred,
			cred.Password == deref(want.Password), deref(want.Username), want.Source, deref(want.Mechanism), want.Password != nil)
	}
	if len(want.MechanismProperties) > 0 && !maps.EqualFunc(want.MechanismProperties, toAny(cs.AuthMechanismProperties), func(a, b any) bool { return a == b }) {
		t.Fatalf("%s: mechanism properties %v, want %v", c.URI, cs.AuthMechanismProperties, want.MechanismProperties)
	}
}

func toAny(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// TestUpstreamAuthenticatorRefusals: what mongobouncer refuses beyond the
// spec, with errors that never show the password.
func TestUpstreamAuthenticatorRefusals(t *testing.T) {
	for _, c := range []struct{ uri, want string }{
		{"mongodb://u:Secr3t-pw@h/?authMechanism=PLAIN", "PLAIN is not supported"},
		{"mongodb://u:Secr3t-pw@h/?authMechanism=SCRAM-SHA-256&authMechanismProperties=SERVICE_NAME:x", "mechanism properties"},
		{"mongodb://h/?authMechanism=MONGODB-X509", "needs TLS"},
	} {
		cs, err := config.ParseConnString(c.uri)
		if err == nil {
			_, err = upstreamAuthenticator(cs)
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.uri, err, c.want)
		} else if strings.Contains(err.Error(), "Secr3t-pw") {
			t.Errorf("%s: error shows the password: %v", c.uri, err)
		}
	}
	cs, _ := config.ParseConnString("mongodb://h/?authSource=foo")
	if a, err := upstreamAuthenticator(cs); a != nil || err != nil {
		t.Errorf("authSource alone: %v, %v; want no authentication", a, err)
	}
}
