package proxy

// Client authentication in proxy: a client's login (who it is, its
// conversation, what client_login_timeout and max_user_client_conn keep of
// it) and the glue that runs its login commands (saslStart, saslContinue, a
// hello's speculativeAuthenticate and saslSupportedMechs, authenticate for
// MONGODB-X509) on auth.Login, answering on the client's socket. What a
// client that has or has not logged in may run is admit's decision
// (admit.go), which both I/O models ask before anything is forwarded or
// answered.
//
// Logins run on the client's goroutine only (the loop serves no hello and
// no authentication command), so a lookup of a user upstream may block
// there, bounded by authTimeout.

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/auth"
	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/gate"
	"github.com/mongobouncer/mongobouncer/internal/session"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// login is a client's identity and its login in progress, owned by
// whoever serves the client (logins themselves run on its goroutine).
type login struct {
	// Login is who the client logged in as (Ident, nil before) and its
	// conversation in progress (Conv).
	auth.Login
	// passKey is Ident's auth.UserID, boxed once at the login: the key
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
	clock gate.Clock
}

// pending reports whether a client must still log in: authentication is
// on (s's) and it has not.
func (lg *login) pending(s *Server) bool { return s.opts.Auth != nil && lg.Ident == nil }

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

// readLimit is the largest message the client may send now: maxMsg, its
// listener's (or its route's) max_message_size, and before a login
// max_prelogin_message_size (gate.ReadLimit).
func (lg *login) readLimit(s *Server, maxMsg int) int {
	return gate.ReadLimit(lg.pending(s), maxMsg, s.preLoginLimit())
}

// sizeError is the protocol error for a message of n bytes over limit
// (readLimit), or under the header's size.
func (lg *login) sizeError(s *Server, n, limit int) error {
	return gate.SizeError(n, limit, lg.pending(s) && limit == s.preLoginLimit())
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
	return lg.Conv != nil || asked
}

// handleAuth answers a login command (command.Auth).
func (c *client) handleAuth(responseTo int32, compressed bool, compID wire.CompressorID, req *command.Request) error {
	if c.s.opts.Auth == nil {
		return c.replyError(responseTo, compressed, compID, req,
			command.ErrorReply(115, "CommandNotSupported", "mongobouncer: authentication is not enabled on mongobouncer"))
	}
	doc := c.authStep().command(req.Name(), c.msg.Body, string(req.DB))
	err := c.replyError(responseTo, compressed, compID, req, doc)
	if err == nil && c.login.refused {
		err = errUserClientLimit // over max_user_client_conn: the reply said why
	}
	return err
}

// authStep is one login command of a client, with what a step uses of it:
// the server (its users, max_user_client_conn, pass-through), the login,
// the socket (the client's addresses and certificate), and the log and
// session that a first login names the user in.
type authStep struct {
	s    *Server
	lg   *login
	cn   *conn
	log  **slog.Logger
	sess *session.Session
}

// authStep is the client's next login step (the client's goroutine only).
func (c *client) authStep() authStep {
	return authStep{s: c.s, lg: &c.login, cn: &c.conn, log: &c.log, sess: &c.sess}
}

// command runs the login command name (authentication on) and returns its
// reply.
func (st authStep) command(name string, body bsoncore.Document, db string) bsoncore.Document {
	switch name {
	case "saslStart":
		return st.saslStart(body, db)
	case "saslContinue":
		return st.saslContinue(body)
	case "authenticate":
		return st.authenticate(body, db)
	case "logout":
		return command.ErrorReply(115, "CommandNotSupported",
			"mongobouncer: logout is not supported: a connection keeps the user it logged in as; close the connection instead")
	}
	return command.ErrorReply(115, "CommandNotSupported",
		fmt.Sprintf("mongobouncer: %s is not supported: log in with saslStart (SCRAM-SHA-256 or SCRAM-SHA-1)", name))
}

