package proxy

// Client authentication: the login commands (saslStart, saslContinue, a
// hello's speculativeAuthenticate and saslSupportedMechs, authenticate for
// MONGODB-X509). What a client that has or has not logged in may run is
// admit's decision (admit.go), which both I/O models ask before anything
// is forwarded or answered. A user name a client sends is bounded
// (maxUserName) where it is first read, and log lines carry at most
// logNameLen bytes of it.
//
// A client connection has one identity: once logged in, logging in again
// as the same user is allowed (drivers re-authenticate), as another user is
// refused. Logins run on the client's goroutine only (the loop serves no
// hello and no authentication command), so a lookup of a user upstream may
// block there, bounded by authTimeout.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/auth"
	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// login is a client's identity and its login in progress, owned by
// whoever serves the client (logins themselves run on its goroutine).
type login struct {
	// ident is who the client logged in as, nil before; conv is its login
	// conversation in progress.
	ident *auth.Identity
	conv  *auth.Conversation
	// passKey is ident's auth.UserID, boxed once at the login: the key
	// of the pass-through secrets (Server.pass), which a request looks up
	// without allocating.
	passKey any
	// counted is set when the login was counted for max_user_client_conn
	// (userlimit.go), as countedUser; refused when it was refused.
	counted     bool
	countedUser auth.UserID
	refused     bool
	// mechsAsked is set by a hello that asked saslSupportedMechs before
	// the client logged in: a login follows (due).
	mechsAsked bool
	// clock is what client_login_timeout remembers (logintimeout.go).
	clock loginClock
}

// pending reports whether a client must still log in: authentication is
// on (s's) and it has not.
func (lg *login) pending(s *Server) bool { return s.opts.Auth != nil && lg.ident == nil }

// ClientAuth makes clients log in. The zero value (Options.Auth nil) lets
// every client in.
type ClientAuth struct {
	// Users finds users and admins (auth_file, auth_user lookups,
	// admin_users); required.
	Users *auth.Authenticator
	// X509 accepts MONGODB-X509 logins by the client's verified TLS
	// certificate (auth_type = "x509") instead of SCRAM.
	X509 bool
}

// authTimeout bounds one login step, a user lookup upstream included.
const authTimeout = 10 * time.Second

// mechX509 is the x509 mechanism name, and externalDB its database.
const (
	mechX509   = "MONGODB-X509"
	externalDB = "$external"
)

// authFailedMsg is the one message of every failed login: an unknown user
// and a wrong password must not be told apart.
const authFailedMsg = "mongobouncer: Authentication failed."

// authFailed is the reply to every failed login.
func authFailed() bsoncore.Document {
	return command.ErrorReply(18, "AuthenticationFailed", authFailedMsg)
}

// handleAuth answers a login command (command.Auth).
func (c *client) handleAuth(responseTo int32, compressed bool, compID wire.CompressorID, req *command.Request) error {
	a := c.s.opts.Auth
	if a == nil {
		return c.replyError(responseTo, compressed, compID, req,
			command.ErrorReply(115, "CommandNotSupported", "mongobouncer: authentication is not enabled on mongobouncer"))
	}
	var doc bsoncore.Document
	switch req.Name() {
	case "saslStart":
		doc = c.saslStart(c.msg.Body, string(req.DB))
	case "saslContinue":
		doc = c.saslContinue(c.msg.Body)
	case "authenticate":
		doc = c.authenticate(c.msg.Body, string(req.DB))
	case "logout":
		doc = command.ErrorReply(115, "CommandNotSupported",
			"mongobouncer: logout is not supported: a connection keeps the user it logged in as; close the connection instead")
	default:
		doc = command.ErrorReply(115, "CommandNotSupported",
			fmt.Sprintf("mongobouncer: %s is not supported: log in with saslStart (SCRAM-SHA-256 or SCRAM-SHA-1)", req.Name()))
	}
	err := c.replyError(responseTo, compressed, compID, req, doc)
	if err == nil && c.login.refused {
		err = errUserClientLimit // over max_user_client_conn: the reply said why
	}
	return err
}

