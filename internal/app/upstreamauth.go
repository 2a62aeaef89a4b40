package app

// The credentials of a route's connection string: mongobouncer logs in to
// its upstreams as the service user they name (the auth spec's
// MongoCredential), with the mechanisms internal/upstream implements.

import (
	"errors"
	"fmt"
	"slices"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// supportedMechanisms are the authMechanism values mongobouncer can use
// upstream; "" (not given) negotiates SCRAM-SHA-256 or SCRAM-SHA-1.
var supportedMechanisms = []string{upstream.MechanismSCRAMSHA256, upstream.MechanismSCRAMSHA1, upstream.MechanismX509}

// errUnsupportedMechanism is wrapped by the refusal of a mechanism
// mongobouncer does not implement (PLAIN, GSSAPI, MONGODB-AWS,
// MONGODB-OIDC).
var errUnsupportedMechanism = errors.New("is not supported for upstream connections")

// upstreamCredential returns the credential a connection string gives,
// nil when it gives none: a user name or an authMechanism means
// authentication (a database or authSource alone does not). The
// connection-string parser has already applied the spec's checks (a user
// name where required, no password for X.509, an authSource of $external
// where required) and the default authSource; the password stays in the
// credential only.
func upstreamCredential(cs config.ConnString) (*upstream.Credential, error) {
	if cs.Username == "" && cs.AuthMechanism == "" {
		return nil, nil
	}
	if !slices.Contains(supportedMechanisms, cs.AuthMechanism) && cs.AuthMechanism != "" {
		return nil, fmt.Errorf("authMechanism %s %w (supported: SCRAM-SHA-256, SCRAM-SHA-1, MONGODB-X509)", cs.AuthMechanism, errUnsupportedMechanism)
	}
	if len(cs.AuthMechanismProperties) > 0 {
		return nil, fmt.Errorf("authMechanismProperties do not apply to %s", mechanismOrSCRAM(cs.AuthMechanism))
	}
	src := cs.AuthSource
	if src == "" {
		switch {
		case cs.AuthMechanism == upstream.MechanismX509:
			src = "$external"
		case cs.Database != "":
			src = cs.Database
		default:
			src = "admin"
		}
	}
	return &upstream.Credential{Mechanism: cs.AuthMechanism, Username: cs.Username, Password: cs.Password, Source: src}, nil
}

func mechanismOrSCRAM(m string) string {
	if m == "" {
		return "SCRAM"
	}
	return m
}

// upstreamAuthenticator returns the Authenticator of a route's pooled
// connections, nil when its connection string has no credentials.
func upstreamAuthenticator(cs config.ConnString) (upstream.Authenticator, error) {
	cred, err := upstreamCredential(cs)
	if err != nil || cred == nil {
		return nil, err
	}
	if cred.Mechanism == upstream.MechanismX509 && !cs.TLS {
		return nil, errors.New("MONGODB-X509 needs TLS with a client certificate (tls=true&tlsCertificateKeyFile=...)")
	}
	return upstream.NewAuthenticator(*cred)
}

// applyTXTAuthSource gives a mongodb+srv:// route the authSource of its
// TXT record (the initial DNS seedlist discovery spec) when the string
// names none. X.509 keeps $external, the only source it has.
func applyTXTAuthSource(cs *config.ConnString, txt string) {
	if txt == "" || cs.AuthMechanism == upstream.MechanismX509 || cs.AuthSourceSet {
		return
	}
	cs.AuthSource = txt
}
