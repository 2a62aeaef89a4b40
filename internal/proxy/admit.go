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

import (
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// DefaultMaxPreLoginMessageSize is max_prelogin_message_size's default:
// room for a handshake with the largest client metadata and a
// speculative login, and for a SCRAM step, many times over.
const DefaultMaxPreLoginMessageSize = 64 * 1024

// maxUserName bounds the user name a client logs in with (SCRAM's
// client-first message, saslSupportedMechs, an X.509 subject): MongoDB's
// own names are far shorter, and a longer one fails the login as any
// failure does.
const maxUserName = 1024

// logNameLen is how much of a client-supplied name a log line keeps.
const logNameLen = 128

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

// preLogin reports whether the client must log in and has not yet.
func (c *client) preLogin() bool { return c.login.pending(c.s) }

// readLimit is the largest message the client may send now: the
// listener's (or its route's) max_message_size, and before a login
// max_prelogin_message_size. It bounds the length a header declares and
// the uncompressed size an OP_COMPRESSED declares, both before anything
// of that size is allocated.
func (c *client) readLimit() int {
	if c.preLogin() {
		return min(c.maxMsg, c.s.preLoginLimit())
	}
	return c.maxMsg
}

// preLoginLimit is max_prelogin_message_size now.
func (s *Server) preLoginLimit() int {
	if m := int(s.preLoginMax.Load()); m > 0 {
		return m
	}
	return DefaultMaxPreLoginMessageSize
}

// sizeError is the protocol error for a message of n bytes over limit
// (readLimit), or under the header's size.
func (c *client) sizeError(n, limit int) error {
	if n >= wire.HeaderLen && c.preLogin() && limit == c.s.preLoginLimit() {
		return fmt.Errorf("a message of %d bytes before login is over max_prelogin_message_size (%d bytes): log in first: %w",
			n, limit, wire.ErrMessageTooLarge)
	}
	return fmt.Errorf("message length %d is outside [%d, %d]: %w", n, wire.HeaderLen, limit, wire.ErrMessageTooLarge)
}

// errCompressorNotAgreed refuses an OP_COMPRESSED message whose compressor
// the client's hello did not agree on.
var errCompressorNotAgreed = errors.New("compressor not agreed in the hello")

// admit is the verdict on req, a parsed OP_MSG request of msgLen bytes
// (uncompressed) with flags, which routeOf sends to route (nil: none).
// It allocates nothing for a request it admits.
func (c *client) admit(msgLen int, flags wire.MsgFlags, req *command.Request, route *Route) admission {
	switch req.Info.Kind {
	case command.Hello, command.Auth:
		return admission{kind: admitAnswer}
	}
	if a := c.s.opts.Auth; a != nil {
		if c.login.ident == nil {
			if isPreLoginAnswered(req) {
				if c.s.draining.Load() {
					// As for a logged-in client: a load balancer's health
					// check (a ping without a login) must see the drain.
					return refuse(c.s.shutdownReply(req, false))
				}
				return admission{kind: admitAnswer}
			}
			return refuse(command.ErrorReply(13, "Unauthorized",
				fmt.Sprintf("mongobouncer: command %s requires authentication: log in first (saslStart)", logName(req.Name()))))
		}
		if string(req.DB) == AdminDatabase && !a.Users.IsAdmin(c.login.ident) {
			return refuse(command.ErrorReply(13, "Unauthorized",
				fmt.Sprintf("mongobouncer: %s may not run admin commands (add the user to admin_users)", c.login.ident.ID())))
		}
	}
	if len(req.DB) == 0 {
		return refuse(command.ErrorReply(40571, "Location40571", "mongobouncer: OP_MSG requests require a $db argument"))
	}
	if string(req.DB) == AdminDatabase {
		if c.s.opts.Admin == nil {
			return refuse(command.ErrorReply(13, "Unauthorized", "mongobouncer: admin commands are not enabled"))
		}
		return admission{kind: admitAnswer}
	}
	key, inTxn := req.Key()
	draining := c.s.draining.Load()
	if draining {
		// Only the commands of an open transaction may still run (on any
		// client connection: drivers pin the server, not the connection):
		// everything else goes to another mongobouncer.
		if (!inTxn || !c.sess.isOpen(key) && c.s.txnRoute(key) == nil) && !c.sess.drainFinishesCursor(req) {
			// Labelled as a server labels it: a retryable write is retried
			// by the driver, on another mongobouncer, not surfaced.
			return refuse(c.s.shutdownReply(req, inTxn))
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
	if m := int(route.maxMsg.Load()); m > 0 && msgLen > m {
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
		route.noLoop.Load() || route.PoolMode() == ModeSession,
		route.multi() && req.Info.Kind != command.Other:
		return admission{kind: admitForward}
	}
	return admission{kind: admitLoop}
}

// isPreLoginAnswered reports whether req is one mongobouncer answers for a
// client that has not logged in: ping and buildInfo, which a server runs
// without a login too (health checks), on any database but the admin
// console's.
func isPreLoginAnswered(req *command.Request) bool {
	switch req.Info.Name {
	case "ping", "buildInfo", "buildinfo":
		return len(req.DB) > 0 && string(req.DB) != AdminDatabase
	}
	return false
}

// preLoginAnswer is the reply to a ping or buildInfo before a login
// (isPreLoginAnswered). A ping is {ok: 1}, as a mongos answers it without
// asking a shard. buildInfo gives what mongobouncer knows of its
// upstreams without asking one: the release of the maxWireVersion it
// tells clients (that of the oldest upstream), with the document limits
// of its hello; once logged in, buildInfo goes upstream and has the
// server's full answer.
func (c *client) preLoginAnswer(req *command.Request) bsoncore.Document {
	if req.Info.Name == "ping" {
		return command.OKReply
	}
	lim := c.s.waitLimits()
	major, minor := releaseOfWire(lim.maxWire)
	idx, doc := bsoncore.AppendDocumentStart(nil)
	doc = bsoncore.AppendStringElement(doc, "version", fmt.Sprintf("%d.%d.0", major, minor))
	aidx, d := bsoncore.AppendArrayElementStart(doc, "versionArray")
	d = bsoncore.AppendInt32Element(d, "0", major)
	d = bsoncore.AppendInt32Element(d, "1", minor)
	d = bsoncore.AppendInt32Element(d, "2", 0)
	d = bsoncore.AppendInt32Element(d, "3", 0)
	doc, _ = bsoncore.AppendArrayEnd(d, aidx)
	doc = bsoncore.AppendInt32Element(doc, "bits", 64)
	doc = bsoncore.AppendInt32Element(doc, "maxBsonObjectSize", lim.maxBSON)
	doc = bsoncore.AppendDoubleElement(doc, "ok", 1)
	doc, _ = bsoncore.AppendDocumentEnd(doc, idx)
	return doc
}

// wireReleases maps the wire versions that began a MongoDB release series
// to it, newest first (the driver specifications' table).
var wireReleases = []struct{ wire, major, minor int32 }{
	{25, 8, 0}, {21, 7, 0}, {17, 6, 0}, {13, 5, 0}, {9, 4, 4}, {8, 4, 2}, {7, 4, 0}, {6, 3, 6},
}

// releaseOfWire returns the release series a maxWireVersion of w
// guarantees: the newest that began at w or below.
func releaseOfWire(w int32) (major, minor int32) {
	for _, r := range wireReleases {
		if w >= r.wire {
			return r.major, r.minor
		}
	}
	last := wireReleases[len(wireReleases)-1]
	return last.major, last.minor
}

// logName is a client-supplied name (a user, a command) as log lines and
// refusals carry it: at most logNameLen bytes, with the length of the rest.
func logName(s string) string {
	if len(s) <= logNameLen {
		return s
	}
	return fmt.Sprintf("%s...(%d bytes)", s[:logNameLen], len(s))
}