// refused logs a refused step (if it says to) and returns its error reply.
func (st authStep) refused(se *auth.StepError) bsoncore.Document {
	if se.Log != "" {
		(*st.log).Info(se.Log, se.Attrs...)
	}
	return command.ErrorReply(se.Code, se.Name, se.Msg)
}

// saslStart begins a SCRAM conversation (auth.Login.SASLStart).
func (st authStep) saslStart(body bsoncore.Document, db string) bsoncore.Document {
	a := st.s.opts.Auth
	ctx, cancel := context.WithTimeout(st.cn.authContext(), authTimeout)
	defer cancel()
	doc, se := st.lg.SASLStart(ctx, a.Users, a.X509, body, db)
	if se != nil {
		return st.refused(se)
	}
	return doc
}

// saslContinue takes the next step of the client's conversation; a login
// it ends is admitted under max_user_client_conn.
func (st authStep) saslContinue(body bsoncore.Document) bsoncore.Document {
	doc, id, se := st.lg.SASLContinue(body)
	if se != nil {
		return st.refused(se)
	}
	if id != nil {
		// A new login, or the same user's again (a fresh ClientKey).
		if st.lg.Ident == nil {
			if refused := st.lg.admitUser(st.s, *st.log, id.ID()); refused != nil {
				return refused
			}
			st.loggedIn(id)
		}
		st.lg.Ident = id
		st.s.noteLogin(id)
	}
	return doc
}

// authenticate serves the authenticate command: MONGODB-X509 only, by the
// client's verified certificate.
func (st authStep) authenticate(body bsoncore.Document, db string) bsoncore.Document {
	subject, ok := st.cn.tlsSubject()
	doc, id, se := st.lg.X509(body, db, subject, ok, st.s.opts.Auth.X509)
	if se != nil {
		return st.refused(se)
	}
	if id != nil {
		if refused := st.lg.admitUser(st.s, *st.log, id.ID()); refused != nil {
			return refused
		}
		st.lg.Ident = id
		st.loggedIn(id)
	}
	return doc
}

// loggedIn records a client's first login: in its log lines and for SHOW
// CLIENTS.
func (st authStep) loggedIn(id *auth.Identity) {
	*st.log = (*st.log).With("user", auth.LogName(id.ID().String()))
	(*st.log).Info("client logged in", "mechanism", string(id.Mechanism))
	st.lg.passKey = id.ID()
	// The login rule is over (logintimeout.go).
	st.lg.clock.LoggedIn()
	st.sess.SetUser(id.ID().String())
}

// hello adds to a hello reply what the hello asked about logging in:
// saslSupportedMechs for "db.user", and the first step of a
// speculativeAuthenticate. A speculative login that fails is left out of
// the reply, as a server does: the driver then logs in the long way and
// gets the error there.
func (st authStep) hello(body, reply bsoncore.Document) bsoncore.Document {
	a := st.s.opts.Auth
	if a == nil {
		return reply
	}
	var extra []byte
	if v, err := body.LookupErr("saslSupportedMechs"); err == nil {
		st.lg.mechsAsked = st.lg.Ident == nil
		if s, ok := v.StringValueOK(); ok {
			// A name over auth.MaxUserName is nobody's: it is not looked
			// up, and the reply has no saslSupportedMechs.
			if db, user, ok := strings.Cut(s, "."); ok && !a.X509 && len(user) <= auth.MaxUserName {
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
			if r := st.speculate(spec); r != nil {
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
func (st authStep) speculate(spec bsoncore.Document) bsoncore.Document {
	db, _ := spec.Lookup("db").StringValueOK()
	var r bsoncore.Document
	switch first, _ := spec.IndexErr(0); {
	case first == nil:
		return nil
	case first.Key() == "saslStart":
		if db == "" {
			db = "admin"
		}
		r = st.saslStart(spec, db)
	case first.Key() == "authenticate":
		if db == "" {
			db = auth.ExternalDB
		}
		r = st.authenticate(spec, db)
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
