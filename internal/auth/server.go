package auth

// The server side of a login: the Authenticator holds the users in force
// (swapped whole on reload) and starts one Conversation per login attempt.

import (
	"context"
	"crypto/hmac"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/xdg-go/scram"
)

// Authenticator logs clients in. It is safe for concurrent use.
type Authenticator struct {
	state atomic.Pointer[authState]
	keys  *keyring
	// cache is the auth_user lookup cache, nil without a Lookup.
	cache *Cache
	// nonce replaces the random server nonce (tests only).
	nonce scram.NonceGeneratorFcn
}

// authState is what a reload replaces.
type authState struct {
	users  *Users
	admins map[UserID]bool
}

// New returns an Authenticator for users, with admins allowed the admin
// commands. cache, when not nil, is asked for users the
// auth_file does not have (auth_user).
func New(users *Users, admins []UserID, cache *Cache) *Authenticator {
	a := &Authenticator{keys: processKeys, cache: cache}
	a.Update(users, admins)
	return a
}

// Update replaces the users and admins, as a reload does. Conversations
// already started finish with the credentials they began with; logged-in
// connections keep their identity.
func (a *Authenticator) Update(users *Users, admins []UserID) {
	st := &authState{users: users, admins: map[UserID]bool{}}
	for _, u := range admins {
		st.admins[u] = true
	}
	a.state.Store(st)
}

// Users returns the users in force.
func (a *Authenticator) Users() *Users { return a.state.Load().users }

// IsAdmin reports whether id may run the admin commands.
func (a *Authenticator) IsAdmin(id *Identity) bool {
	return id != nil && a.state.Load().admins[id.ID()]
}

// Refresh forgets the auth_user lookup's cached credentials of user@db
// (nothing for users of the auth_file). Call it when the upstream refused
// a login made with them (code 18 AuthenticationFailed): the user's secret
// changed upstream, and the next login looks it up again.
func (a *Authenticator) Refresh(user, db string) {
	if a.cache != nil {
		a.cache.Forget(user, db)
	}
}

// creds finds user@db: the auth_file first, then the lookup cache.
func (a *Authenticator) creds(ctx context.Context, user, db string) (Creds, bool) {
	if c, ok := a.state.Load().users.Lookup(user, db); ok {
		return c, true
	}
	if a.cache != nil {
		if c, err := a.cache.Get(ctx, user, db); err == nil {
			return c, true
		}
	}
	return Creds{}, false
}

// Mechanisms returns what hello's saslSupportedMechs reports for user@db:
// the user's mechanisms, or both for an unknown user, so that the answer
// does not tell who exists.
func (a *Authenticator) Mechanisms(ctx context.Context, user, db string) []Mechanism {
	if c, ok := a.creds(ctx, user, db); ok {
		return c.Mechanisms()
	}
	return Mechanisms
}

// Conversation is one SCRAM login attempt on one client connection.
type Conversation struct {
	a         *Authenticator
	mech      Mechanism
	db        string
	skipEmpty bool
	sc        *scram.ServerConversation
	// stored are the credentials the conversation checks against, kept
	// to recover the ClientKey from the proof and for pass-through;
	// password is the user's plain password if the auth_file gave one.
	stored   scram.StoredCredentials
	password string
	c1b, s1  string
	state    convState
	// proven is who the proof verified; identity is set from it only
	// when the conversation has succeeded to its end (the empty last
	// step of the long form included), so that a client whose last step
	// fails is not logged in.
	proven, identity *Identity
}

type convState uint8

const (
	convFinal convState = iota // waiting for the client-final message
	convEmpty                  // proven; waiting for the empty last step (long form)
	convDone                   // finished, either way
)

