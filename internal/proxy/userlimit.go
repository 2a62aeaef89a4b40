package proxy

// max_user_client_conn applied to logins: the count per user is gate.Users
// (Server.userClients); a client counts from its first login to its
// disconnect; the login that
// would go over the cap fails with HostUnreachable (6), the code the
// max_client_conn refusal answers with: a driver takes it as a network
// error of the handshake (it clears that connection's pool and retries a
// retryable operation), not as wrong credentials that no retry can fix.
// The connection is then closed, as PgBouncer closes it.

import (
	"errors"
	"fmt"
	"log/slog"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/auth"
	"github.com/mongobouncer/mongobouncer/internal/command"
)

// errUserClientLimit ends a client whose login max_user_client_conn
// refused, after its error reply.
var errUserClientLimit = errors.New("login refused: max_user_client_conn reached for this user")

// UserLimitObserver is optionally implemented by an Observer: it hears of
// every login max_user_client_conn refused.
type UserLimitObserver interface {
	UserClientRefused()
}

// SetUserClientLimit changes max_user_client_conn live (0: no cap). Clients
// logged in over a lowered cap stay; new logins wait for the count to fall.
func (s *Server) SetUserClientLimit(n int) { s.userClients.SetMax(n) }

// UserClientRefused returns how many logins max_user_client_conn refused.
func (s *Server) UserClientRefused() uint64 { return s.userClients.Refused() }

// UserClientCount returns how many clients are logged in as id now.
func (s *Server) UserClientCount(id auth.UserID) int { return s.userClients.Count(id) }

// admitUser counts the client's first login as id, or refuses it over
// max_user_client_conn with the error reply to send (the client ends after
// it: handleAuth); log is the client's logger.
func (lg *login) admitUser(s *Server, log *slog.Logger, id auth.UserID) bsoncore.Document {
	ok, limit := s.userClients.Acquire(id)
	if ok {
		lg.countedUser, lg.counted = id, true
		return nil
	}
	if !lg.refused { // a speculative login refused, then the same one
		lg.refused = true
		s.userClients.Refuse()
		if o, isO := s.opts.Observer.(UserLimitObserver); isO {
			o.UserClientRefused()
		}
	}
	log.Warn("client refused", "user", auth.LogName(id.String()),
		"reason", fmt.Sprintf("max_user_client_conn = %d reached for this user", limit))
	return command.ErrorReply(6, "HostUnreachable",
		fmt.Sprintf("mongobouncer: too many client connections for this user (max_user_client_conn = %d)", limit))
}

// releaseUser uncounts the client's login at its disconnect.
func (lg *login) releaseUser(s *Server) {
	if lg.counted {
		lg.counted = false
		s.userClients.Release(lg.countedUser)
	}
}
