package upstream

// Authentication of mongobouncer's own connections to its upstreams (the
// auth spec): the credential, the typed error, and the handshake seam that
// lets a mechanism add saslSupportedMechs and speculativeAuthenticate to a
// connection's hello. The mechanisms are in auth_scram.go and auth_x509.go.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Mechanism names, as the authMechanism option and the server spell them.
const (
	MechanismSCRAMSHA1   = "SCRAM-SHA-1"
	MechanismSCRAMSHA256 = "SCRAM-SHA-256"
	MechanismX509        = "MONGODB-X509"
)

// CodeAuthenticationFailed is the server's AuthenticationFailed error code.
const CodeAuthenticationFailed int32 = 18

// ErrUnsupportedMechanism reports an authentication mechanism mongobouncer
// cannot use upstream (PLAIN, GSSAPI, MONGODB-AWS, MONGODB-OIDC, ...).
var ErrUnsupportedMechanism = errors.New("authentication mechanism not supported")

// Credential is what mongobouncer authenticates its upstream connections
// with: one service user per route. Password is a secret: nothing in this
// package prints it.
type Credential struct {
	// Mechanism is MechanismSCRAMSHA1, MechanismSCRAMSHA256 or
	// MechanismX509; empty negotiates SCRAM-SHA-256 or SCRAM-SHA-1 with the
	// server in the handshake.
	Mechanism string
	// Username is the user. SCRAM needs one; X.509 may leave it empty (the
	// server takes the certificate's subject).
	Username string
	// Password is the SCRAM password (never set for X.509).
	Password string
	// Source is the authentication database: "admin" when empty for
	// SCRAM, always "$external" for X.509.
	Source string
}

// String describes the credential without its password. GoString and
// LogValue print the same, so that neither %#v nor slog (whose JSON
// handler would marshal the fields) shows the password.
func (c Credential) String() string {
	m := c.Mechanism
	if m == "" {
		m = "SCRAM (negotiated)"
	}
	return fmt.Sprintf("%s user %q on %q", m, c.Username, c.Source)
}

// GoString is String, for %#v.
func (c Credential) GoString() string { return c.String() }

// LogValue is String, for slog.
func (c Credential) LogValue() slog.Value { return slog.StringValue(c.String()) }

// AuthError reports that an upstream did not accept mongobouncer's
// credentials, or that the authentication conversation went wrong (a
// server that cannot prove it knows the password, a malformed reply). A
// network failure during authentication is a *NetworkError instead. It
// arrives wrapped in a *ConnectError at stage "auth"; it never contains the
// password.
type AuthError struct {
	// Mechanism is the mechanism that was used (after negotiation).
	Mechanism string
	// Username and Source name the user.
	Username string
	Source   string
	// Code is the server's error code, CodeAuthenticationFailed when the
	// server refused the credentials; 0 when mongobouncer itself ended the
	// conversation.
	Code     int32
	CodeName string
	// Message is the server's errmsg, or what was wrong.
	Message string
	// Err is the cause: the server's *CommandError,
	// ErrPassThroughMismatch, or nil.
	Err error
}

// Error implements error.
func (e *AuthError) Error() string {
	s := "upstream: authentication failed (" + e.Mechanism + ", user " + strconv.Quote(e.Username) + " on " + strconv.Quote(e.Source) + ")"
	if e.Code != 0 {
		s += ": (" + strconv.Itoa(int(e.Code))
		if e.CodeName != "" {
			s += " " + e.CodeName
		}
		s += ")"
	}
	if e.Message != "" {
		s += " " + e.Message
	}
	return s
}

// Unwrap returns the cause (Err), if any.
func (e *AuthError) Unwrap() error { return e.Err }

// AuthenticationFailed reports whether the server refused the credentials
// (code 18), as opposed to a conversation mongobouncer gave up.
func (e *AuthError) AuthenticationFailed() bool { return e.Code == CodeAuthenticationFailed }

// HandshakeAuthenticator is an Authenticator that takes part in the
// handshake hello, as drivers do: it adds saslSupportedMechs (to negotiate
// a mechanism) and speculativeAuthenticate (the first step of the
// conversation, saving a round trip) to each new connection's hello.
type HandshakeAuthenticator interface {
	Authenticator
	// StartHandshake begins authenticating one new connection. It returns
	// BSON elements to append to that connection's hello and the
	// Authenticator that finishes the conversation once the reply is in
	// (hello.SpeculativeAuthenticate holds the server's answer, if any).
	StartHandshake() (helloElems []byte, finish Authenticator, err error)
}

// NewAuthenticator returns the Authenticator for c: SCRAM-SHA-1,
// SCRAM-SHA-256 (or the negotiation of one of them) or MONGODB-X509. Other
// mechanisms wrap ErrUnsupportedMechanism. It checks what the mechanism
// requires (a username and password for SCRAM, none for X.509 but a
// source of $external) and fills in the default Source.
func NewAuthenticator(c Credential) (HandshakeAuthenticator, error) {
	switch c.Mechanism {
	case "", MechanismSCRAMSHA1, MechanismSCRAMSHA256:
		if c.Username == "" {
			return nil, fmt.Errorf("upstream: %s needs a username", mechanismName(c.Mechanism))
		}
		if c.Source == "" {
			c.Source = "admin"
		}
		return newSCRAM(c)
	case MechanismX509:
		if c.Password != "" {
			return nil, errors.New("upstream: MONGODB-X509 takes no password (the client certificate proves the identity)")
		}
		if c.Source == "" {
			c.Source = "$external"
		}
		if c.Source != "$external" {
			return nil, fmt.Errorf("upstream: MONGODB-X509 authenticates on $external, not %q", c.Source)
		}
		return &x509Auth{cred: c}, nil
	}
	return nil, fmt.Errorf("upstream: %w: %s", ErrUnsupportedMechanism, c.Mechanism)
}

func mechanismName(m string) string {
	if m == "" {
		return "SCRAM"
	}
	return m
}

// authCommand runs one command of an authentication conversation; a
// server's refusal becomes an *AuthError, network errors stay as they are.
func authCommand(ctx context.Context, c *Conn, cred *Credential, mech string, cmd bsoncore.Document) (bsoncore.Document, error) {
	reply, err := c.RoundTrip(ctx, cred.Source, cmd)
	var ce *CommandError
	if errors.As(err, &ce) {
		return nil, &AuthError{Mechanism: mech, Username: cred.Username, Source: cred.Source,
			Code: ce.Code, CodeName: ce.CodeName, Message: ce.Message, Err: ce}
	}
	return reply, err
}

// withElems returns the hello document with elems appended.
func withElems(doc bsoncore.Document, elems []byte) bsoncore.Document {
	if len(elems) == 0 {
		return doc
	}
	out := make([]byte, 0, len(doc)+len(elems))
	idx, out := bsoncore.AppendDocumentStart(out)
	out = append(out, doc[4:len(doc)-1]...)
	out = append(out, elems...)
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out
}