// saslStart begins a SCRAM conversation from a saslStart command (or a
// hello's speculativeAuthenticate, whose authentication database is its
// db field) and returns the reply.
func (c *client) saslStart(body bsoncore.Document, db string) bsoncore.Document {
	a := c.s.opts.Auth
	mech, _ := body.Lookup("mechanism").StringValueOK()
	if a.X509 || (mech != string(auth.SCRAMSHA1) && mech != string(auth.SCRAMSHA256)) {
		return command.ErrorReply(334, "MechanismUnavailable",
			fmt.Sprintf("mongobouncer: mechanism %q is not available: use %s", logName(mech), c.s.opts.Auth.mechanismsText()))
	}
	payload, ok := binaryOrString(body.Lookup("payload"))
	if !ok {
		return command.ErrorReply(14, "TypeMismatch", "mongobouncer: saslStart needs a payload (binary)")
	}
	if n := scramUserLen(payload); n > maxUserName {
		// Refused before Start looks the name up (auth_user asks upstream).
		c.log.Info("client authentication failed", "db", logName(db), "mechanism", mech,
			"reason", fmt.Sprintf("user name of %d bytes, over %d", n, maxUserName))
		return authFailed()
	}
	skip, _ := body.Lookup("options", "skipEmptyExchange").BooleanOK()
	ctx, cancel := context.WithTimeout(c.authContext(), authTimeout)
	defer cancel()
	c.login.conv = nil
	conv, out, err := a.Users.Start(ctx, auth.Mechanism(mech), db, payload, skip)
	if err != nil {
		c.log.Info("client authentication failed", "db", logName(db), "mechanism", mech, "reason", "malformed client-first message")
		return authFailed()
	}
	if other := (auth.UserID{User: conv.User(), DB: db}); c.login.ident != nil && c.login.ident.ID() != other {
		c.log.Info("client authentication refused: one user per connection", "user", logName(c.login.ident.ID().String()), "other", logName(other.String()))
		return command.ErrorReply(18, "AuthenticationFailed",
			fmt.Sprintf("mongobouncer: this connection is logged in as %s already; a connection has one user: open another connection to log in as %s",
				c.login.ident.ID(), other))
	}
	c.login.conv = conv
	return saslReply(false, out)
}

// due reports whether the client is logging in: a conversation is in
// progress, or its last command was a hello that asked saslSupportedMechs
// (a driver's handshake on a connection it will log in on). Such a client
// stays on its goroutine, where every login command is served, rather
// than enter the event loop for the few microseconds between its steps
// and be handed back at once: two hand-offs per step doubled the cost of
// a login. It consumes the hello's hint, so a client that asks and never
// logs in enters the loop after its next command.
func (lg *login) due() bool {
	asked := lg.mechsAsked
	lg.mechsAsked = false
	return lg.conv != nil || asked
}

// saslContinue takes the next step of the client's conversation.
func (c *client) saslContinue(body bsoncore.Document) bsoncore.Document {
	id, ok := body.Lookup("conversationId").AsInt64OK()
	conv := c.login.conv
	if conv == nil || !ok || id != 1 {
		return command.ErrorReply(17, "ProtocolError", "mongobouncer: no SASL conversation with this conversationId on this connection: begin with saslStart")
	}
	payload, ok := binaryOrString(body.Lookup("payload"))
	if !ok {
		return command.ErrorReply(14, "TypeMismatch", "mongobouncer: saslContinue needs a payload (binary)")
	}
	out, done, err := conv.Step(payload)
	if done {
		c.login.conv = nil
	}
	if err != nil {
		c.log.Info("client authentication failed", "user", logName(auth.UserID{User: conv.User(), DB: conv.DB()}.String()), "mechanism", string(conv.Mechanism()))
		if errors.Is(err, auth.ErrConversation) {
			return command.ErrorReply(17, "ProtocolError", "mongobouncer: the SASL conversation has ended: begin with saslStart")
		}
		return authFailed()
	}
	if id := conv.Identity(); id != nil && c.login.ident != id {
		// A new login, or the same user's again (a fresh ClientKey).
		if c.login.ident == nil {
			if refused := c.login.admitUser(c.s, c.log, id.ID()); refused != nil {
				return refused
			}
			c.loggedIn(id)
		}
		c.login.ident = id
		c.s.noteLogin(id)
	}
	return saslReply(done, out)
}

// authenticate serves the authenticate command: MONGODB-X509 only.
func (c *client) authenticate(body bsoncore.Document, db string) bsoncore.Document {
	mech, _ := body.Lookup("mechanism").StringValueOK()
	if mech != mechX509 || !c.s.opts.Auth.X509 {
		return command.ErrorReply(334, "MechanismUnavailable",
			fmt.Sprintf("mongobouncer: mechanism %q is not available: use %s", logName(mech), c.s.opts.Auth.mechanismsText()))
	}
	if db != externalDB {
		return command.ErrorReply(2, "BadValue", "mongobouncer: MONGODB-X509 logs in on the $external database")
	}
	subject, ok := c.tlsSubject() // none: a plain client, or no verified certificate
	if !ok {
		c.log.Info("client authentication failed", "mechanism", mechX509, "reason", "no verified client certificate")
		return authFailed()
	}
	if len(subject) > maxUserName {
		c.log.Info("client authentication failed", "mechanism", mechX509, "subject", logName(subject),
			"reason", fmt.Sprintf("certificate subject over %d bytes", maxUserName))
		return authFailed()
	}
	if subject == "" {
		// A certificate may name its holder in subjectAltName only; as
		// mongod, such a certificate is nobody: logged in, it would be a
		// user with an empty name.
		c.log.Info("client authentication failed", "mechanism", mechX509, "reason", "the client certificate has an empty subject")
		return authFailed()
	}
	if user, _ := body.Lookup("user").StringValueOK(); user != "" && user != subject {
		c.log.Info("client authentication failed", "mechanism", mechX509, "reason", "user is not the certificate subject")
		return authFailed()
	}
	if c.login.ident != nil && !(c.login.ident.User == subject && c.login.ident.DB == externalDB) {
		return command.ErrorReply(18, "AuthenticationFailed", "mongobouncer: this connection is logged in already; a connection has one user")
	}
	if c.login.ident == nil {
		id := &auth.Identity{User: subject, DB: externalDB, Mechanism: mechX509}
		if refused := c.login.admitUser(c.s, c.log, id.ID()); refused != nil {
			return refused
		}
		c.login.ident = id
		c.loggedIn(c.login.ident)
	}
	idx, doc := bsoncore.AppendDocumentStart(nil)
	doc = bsoncore.AppendStringElement(doc, "dbname", externalDB)
	doc = bsoncore.AppendStringElement(doc, "user", subject)
	doc = bsoncore.AppendDoubleElement(doc, "ok", 1)
	doc, _ = bsoncore.AppendDocumentEnd(doc, idx)
	return doc
}

