package upstream

// MONGODB-X509: the TLS client certificate is the identity; the
// authenticate command only tells the server to use it. The certificate
// itself comes with Options.TLSConfig.

import (
	"context"
	"log/slog"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// x509Auth authenticates with MONGODB-X509 on $external.
type x509Auth struct {
	cred Credential
}

var _ HandshakeAuthenticator = (*x509Auth)(nil)

// String is the credential's (there is no password: the certificate is in
// Options.TLSConfig), as the SCRAM authenticator prints.
func (a *x509Auth) String() string { return a.cred.String() }

// GoString is String, for %#v.
func (a *x509Auth) GoString() string { return a.String() }

// LogValue is String, for slog.
func (a *x509Auth) LogValue() slog.Value { return slog.StringValue(a.String()) }

// command is {authenticate: 1, mechanism: "MONGODB-X509"}, with the user
// only when one was given (the spec: the server derives it otherwise).
func (a *x509Auth) command() bsoncore.Document {
	b := bsoncore.NewDocumentBuilder().
		AppendInt32("authenticate", 1).
		AppendString("mechanism", MechanismX509)
	if a.cred.Username != "" {
		b.AppendString("user", a.cred.Username)
	}
	return b.Build()
}

// StartHandshake implements HandshakeAuthenticator: the authenticate
// command rides in the hello as speculativeAuthenticate.
func (a *x509Auth) StartHandshake() ([]byte, Authenticator, error) {
	return bsoncore.AppendDocumentElement(nil, "speculativeAuthenticate", a.command()), a, nil
}

// Authenticate implements Authenticator. A speculativeAuthenticate in the
// hello reply means the server has already authenticated the connection.
func (a *x509Auth) Authenticate(ctx context.Context, c *Conn, hello *Hello) error {
	if hello != nil && hello.SpeculativeAuthenticate != nil {
		return nil
	}
	_, err := authCommand(ctx, c, &a.cred, MechanismX509, a.command())
	return err
}