// Start begins a login of mechanism on authentication database db with
// the client-first message payload (a saslStart's, or a hello's
// speculativeAuthenticate). skipEmpty is saslStart's
// options.skipEmptyExchange: the conversation then ends with the server's
// proof. It returns the server-first message. Errors wrap ErrMechanism or
// ErrAuthFailed.
func (a *Authenticator) Start(ctx context.Context, mechanism Mechanism, db string, payload []byte, skipEmpty bool) (*Conversation, []byte, error) {
	hg := hashOf(mechanism)
	if hg == nil {
		return nil, nil, fmt.Errorf("%w: %q", ErrMechanism, mechanism)
	}
	c := &Conversation{a: a, mech: mechanism, db: db, skipEmpty: skipEmpty}
	lookup := func(user string) (scram.StoredCredentials, error) {
		if creds, ok := a.creds(ctx, user, db); ok {
			if sc, ok := creds.For(mechanism); ok {
				c.stored = sc
				c.password, _ = creds.Password()
				return sc, nil
			}
		}
		// Unknown, or without this mechanism: fake, to fail at the proof.
		// Named unambiguously (the user's length first), so that no two
		// users share fake credentials.
		sc := a.keys.fake(mechanism, strconv.Itoa(len(user))+":"+user+db)
		c.stored = sc
		return sc, nil
	}
	srv, err := hg.NewServer(lookup)
	if err != nil {
		return nil, nil, err
	}
	if a.nonce != nil {
		srv = srv.WithNonceGenerator(a.nonce)
	}
	c.sc = srv.NewConversation()
	s1, err := c.sc.Step(string(payload))
	if err != nil {
		c.state = convDone
		return nil, nil, fmt.Errorf("%w: client-first message: %v", ErrAuthFailed, err)
	}
	c.c1b = clientFirstBare(string(payload))
	c.s1 = s1
	return c, []byte(s1), nil
}

// User returns the user name the client-first message gave.
func (c *Conversation) User() string { return c.sc.Username() }

// DB returns the authentication database.
func (c *Conversation) DB() string { return c.db }

// Mechanism returns the conversation's mechanism.
func (c *Conversation) Mechanism() Mechanism { return c.mech }

// Done reports whether the conversation has ended, in success or failure.
func (c *Conversation) Done() bool { return c.state == convDone }

// Identity returns who logged in once the conversation has succeeded to
// its end, else nil: in the long form, not before the empty last step.
func (c *Conversation) Identity() *Identity { return c.identity }

// Step takes the payload of a saslContinue and returns the reply payload
// and whether the conversation is done. A proof that does not verify ends
// it with an error wrapping ErrAuthFailed; a step after the end wraps
// ErrConversation.
func (c *Conversation) Step(payload []byte) ([]byte, bool, error) {
	switch c.state {
	case convFinal:
		c.state = convDone
		out, err := c.sc.Step(string(payload))
		if err != nil || !c.sc.Valid() {
			return nil, true, fmt.Errorf("%w: %v", ErrAuthFailed, err)
		}
		c.proven = &Identity{User: c.sc.Username(), DB: c.db, Mechanism: c.mech,
			ClientKey: clientKey(c.mech, c.stored.StoredKey, c.c1b, c.s1, string(payload)),
			stored:    c.stored, password: c.password}
		if !c.skipEmpty {
			c.state = convEmpty
			return []byte(out), false, nil
		}
		c.identity = c.proven
		return []byte(out), true, nil
	case convEmpty:
		c.state = convDone
		if len(payload) != 0 {
			c.proven = nil
			return nil, true, fmt.Errorf("%w: the last SCRAM step must be empty", ErrAuthFailed)
		}
		c.identity = c.proven
		return nil, true, nil
	}
	return nil, true, ErrConversation
}

// clientFirstBare drops the GS2 header ("n,," or "n,a=authzid,") from a
// client-first message.
func clientFirstBare(c1 string) string {
	if i := strings.IndexByte(c1, ','); i >= 0 {
		if j := strings.IndexByte(c1[i+1:], ','); j >= 0 {
			return c1[i+1+j+1:]
		}
	}
	return c1
}

// clientKey recovers the ClientKey from a verified client-final message:
// ClientProof XOR HMAC(StoredKey, AuthMessage) (RFC 5802 section 3).
// xdg-go/scram computes it too but does not expose it.
func clientKey(m Mechanism, stored []byte, c1b, s1, c2 string) []byte {
	i := strings.LastIndex(c2, ",p=")
	if i < 0 {
		return nil
	}
	proof, err := base64.StdEncoding.DecodeString(c2[i+3:])
	if err != nil {
		return nil
	}
	mac := hmac.New(hashOf(m), stored)
	mac.Write([]byte(c1b + "," + s1 + "," + c2[:i]))
	sig := mac.Sum(nil)
	if len(sig) != len(proof) {
		return nil
	}
	for k := range proof {
		proof[k] ^= sig[k]
	}
	return proof
}

// IsAuthFailed reports whether err is a failed login (code 18 for
// clients).
func IsAuthFailed(err error) bool { return errors.Is(err, ErrAuthFailed) }