// loggedIn records a client's first login: in its log lines and for SHOW
// CLIENTS.
func (c *client) loggedIn(id *auth.Identity) {
	c.log = c.log.With("user", logName(id.ID().String()))
	c.log.Info("client logged in", "mechanism", string(id.Mechanism))
	c.login.passKey = id.ID()
	// The login rule is over: keep no finished conversation for the
	// connection's life (logintimeout.go).
	c.login.clock.conv, c.login.clock.convAt = nil, time.Time{}
	c.sess.setUser(id.ID().String())
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

// saslReply is a SASL step's reply.
func saslReply(done bool, payload []byte) bsoncore.Document {
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

// helloAuth adds to a hello reply what the hello asked about logging in:
// saslSupportedMechs for "db.user", and the first step of a
// speculativeAuthenticate. A speculative login that fails is left out of
// the reply, as a server does: the driver then logs in the long way and
// gets the error there.
func (c *client) helloAuth(body, reply bsoncore.Document) bsoncore.Document {
	a := c.s.opts.Auth
	if a == nil {
		return reply
	}
	var extra []byte
	if v, err := body.LookupErr("saslSupportedMechs"); err == nil {
		c.login.mechsAsked = c.login.ident == nil
		if s, ok := v.StringValueOK(); ok {
			// A name over maxUserName is nobody's: it is not looked up,
			// and the reply has no saslSupportedMechs.
			if db, user, ok := strings.Cut(s, "."); ok && !a.X509 && len(user) <= maxUserName {
				ctx, cancel := context.WithTimeout(context.Background(), authTimeout)
				mechs := a.Users.Mechanisms(ctx, user, db)
				cancel()
				aidx, d := bsoncore.AppendArrayElementStart(extra, "saslSupportedMechs")
				for i, m := range mechs {
					d = bsoncore.AppendStringElement(d, fmt.Sprint(i), string(m))
				}
				extra, _ = bsoncore.AppendArrayEnd(d, aidx)
			}
		}
	}
	if v, err := body.LookupErr("speculativeAuthenticate"); err == nil {
		if spec, ok := v.DocumentOK(); ok {
			if r := c.speculate(spec); r != nil {
				extra = bsoncore.AppendDocumentElement(extra, "speculativeAuthenticate", r)
			}
		}
	}
	if len(extra) == 0 {
		return reply
	}
	// reply ends with ok and the document's terminating 0: insert before.
	out := make([]byte, 0, len(reply)+len(extra))
	out = append(out, reply[:len(reply)-1]...)
	out = append(out, extra...)
	out = append(out, 0)
	return bsoncore.UpdateLength(out, 0, int32(len(out)))
}

// speculate runs a hello's speculativeAuthenticate ({saslStart, mechanism,
// payload, db, options} or {authenticate, mechanism, db}) and returns its
// reply without ok, or nil when it failed.
func (c *client) speculate(spec bsoncore.Document) bsoncore.Document {
	db, _ := spec.Lookup("db").StringValueOK()
	var r bsoncore.Document
	switch first, _ := spec.IndexErr(0); {
	case first == nil:
		return nil
	case first.Key() == "saslStart":
		if db == "" {
			db = "admin"
		}
		r = c.saslStart(spec, db)
	case first.Key() == "authenticate":
		if db == "" {
			db = externalDB
		}
		r = c.authenticate(spec, db)
	default:
		return nil
	}
	if ok, _ := r.Lookup("ok").AsFloat64OK(); ok != 1 {
		return nil
	}
	elems, _ := r.Elements()
	idx, out := bsoncore.AppendDocumentStart(nil)
	for _, e := range elems {
		if e.Key() != "ok" {
			out = append(out, e...)
		}
	}
	out, _ = bsoncore.AppendDocumentEnd(out, idx)
	return out
}

// mechanismsText names what clients may log in with, for error messages.
func (a *ClientAuth) mechanismsText() string {
	if a.X509 {
		return mechX509
	}
	return "SCRAM-SHA-256 or SCRAM-SHA-1"
}
