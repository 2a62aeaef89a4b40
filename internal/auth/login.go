package auth

// One client connection's login, the server side of its commands:
// saslStart (or a hello's speculativeAuthenticate), saslContinue, and
// authenticate for MONGODB-X509. A step refused answers a StepError, which
// the caller turns into its error reply and log line. A user name a client
// sends is bounded (MaxUserName) where it is first read, and log lines carry
// at most LogNameLen bytes of it (LogName).
//
// A connection has one identity: once logged in, logging in again as the
// same user is allowed (drivers re-authenticate), as another user is
// refused.

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// MaxUserName bounds the user name a client logs in with (SCRAM's
// client-first message, saslSupportedMechs, an X.509 subject): MongoDB's
// own names are far shorter, and a longer one fails the login as any
// failure does.
const MaxUserName = 1024

// LogNameLen is how much of a client-supplied name a log line keeps.
const LogNameLen = 128

// LogName is a client-supplied name (a user, a command) as log lines and
// refusals carry it: at most LogNameLen bytes, with the length of the rest.
func LogName(s string) string {
	if len(s) <= LogNameLen {
		return s
	}
	return fmt.Sprintf("%s...(%d bytes)", s[:LogNameLen], len(s))
}

// MechX509 is the x509 mechanism name, and ExternalDB its database.
const (
	MechX509   = "MONGODB-X509"
	ExternalDB = "$external"
)

// AuthFailedMsg is the one message of every failed login: an unknown user
// and a wrong password must not be told apart.
const AuthFailedMsg = "mongobouncer: Authentication failed."

// MechanismsText names what clients may log in with (x509: by
// certificate), for error messages.
func MechanismsText(x509 bool) string {
	if x509 {
		return MechX509
	}
	return "SCRAM-SHA-256 or SCRAM-SHA-1"
}

// StepError is a login step refused: the error reply's code, code name and
// message, and the log line (Log, "" for none, with Attrs).
type StepError struct {
	Code  int32
	Name  string
	Msg   string
	Log   string
	Attrs []any
}

func (e *StepError) Error() string { return e.Msg }

// failed is the refusal of every failed login; attrs say why, in the log
// only.
func failed(attrs ...any) *StepError {
	return &StepError{Code: 18, Name: "AuthenticationFailed", Msg: AuthFailedMsg, Log: "client authentication failed", Attrs: attrs}
}

// Login is one client connection's login: who it logged in as, and its
// conversation in progress. Owned by whoever serves the connection.
type Login struct {
	// Ident is who the client logged in as, nil before.
	Ident *Identity
	// Conv is its SCRAM conversation in progress, nil for none.
	Conv *Conversation
}

// SASLStart begins a SCRAM conversation from a saslStart command (or a
// hello's speculativeAuthenticate, whose authentication database is its db
// field) with a, and returns the reply. x509 says logins are by
// certificate only. ctx carries the client's addresses (WithPeer).
func (l *Login) SASLStart(ctx context.Context, a *Authenticator, x509 bool, body bsoncore.Document, db string) (bsoncore.Document, *StepError) {
	mech, _ := body.Lookup("mechanism").StringValueOK()
	if x509 || (mech != string(SCRAMSHA1) && mech != string(SCRAMSHA256)) {
		return nil, &StepError{Code: 334, Name: "MechanismUnavailable",
			Msg: fmt.Sprintf("mongobouncer: mechanism %q is not available: use %s", LogName(mech), MechanismsText(x509))}
	}
	payload, ok := binaryOrString(body.Lookup("payload"))
	if !ok {
		return nil, &StepError{Code: 14, Name: "TypeMismatch", Msg: "mongobouncer: saslStart needs a payload (binary)"}
	}
	if n := scramUserLen(payload); n > MaxUserName {
		// Refused before Start looks the name up (auth_user asks upstream).
		return nil, failed("db", LogName(db), "mechanism", mech, "reason", fmt.Sprintf("user name of %d bytes, over %d", n, MaxUserName))
	}
	skip, _ := body.Lookup("options", "skipEmptyExchange").BooleanOK()
	l.Conv = nil
	conv, out, err := a.Start(ctx, Mechanism(mech), db, payload, skip)
	if err != nil {
		return nil, failed("db", LogName(db), "mechanism", mech, "reason", "malformed client-first message")
	}
	if other := (UserID{User: conv.User(), DB: db}); l.Ident != nil && l.Ident.ID() != other {
		return nil, &StepError{Code: 18, Name: "AuthenticationFailed",
			Msg: fmt.Sprintf("mongobouncer: this connection is logged in as %s already; a connection has one user: open another connection to log in as %s",
				l.Ident.ID(), other),
			Log: "client authentication refused: one user per connection", Attrs: []any{"user", LogName(l.Ident.ID().String()), "other", LogName(other.String())}}
	}
	l.Conv = conv
	return SASLReply(false, out), nil
}

