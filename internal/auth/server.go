package auth

// The server side of a login: the Authenticator holds the users in force
// (swapped whole on reload) and starts one Conversation per login attempt.

import (
	"cmp"
	"context"
	"crypto/hmac"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/xdg-go/scram"
)

// Authenticator logs clients in. It is safe for concurrent use.
type Authenticator struct {
	state atomic.Pointer[authState]
	keys  *keyring
	// cache is the auth_user lookup cache, nil without a Lookup.
	cache *Cache
	// shapes shape the fake credentials like the real users'.
	shapes *shapes
	obs    atomic.Pointer[observerBox]
	log    atomic.Pointer[slog.Logger]
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
	a := &Authenticator{keys: processKeys, cache: cache, shapes: newShapes()}
	if cache != nil {
		cache.onFound = a.shapes.found
	}
	a.Update(users, admins)
	return a
}

// SetObserver makes the Authenticator and its lookup cache report failed
// logins and lookups to o (nil: to nobody). Call it before serving.
func (a *Authenticator) SetObserver(o Observer) {
	if o == nil {
		a.obs.Store(nil)
	} else {
		a.obs.Store(&observerBox{o})
	}
	if a.cache != nil {
		a.cache.setObserver(o)
	}
}

// SetLogger gives the Authenticator a logger, for the logins it refuses
// by a user's authenticationRestrictions (nil: slog's default).
func (a *Authenticator) SetLogger(l *slog.Logger) { a.log.Store(l) }

func (a *Authenticator) logger() *slog.Logger {
	if l := a.log.Load(); l != nil {
		return l
	}
	return slog.Default()
}

// failed reports a failed login to the Observer.
func (a *Authenticator) failed(reason string) {
	if b := a.obs.Load(); b != nil {
		b.o.AuthFailed(reason)
	}
}

// Cache returns the auth_user lookup cache, nil without one.
func (a *Authenticator) Cache() *Cache { return a.cache }

// Update replaces the users and admins, as a reload does. Conversations
// already started finish with the credentials they began with; logged-in
// connections keep their identity.
func (a *Authenticator) Update(users *Users, admins []UserID) {
	st := &authState{users: users, admins: map[UserID]bool{}}
	for _, u := range admins {
		st.admins[u] = true
	}
	a.state.Store(st)
	a.shapes.setFile(users)
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

// resolve finds user@db for a login from peer: the auth_file first, then
// the lookup cache, giving the reason of the failure when the user is not
// to log in. With a cache, the user is looked up even when the auth_file
// has it (the answer unused): looking up both or neither, the time a login
// takes does not tell an auth_file user from an unknown name. notBefore is
// as for Cache.get: a cached answer fetched earlier is asked again.
func (a *Authenticator) resolve(ctx context.Context, peer Peer, known bool, user, db string, notBefore time.Time) (Creds, string) {
	fileCreds, inFile := a.state.Load().users.Lookup(user, db)
	var (
		e   *cacheEntry
		err error
	)
	if a.cache != nil {
		e, err = a.cache.get(ctx, lookupKey{user, db}, notBefore)
	}
	switch {
	case inFile:
		return fileCreds, ""
	case a.cache == nil:
		return Creds{}, FailUnknownUser
	}
	if err == nil {
		err = e.err
	}
	switch {
	case errors.Is(err, ErrNotFound):
		return Creds{}, FailUnknownUser
	case err != nil:
		return Creds{}, FailLookupFailed
	case !e.creds.restrict.allows(peer, known):
		if notBefore.IsZero() { // once per attempt: not again at a failed proof's second look
			a.logger().Warn("client login refused by the user's authenticationRestrictions",
				"user", UserID{User: user, DB: db}, "remote", peer.Remote, "local", peer.Local)
		}
		return Creds{}, FailRestricted
	}
	return e.creds, ""
}

// now is the clock of the cache (a test's), else the time.
func (a *Authenticator) now() time.Time {
	if a.cache != nil {
		return a.cache.now()
	}
	return time.Now()
}

// Mechanisms returns what hello's saslSupportedMechs reports for user@db:
// both mechanisms, whoever the user is, known or not, so that the answer
// tells nobody who exists, and without a lookup, so that asking costs the
// upstream nothing. A user without SCRAM-SHA-256 credentials (created
// with SCRAM-SHA-1 only) then fails with a driver that picks SCRAM-SHA-256
// as with a wrong password: such a user names its mechanism
// (authMechanism=SCRAM-SHA-1), see docs/operations.md.
func (a *Authenticator) Mechanisms(ctx context.Context, user, db string) []Mechanism {
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
	c1, c1b  string
	s1       string
	state    convState
	// user is the name the client-first message gave; start when the
	// attempt began, peer (if known) where the client is; reason why the
	// login is to fail ("" for a known user: a wrong proof); retried
	// whether a failed proof looked the user up again already.
	user    string
	start   time.Time
	peer    Peer
	known   bool
	reason  string
	retried bool
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
	c := &Conversation{a: a, mech: mechanism, db: db, skipEmpty: skipEmpty, start: a.now()}
	c.peer, c.known = PeerFrom(ctx)
	lookup := func(user string) (scram.StoredCredentials, error) {
		c.user = user
		creds, reason := a.resolve(ctx, c.peer, c.known, user, db, time.Time{})
		if reason == "" {
			if sc, ok := creds.For(mechanism); ok {
				c.stored = sc
				c.password, _ = creds.Password()
				return sc, nil
			}
			reason = FailUnknownUser
		}
		// Unknown, or without this mechanism: fake, to fail at the proof.
		c.reason = reason
		// Named unambiguously (the user's length first), so that no two
		// users share fake credentials.
		sc := a.keys.fake(mechanism, strconv.Itoa(len(user))+":"+user+db, a.shapes.common(mechanism))
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
		a.failed(FailMalformed)
		return nil, nil, fmt.Errorf("%w: client-first message: %v", ErrAuthFailed, err)
	}
	c.c1 = string(payload)
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
			var ok bool
			if out, ok = c.retry(payload); !ok {
				c.a.failed(cmp.Or(c.reason, FailBadProof))
				return nil, true, fmt.Errorf("%w: %v", ErrAuthFailed, err)
			}
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
