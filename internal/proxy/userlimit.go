package proxy

// max_user_client_conn: the client connections logged in as one user
// (auth.UserID), across all listeners, as PgBouncer's setting of that name.
// A client counts from its first login to its disconnect; the login that
// would go over the cap fails with HostUnreachable (6), the code the
// max_client_conn refusal answers with: a driver takes it as a network
// error of the handshake (it clears that connection's pool and retries a
// retryable operation), not as wrong credentials that no retry can fix.
// The connection is then closed, as PgBouncer closes it.

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

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

// userClients counts the logged-in clients of each user.
type userClients struct {
	max     atomic.Int64  // max_user_client_conn; 0: no cap
	refused atomic.Uint64 // logins refused
	mu      sync.Mutex
	n       map[auth.UserID]int // guarded by mu; entries at 0 are deleted
}

// acquire counts one more client of id, unless the cap is reached; it
// returns the cap it judged by.
func (u *userClients) acquire(id auth.UserID) (bool, int) {
	limit := int(u.max.Load())
	u.mu.Lock()
	defer u.mu.Unlock()
	if limit > 0 && u.n[id] >= limit {
		return false, limit
	}
	if u.n == nil {
		u.n = make(map[auth.UserID]int)
	}
	u.n[id]++
	return true, limit
}

// release counts one client of id less.
func (u *userClients) release(id auth.UserID) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.n[id]--; u.n[id] <= 0 {
		delete(u.n, id)
	}
}

// SetUserClientLimit changes max_user_client_conn live (0: no cap). Clients
// logged in over a lowered cap stay; new logins wait for the count to fall.
func (s *Server) SetUserClientLimit(n int) { s.userClients.max.Store(int64(max(n, 0))) }

// UserClientRefused returns how many logins max_user_client_conn refused.
func (s *Server) UserClientRefused() uint64 { return s.userClients.refused.Load() }

// UserClientCount returns how many clients are logged in as id now.
func (s *Server) UserClientCount(id auth.UserID) int {
	s.userClients.mu.Lock()
	defer s.userClients.mu.Unlock()
	return s.userClients.n[id]
}

// admitUser counts the client's first login as id, or refuses it over
// max_user_client_conn with the error reply to send (the client ends after
// it: handleAuth); log is the client's logger.
func (lg *login) admitUser(s *Server, log *slog.Logger, id auth.UserID) bsoncore.Document {
	ok, limit := s.userClients.acquire(id)
	if ok {
		lg.countedUser, lg.counted = id, true
		return nil
	}
	if !lg.refused { // a speculative login refused, then the same one
		lg.refused = true
		s.userClients.refused.Add(1)
		if o, isO := s.opts.Observer.(UserLimitObserver); isO {
			o.UserClientRefused()
		}
	}
	log.Warn("client refused", "user", logName(id.String()),
		"reason", fmt.Sprintf("max_user_client_conn = %d reached for this user", limit))
	return command.ErrorReply(6, "HostUnreachable",
		fmt.Sprintf("mongobouncer: too many client connections for this user (max_user_client_conn = %d)", limit))
}

// releaseUser uncounts the client's login at its disconnect.
func (lg *login) releaseUser(s *Server) {
	if lg.counted {
		lg.counted = false
		s.userClients.release(lg.countedUser)
	}
}