// SASLContinue takes the next step of the conversation. id is who logged
// in when the conversation succeeded and that is not l.Ident (a new
// login, or the same user's again with a fresh ClientKey): the caller
// admits it and sets l.Ident, or refuses it.
func (l *Login) SASLContinue(body bsoncore.Document) (reply bsoncore.Document, id *Identity, se *StepError) {
	cid, ok := body.Lookup("conversationId").AsInt64OK()
	conv := l.Conv
	if conv == nil || !ok || cid != 1 {
		return nil, nil, &StepError{Code: 17, Name: "ProtocolError", Msg: "mongobouncer: no SASL conversation with this conversationId on this connection: begin with saslStart"}
	}
	payload, ok := binaryOrString(body.Lookup("payload"))
	if !ok {
		return nil, nil, &StepError{Code: 14, Name: "TypeMismatch", Msg: "mongobouncer: saslContinue needs a payload (binary)"}
	}
	out, done, err := conv.Step(payload)
	if done {
		l.Conv = nil
	}
	if err != nil {
		se := failed("user", LogName(UserID{User: conv.User(), DB: conv.DB()}.String()), "mechanism", string(conv.Mechanism()))
		if errors.Is(err, ErrConversation) {
			se.Code, se.Name, se.Msg = 17, "ProtocolError", "mongobouncer: the SASL conversation has ended: begin with saslStart"
		}
		return nil, nil, se
	}
	if got := conv.Identity(); got != nil && l.Ident != got {
		id = got
	}
	return SASLReply(done, out), id, nil
}

// X509 serves the authenticate command, MONGODB-X509 on database db, for
// a client whose verified certificate has subject (hasCert false: none).
// id is the identity of a first login, which the caller admits and sets as
// l.Ident, or refuses; nil when the client was logged in as that subject.
func (l *Login) X509(body bsoncore.Document, db, subject string, hasCert, enabled bool) (reply bsoncore.Document, id *Identity, se *StepError) {
	mech, _ := body.Lookup("mechanism").StringValueOK()
	if mech != MechX509 || !enabled {
		return nil, nil, &StepError{Code: 334, Name: "MechanismUnavailable",
			Msg: fmt.Sprintf("mongobouncer: mechanism %q is not available: use %s", LogName(mech), MechanismsText(enabled))}
	}
	if db != ExternalDB {
		return nil, nil, &StepError{Code: 2, Name: "BadValue", Msg: "mongobouncer: MONGODB-X509 logs in on the $external database"}
	}
	switch user, _ := body.Lookup("user").StringValueOK(); {
	case !hasCert: // a plain client, or no verified certificate
		return nil, nil, failed("mechanism", MechX509, "reason", "no verified client certificate")
	case len(subject) > MaxUserName:
		return nil, nil, failed("mechanism", MechX509, "subject", LogName(subject), "reason", fmt.Sprintf("certificate subject over %d bytes", MaxUserName))
	case subject == "":
		// A certificate may name its holder in subjectAltName only; as
		// mongod, such a certificate is nobody: logged in, it would be a
		// user with an empty name.
		return nil, nil, failed("mechanism", MechX509, "reason", "the client certificate has an empty subject")
	case user != "" && user != subject:
		return nil, nil, failed("mechanism", MechX509, "reason", "user is not the certificate subject")
	}
	if l.Ident != nil && (l.Ident.User != subject || l.Ident.DB != ExternalDB) {
		return nil, nil, &StepError{Code: 18, Name: "AuthenticationFailed", Msg: "mongobouncer: this connection is logged in already; a connection has one user"}
	}
	if l.Ident == nil {
		id = &Identity{User: subject, DB: ExternalDB, Mechanism: MechX509}
	}
	idx, doc := bsoncore.AppendDocumentStart(nil)
	doc = bsoncore.AppendStringElement(doc, "dbname", ExternalDB)
	doc = bsoncore.AppendStringElement(doc, "user", subject)
	doc = bsoncore.AppendDoubleElement(doc, "ok", 1)
	doc, _ = bsoncore.AppendDocumentEnd(doc, idx)
	return doc, id, nil
}

// scramUserLen returns the length of the user name in a SCRAM
// client-first message ("<gs2 flag>,[a=authzid],n=<name>,r=<nonce>...",
// RFC 5802), unescaped ("=2C" is ",", "=3D" is "="), or 0 when it has
// none where the name belongs: Start then refuses the message.
func scramUserLen(payload []byte) int {
	rest := payload
	for range 2 { // past the GS2 header's two fields
		i := bytes.IndexByte(rest, ',')
		if i < 0 {
			return 0
		}
		rest = rest[i+1:]
	}
	if !bytes.HasPrefix(rest, []byte("n=")) {
		return 0
	}
	name := rest[2:]
	if i := bytes.IndexByte(name, ','); i >= 0 {
		name = name[:i]
	}
	return len(name) - 2*bytes.Count(name, []byte("=2C")) - 2*bytes.Count(name, []byte("=3D"))
}

// SASLReply is a SASL step's reply.
func SASLReply(done bool, payload []byte) bsoncore.Document {
	idx, doc := bsoncore.AppendDocumentStart(nil)
	doc = bsoncore.AppendInt32Element(doc, "conversationId", 1)
	doc = bsoncore.AppendBooleanElement(doc, "done", done)
	doc = bsoncore.AppendBinaryElement(doc, "payload", 0, payload)
	doc = bsoncore.AppendDoubleElement(doc, "ok", 1)
	doc, _ = bsoncore.AppendDocumentEnd(doc, idx)
	return doc
}

// binaryOrString reads a SASL payload: binary, or a string from clients
// that send one.
func binaryOrString(v bsoncore.Value) ([]byte, bool) {
	if _, b, ok := v.BinaryOK(); ok {
		return b, true
	}
	if s, ok := v.StringValueOK(); ok {
		return []byte(s), true
	}
	return nil, false
}
