package proxy

// Admission: the one verdict on a parsed OP_MSG request before anything is
// answered or forwarded, written once for both I/O models. dispatch.go
// (the client's goroutine) acts on every verdict; the event loop
// (loopRequest) serves only admitLoop and hands anything else to the
// goroutine, which asks again and answers. So a rule written here, a
// refusal, an answer mongobouncer gives itself or a limit, holds on both
// paths, and the loop never needs a copy of it.
//
// A client that has not logged in (client authentication on, no identity
// yet) costs bounded work and reaches nothing upstream: its messages are
// read under max_prelogin_message_size (readLimit, also the bound of a
// compressed message's declared size), its compressed messages must use a
// compressor its hello agreed on, and of the commands that are not a
// handshake or a login only ping and buildInfo are answered, by
// mongobouncer itself (preLoginAnswer), as a mongos answers ping: nothing
// is checked out, pinned or forwarded for it, lsid and txnNumber included.
// Those rules over plain values are gate's (gate/prelogin.go).

import (
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/auth"
	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/gate"
	"github.com/mongobouncer/mongobouncer/internal/routing"
	"github.com/mongobouncer/mongobouncer/internal/session"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// admitKind is what becomes of a request.
type admitKind uint8

const (
	// admitLoop: forward it; the event loop may serve it itself.
	admitLoop admitKind = iota
	// admitForward: forward it, on the client's goroutine only
	// (transactions, exhaust and moreToCome requests, session mode,
	// affinity, a route the loop cannot use).
	admitForward
	// admitAnswer: mongobouncer answers it itself, on the goroutine: a
	// handshake, a login command, an admin command, ping or buildInfo
	// before a login, endSessions with no route.
	admitAnswer
	// admitRefuse: answer admission.reply, an error; the client stays.
	admitRefuse
)

// admission is the verdict on one request.
type admission struct {
	kind  admitKind
	reply bsoncore.Document // admitRefuse's error reply
}

func refuse(doc bsoncore.Document) admission { return admission{kind: admitRefuse, reply: doc} }

// preLoginLimit is max_prelogin_message_size now.
func (s *Server) preLoginLimit() int { return gate.PreLoginLimit(int(s.preLoginMax.Load())) }

// errCompressorNotAgreed refuses an OP_COMPRESSED message whose compressor
// the client's hello did not agree on.
var errCompressorNotAgreed = errors.New("compressor not agreed in the hello")

// admit is the verdict on req, a parsed OP_MSG request of msgLen bytes
// (uncompressed) with flags, which routeOf sends to route (nil: none),
// from a client logged in as id (nil: not logged in) with session sess.
// It allocates nothing for a request it admits.
func (s *Server) admit(id *auth.Identity, sess *session.Session, msgLen int, flags wire.MsgFlags, req *command.Request, route *routing.Route) admission {
	switch req.Info.Kind {
	case command.Hello, command.Auth:
		return admission{kind: admitAnswer}
	}
	if a := s.opts.Auth; a != nil {
		if id == nil {
			if gate.PreLoginAnswered(req.Info.Name, string(req.DB), AdminDatabase) {
				if s.draining.Load() {
					// As for a logged-in client: a load balancer's health
					// check (a ping without a login) must see the drain.
					return refuse(s.shutdownReply(req, false))
				}
				return admission{kind: admitAnswer}
			}
			return refuse(command.ErrorReply(13, "Unauthorized",
				fmt.Sprintf("mongobouncer: command %s requires authentication: log in first (saslStart)", auth.LogName(req.Name()))))
		}
		if string(req.DB) == AdminDatabase && !a.Users.IsAdmin(id) {
			return refuse(command.ErrorReply(13, "Unauthorized",
				fmt.Sprintf("mongobouncer: %s may not run admin commands (add the user to admin_users)", id.ID())))
		}
	}
	if len(req.DB) == 0 {
		return refuse(command.ErrorReply(40571, "Location40571", "mongobouncer: OP_MSG requests require a $db argument"))
	}
	if string(req.DB) == AdminDatabase {
		if s.opts.Admin == nil {
			return refuse(command.ErrorReply(13, "Unauthorized", "mongobouncer: admin commands are not enabled"))
		}
		return admission{kind: admitAnswer}
	}
	key, inTxn := req.Key()
	draining := s.draining.Load()
	if draining {
		// Only the commands of an open transaction may still run (on any
		// client connection: drivers pin the server, not the connection):
		// everything else goes to another mongobouncer.
		if (!inTxn || !sess.IsOpen(key) && s.txnRoute(key) == nil) && !sess.DrainFinishesCursor(req) {
			// Labelled as a server labels it: a retryable write is retried
			// by the driver, on another mongobouncer, not surfaced.
			return refuse(s.shutdownReply(req, inTxn))
		}
	}
	if route == nil {
		if req.Info.Kind == command.EndSessions {
			// Sessions expire on their own; with no route for admin there is
			// nowhere to send this, and the driver needs no more than ok.
			return admission{kind: admitAnswer}
		}
		return refuse(command.ErrorReply(70, "ShardNotFound", fmt.Sprintf("mongobouncer: no route for database %q (add [databases.%s] or a \"*\" route)", req.DB, req.DB)))
	}
	if m := route.MessageLimit(); m > 0 && msgLen > m {
		// Read under the listener's limit, over the route's: the message
		// was read whole, so the client can go on.
		return refuse(command.ErrorReply(10334, "BSONObjectTooLarge", fmt.Sprintf("mongobouncer: a message of %d bytes is over route %q's max_message_size of %d bytes", msgLen, route.Name, m)))
	}
	// What the loop serves itself: a plain command outside a transaction
	// and an exhaust stream, to a route in statement or transaction mode,
	// with no affinity to follow. The loop still hands over what target
	// finds it cannot serve without blocking.
	switch {
	case flags&(wire.FlagExhaustAllowed|wire.FlagMoreToCome) != 0,
		req.Info.Kind != command.Other && req.Info.Kind != command.GetMore && req.Info.Kind != command.KillCursors,
		inTxn || req.StartTxn || draining,
		route.NoLoop() || route.PoolMode() == ModeSession,
		route.Multi() && req.Info.Kind != command.Other:
		return admission{kind: admitForward}
	}
	return admission{kind: admitLoop}
}

// preLoginAnswer is the reply to a ping or buildInfo before a login
// (gate.PreLoginAnswered). A ping is {ok: 1}, as a mongos answers it
// without asking a shard; buildInfo is gate.BuildInfo of the limits of
// mongobouncer's hello.
func (s *Server) preLoginAnswer(req *command.Request) bsoncore.Document {
	if req.Info.Name == "ping" {
		return command.OKReply
	}
	lim := s.waitLimits()
	return gate.BuildInfo(lim.MaxWire, lim.MaxBSON)
}
