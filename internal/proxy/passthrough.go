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
// login (noteLogin), shared by all pass-through routes: a password changed
// upstream and in the auth_file takes effect with the next login, without
// closing connections already logged in.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/mongobouncer/mongobouncer/internal/auth"
	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/topology"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// errNoPassThroughSecret fails a request on a pass-through route from a
// client whose login left no secret to log in upstream with (X.509).
var errNoPassThroughSecret = errors.New("the client's login gives no secret to log in upstream with (SCRAM pass-through needs a SCRAM login)")

// passUsers holds the pass-through authenticators, by auth.UserID (never
// by "user@db", which two users can share).
type passUsers struct {
	m sync.Map // auth.UserID → *passAuth
}

// passAuth is the upstream Authenticator of one user's pools: it logs in
// with the secret of the user's latest login.
type passAuth struct {
	setMu sync.Mutex // serialises set: its compare and store of cur
	cur   atomic.Pointer[passSecret]
}

// passSecret is one secret and the authenticator built from it.
type passSecret struct {
	pt auth.PassThrough
	a  upstream.HandshakeAuthenticator
}

var _ upstream.HandshakeAuthenticator = (*passAuth)(nil)

// StartHandshake implements upstream.HandshakeAuthenticator.
func (p *passAuth) StartHandshake() ([]byte, upstream.Authenticator, error) {
	return p.cur.Load().a.StartHandshake()
}

// Authenticate implements upstream.Authenticator.
func (p *passAuth) Authenticate(ctx context.Context, c *upstream.Conn, hello *upstream.Hello) error {
	return p.cur.Load().a.Authenticate(ctx, c, hello)
}

// set makes id's secret the one new connections log in with, unless it
// is the one they use already (building an authenticator from a password
// starts its key cache over). It reports whether the secret changed.
func (p *passAuth) set(id *auth.Identity, pt auth.PassThrough) (bool, error) {
	p.setMu.Lock()
	defer p.setMu.Unlock()
	cur := p.cur.Load()
	if cur != nil && sameSecret(cur.pt, pt) {
		return false, nil
	}
	a, err := newPassAuthenticator(id, pt)
	if err != nil {
		return false, err
	}
	p.cur.Store(&passSecret{pt: pt, a: a})
	return cur != nil, nil
}

func sameSecret(a, b auth.PassThrough) bool {
	return a.Mechanism == b.Mechanism && a.Password == b.Password && bytes.Equal(a.ClientKey, b.ClientKey) &&
		a.Stored.Salt == b.Stored.Salt && a.Stored.Iters == b.Stored.Iters &&
		bytes.Equal(a.Stored.StoredKey, b.Stored.StoredKey) && bytes.Equal(a.Stored.ServerKey, b.Stored.ServerKey)
}

// newPassAuthenticator builds the upstream login of id: SCRAM with the
// plain password when the auth_file has it (any upstream salt works, and
// the mechanism is negotiated as drivers do), else SCRAM with the ClientKey
// and stored credentials, in the mechanism the client used.
func newPassAuthenticator(id *auth.Identity, pt auth.PassThrough) (upstream.HandshakeAuthenticator, error) {
	if pt.Password != "" {
		return upstream.NewAuthenticator(upstream.Credential{Username: id.User, Password: pt.Password, Source: id.DB})
	}
	return upstream.NewPassThroughAuthenticator(upstream.PassThrough{
		Mechanism: string(pt.Mechanism), Username: id.User, Source: id.DB,
		ClientKey: pt.ClientKey, Stored: pt.Stored,
	})
}

// noteLogin records a client's successful SCRAM login for pass-through:
// its secret becomes the one its user's pools log in with.
func (s *Server) noteLogin(id *auth.Identity) {
	pt, ok := id.PassThrough()
	if !ok {
		return
	}
	v, _ := s.pass.m.LoadOrStore(id.ID(), &passAuth{})
	changed, err := v.(*passAuth).set(id, pt)
	if err != nil {
		s.log.Warn("pass-through: cannot log in upstream with this login's secret", "user", id.ID().String(), "error", err)
		return
	}
	if changed {
		// A pool a refused login paused gets its next try at once, with
		// the new secret.
		for _, r := range s.table.Load().all {
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
func (lg *login) poolFor(s *Server, route *Route, srv *topology.Server) (*pool.Pool, error) {
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
	v, ok := s.pass.m.Load(lg.passKey)
	if !ok || v.(*passAuth).cur.Load() == nil {
		return nil, fmt.Errorf("route %q, user %s: %w", route.Name, id.ID(), errNoPassThroughSecret)
	}
	return srv.UserPool(id.ID(), v.(*passAuth))
}
