package proxy

// SCRAM pass-through: on a route whose connection string has no
// credentials while clients log in to mongobouncer with SCRAM, each
// client's requests go upstream as its own user, over that user's pool on
// each server (topology.Server.UserPool). mongobouncer never learns the
// password: it logs in with the ClientKey recovered from the client's
// proof and the stored credentials that proof verified against (or the
// auth_file's plain password, when it has one), as PgBouncer does.
//
// The secret a user's pools log in with is the one of the user's latest
// login (noteLogin, topology.UserSecrets), shared by all pass-through
// routes: a password changed upstream and in the auth_file takes effect
// with the next login, without closing connections already logged in.

import (
	"errors"
	"fmt"

	"github.com/mongobouncer/mongobouncer/internal/auth"
	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/routing"
	"github.com/mongobouncer/mongobouncer/internal/topology"
)

// errNoPassThroughSecret fails a request on a pass-through route from a
// client whose login left no secret to log in upstream with (X.509).
var errNoPassThroughSecret = errors.New("the client's login gives no secret to log in upstream with (SCRAM pass-through needs a SCRAM login)")

// noteLogin records a client's successful SCRAM login for pass-through:
// its secret becomes the one its user's pools log in with.
func (s *Server) noteLogin(id *auth.Identity) {
	changed, err := s.pass.Set(id)
	if err != nil {
		s.log.Warn("pass-through: cannot log in upstream with this login's secret", "user", id.ID().String(), "error", err)
		return
	}
	if changed {
		// A pool a refused login paused gets its next try at once, with
		// the new secret.
		for _, r := range s.table.Load().All() {
			if r.PassThrough {
				for _, srv := range r.Topology.Servers() {
					srv.RetryUserPool(id.ID())
				}
			}
		}
	}
}

// passThroughFailed handles a failed checkout on a pass-through route: if
// the upstream refused the user's login, the user's credentials from an
// auth_user lookup are forgotten, so that the user's next login looks them
// up again (the secret may have changed upstream).
func (lg *login) passThroughFailed(s *Server, err error) {
	var sel *topology.SelectionError
	var cleared *pool.PoolClearedError
	if id := lg.Ident; id != nil && s.opts.Auth != nil && upstreamAuthFailure(err, &sel, &cleared) {
		s.opts.Auth.Users.Refresh(id.User, id.DB)
	}
}

// poolFor returns the pool the client's request checks out from on srv:
// the server's own pool, or on a pass-through route the pool of the
// client's user.
func (lg *login) poolFor(s *Server, route *routing.Route, srv *topology.Server) (*pool.Pool, error) {
	if !route.PassThrough {
		return srv.Pool(), nil
	}
	id := lg.Ident
	if id == nil {
		// admit forwards nothing of a client that has not logged in (its
		// ping and buildInfo are answered by mongobouncer): kept as a
		// guard, never a connection without a user.
		return nil, fmt.Errorf("route %q: the client has not logged in: %w", route.Name, errNoPassThroughSecret)
	}
	// lg.passKey is id.ID(), boxed once at the login, so that the request
	// allocates nothing.
	a := s.pass.Authenticator(lg.passKey)
	if a == nil {
		return nil, fmt.Errorf("route %q, user %s: %w", route.Name, id.ID(), errNoPassThroughSecret)
	}
	return srv.UserPool(id.ID(), a)
}
