package topology

// The secret each user's pools log in upstream with (SCRAM pass-through):
// that of the user's latest login to mongobouncer, shared by every route
// and server, and read by a user pool when one of its connections logs in
// (UserPool keeps the Authenticator it was created with). So a password
// changed upstream and in the auth_file takes effect with the next login,
// without closing connections already logged in.

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"

	"github.com/mongobouncer/mongobouncer/internal/auth"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// UserSecrets holds each pass-through user's upstream login, by
// auth.UserID (never by "user@db", which two users can share). The zero
// value is empty and ready; it is safe for concurrent use.
type UserSecrets struct {
	m sync.Map // auth.UserID → *userSecret
}

// userSecret is the upstream Authenticator of one user's pools: it logs
// in with the secret of the user's latest login.
type userSecret struct {
	// setMu serialises Set's compare and store of cur. A leaf: nothing
	// else is taken while it is held.
	setMu sync.Mutex
	cur   atomic.Pointer[secret]
}

// secret is one secret and the authenticator built from it.
type secret struct {
	pt auth.PassThrough
	a  upstream.HandshakeAuthenticator
}

var _ upstream.HandshakeAuthenticator = (*userSecret)(nil)

// StartHandshake implements upstream.HandshakeAuthenticator.
func (u *userSecret) StartHandshake() ([]byte, upstream.Authenticator, error) {
	return u.cur.Load().a.StartHandshake()
}

// Authenticate implements upstream.Authenticator.
func (u *userSecret) Authenticate(ctx context.Context, c *upstream.Conn, hello *upstream.Hello) error {
	return u.cur.Load().a.Authenticate(ctx, c, hello)
}

// Set makes the secret of id's login (auth.Identity.PassThrough) the one
// id's pools log in with from now, unless it is the one they use already
// (building an authenticator from a password starts its key cache over).
// changed reports that it replaced another secret; a login that gives no
// secret (X.509) changes nothing.
func (s *UserSecrets) Set(id *auth.Identity) (changed bool, err error) {
	pt, ok := id.PassThrough()
	if !ok {
		return false, nil
	}
	v, _ := s.m.LoadOrStore(id.ID(), &userSecret{})
	u := v.(*userSecret)
	u.setMu.Lock()
	defer u.setMu.Unlock()
	cur := u.cur.Load()
	if cur != nil && sameSecret(cur.pt, pt) {
		return false, nil
	}
	a, err := newSecretAuthenticator(id, pt)
	if err != nil {
		return false, err
	}
	u.cur.Store(&secret{pt: pt, a: a})
	return cur != nil, nil
}

// Authenticator returns the upstream login of the user whose auth.UserID
// is key, for UserPool, or nil when no login of the user has given a
// secret. key is an auth.UserID the caller boxed once, so that a lookup
// allocates nothing.
func (s *UserSecrets) Authenticator(key any) upstream.Authenticator {
	v, ok := s.m.Load(key)
	if !ok || v.(*userSecret).cur.Load() == nil {
		return nil
	}
	return v.(*userSecret)
}

func sameSecret(a, b auth.PassThrough) bool {
	return a.Mechanism == b.Mechanism && a.Password == b.Password && bytes.Equal(a.ClientKey, b.ClientKey) &&
		a.Stored.Salt == b.Stored.Salt && a.Stored.Iters == b.Stored.Iters &&
		bytes.Equal(a.Stored.StoredKey, b.Stored.StoredKey) && bytes.Equal(a.Stored.ServerKey, b.Stored.ServerKey)
}

// newSecretAuthenticator builds the upstream login of id: SCRAM with the
// plain password when the auth_file has it (any upstream salt works, and
// the mechanism is negotiated as drivers do), else SCRAM with the
// ClientKey and stored credentials, in the mechanism the client used.
func newSecretAuthenticator(id *auth.Identity, pt auth.PassThrough) (upstream.HandshakeAuthenticator, error) {
	if pt.Password != "" {
		return upstream.NewAuthenticator(upstream.Credential{Username: id.User, Password: pt.Password, Source: id.DB})
	}
	return upstream.NewPassThroughAuthenticator(upstream.PassThrough{
		Mechanism: string(pt.Mechanism), Username: id.User, Source: id.DB,
		ClientKey: pt.ClientKey, Stored: pt.Stored,
	})
}
