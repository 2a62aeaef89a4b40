// Package auth is the server side of client authentication: the users a
// mongobouncer accepts (the auth_file, parsed by ParseFile), their stored
// SCRAM credentials, and the SCRAM-SHA-1 / SCRAM-SHA-256 conversations a
// client connection runs to log in (Authenticator, Conversation).
//
// Credentials are never kept in a form that prints: Creds, Users and
// Identity have no exported secret fields that fmt or slog would show, and
// their String and LogValue methods name the user only.
//
// An unknown user is indistinguishable from a wrong password: the
// Authenticator answers an unknown name with fake stored credentials
// derived from the name and a key (SeedKeys: from the auth_file's
// contents, so stable across restarts), shaped as most real users' are
// (iteration count, salt length), so the conversation runs to its last
// step and fails there with the same error as a wrong proof. Every name
// gets the same saslSupportedMechs, and with a lookup cache every name is
// looked up, auth_file users too, so that timing tells no more.
package auth

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"

	"github.com/xdg-go/scram"
)

// Mechanism is a SASL mechanism name as clients send it.
type Mechanism string

// The mechanisms mongobouncer serves.
const (
	SCRAMSHA1   Mechanism = "SCRAM-SHA-1"
	SCRAMSHA256 Mechanism = "SCRAM-SHA-256"
)

// Mechanisms lists the served mechanisms in the order hello's
// saslSupportedMechs reports them.
var Mechanisms = []Mechanism{SCRAMSHA1, SCRAMSHA256}

// Default iteration counts, MongoDB's own (scramIterationCount and
// scramSHA256IterationCount).
const (
	DefaultIterationsSHA1   = 10000
	DefaultIterationsSHA256 = 15000
	// MinIterations is the smallest count drivers accept (the auth
	// specification makes them refuse fewer).
	MinIterations = 4096
	// DefaultMaxIterations is max_scram_iterations' default: more than
	// six times MongoDB's defaults, far from seconds per login.
	DefaultMaxIterations = 100_000
)

// maxIterations bounds what an auth_file or an auth_user lookup may ask
// for (max_scram_iterations), so that a typo cannot make every login cost
// a client seconds. Logging in upstream has the same bound
// (upstream.SetMaxIterations). Process-wide: the configuration sets it at
// start and on reload, before the auth_file is read.
var maxIterations atomic.Int64

func init() { maxIterations.Store(DefaultMaxIterations) }

// SetMaxIterations sets the largest iteration count stored credentials
// may have (max_scram_iterations); n below MinIterations is ignored.
func SetMaxIterations(n int) {
	if n >= MinIterations {
		maxIterations.Store(int64(n))
	}
}

// MaxIterations returns the largest iteration count stored credentials
// may have now (SetMaxIterations).
func MaxIterations() int { return int(maxIterations.Load()) }

// hashOf returns the hash function of a mechanism, or nil.
func hashOf(m Mechanism) scram.HashGeneratorFcn {
	switch m {
	case SCRAMSHA1:
		return scram.SHA1
	case SCRAMSHA256:
		return scram.SHA256
	}
	return nil
}

// Errors callers branch on.
var (
	// ErrAuthFailed is every failed login: a wrong password, an unknown
	// user, a proof that does not verify. Clients get code 18
	// (AuthenticationFailed) and one message for all of them.
	ErrAuthFailed = errors.New("authentication failed")
	// ErrMechanism is a mechanism mongobouncer does not serve.
	ErrMechanism = errors.New("unsupported authentication mechanism")
	// ErrConversation is a SASL step out of order (a saslContinue without
	// a conversation, after its end, or with another conversationId).
	ErrConversation = errors.New("no such SASL conversation")
	// ErrNotFound is a user a Lookup does not know.
	ErrNotFound = errors.New("user not found")
	// ErrLookupsBusy is a lookup that could not start: CacheOptions.
	// MaxLookups lookups were running for its whole wait. It is not
	// cached, and the login fails as an unknown user's does.
	ErrLookupsBusy = errors.New("too many user lookups running at once")
	// ErrAuthFile is a problem in the auth_file; *FileError wraps it.
	ErrAuthFile = errors.New("invalid auth_file")
)

// UserID is who a user is: a name on its authentication database (the
// driver's authSource, admin by default). Every map of users is keyed by
// it, never by a "user@db" string: "@" is legal in user and database
// names both, so user "a" on database "b@c" and user "a@b" on database
// "c" write the same string and are two users.
type UserID struct {
	User, DB string
}

// String writes "user@db", for display only (logs, admin output): it is
// ambiguous when either part holds an @, so it is never a key.
func (u UserID) String() string { return u.User + "@" + u.DB }

// ParseUserID reads the "user@db" of the auth_file, admin_users and
// auth_user: the database is what follows the last @, so a user name may
// hold @ (an e-mail address) and a database named in these places cannot.
// ok is false when either part is empty. A user whose authentication
// database holds an @ cannot be named there; it can log in only as a
// user found by an auth_user lookup.
func ParseUserID(s string) (id UserID, ok bool) {
	i := strings.LastIndexByte(s, '@')
	if i <= 0 || i == len(s)-1 {
		return UserID{}, false
	}
	return UserID{User: s[:i], DB: s[i+1:]}, true
}

// Creds are one user's stored credentials, at most one per mechanism. The
// zero Creds has none.
type Creds struct {
	sha1, sha256 *scram.StoredCredentials
	// password is the plain password when the auth_file gave one: it is
	// what mongobouncer logs in upstream with as auth_user.
	password string
	// restrict are the user's authenticationRestrictions (a lookup's).
	restrict restrictions
}

// For returns the stored credentials for mechanism m.
func (c Creds) For(m Mechanism) (scram.StoredCredentials, bool) {
	var p *scram.StoredCredentials
	switch m {
	case SCRAMSHA1:
		p = c.sha1
	case SCRAMSHA256:
		p = c.sha256
	}
	if p == nil {
		return scram.StoredCredentials{}, false
	}
	return *p, true
}

// Mechanisms lists the mechanisms c can log in with.
func (c Creds) Mechanisms() []Mechanism {
	var out []Mechanism
	for _, m := range Mechanisms {
		if _, ok := c.For(m); ok {
			out = append(out, m)
		}
	}
	return out
}

// Password returns the plain password the auth_file gave, if any. It is
// only for logging in upstream (auth_user); never log it.
func (c Creds) Password() (string, bool) { return c.password, c.password != "" }

// set adds the credentials of mechanism m; it reports false when c has
// that mechanism already.
func (c *Creds) set(m Mechanism, sc scram.StoredCredentials) bool {
	switch m {
	case SCRAMSHA1:
		if c.sha1 != nil {
			return false
		}
		c.sha1 = &sc
	case SCRAMSHA256:
		if c.sha256 != nil {
			return false
		}
		c.sha256 = &sc
	default:
		return false
	}
	return true
}

// String names the mechanisms only, so that printing Creds shows no secret.
func (c Creds) String() string { return fmt.Sprintf("credentials%v", c.Mechanisms()) }

// GoString is String, for %#v.
func (c Creds) GoString() string { return c.String() }

// LogValue is String, for slog.
func (c Creds) LogValue() slog.Value { return slog.StringValue(c.String()) }

// NewCreds builds credentials from stored values, as a Lookup does from
// usersInfo's showCredentials output.
func NewCreds(stored map[Mechanism]scram.StoredCredentials) (Creds, error) {
	var c Creds
	for m, sc := range stored {
		if hashOf(m) == nil {
			return Creds{}, fmt.Errorf("%w: %q", ErrMechanism, m)
		}
		if err := checkStored(m, sc); err != nil {
			return Creds{}, err
		}
		c.set(m, sc)
	}
	return c, nil
}

// checkStored checks stored credentials for their mechanism's key size
// and a usable iteration count.
func checkStored(m Mechanism, sc scram.StoredCredentials) error {
	size := hashOf(m)().Size()
	switch {
	case len(sc.StoredKey) != size || len(sc.ServerKey) != size:
		return fmt.Errorf("%s keys must be %d bytes", m, size)
	case sc.Iters < MinIterations || sc.Iters > MaxIterations():
		return fmt.Errorf("%s iteration count %d is outside [%d, %d] (max_scram_iterations)", m, sc.Iters, MinIterations, MaxIterations())
	case len(sc.Salt) == 0:
		return fmt.Errorf("%s salt is empty", m)
	}
	return nil
}

// Identity is who a client connection logged in as. ClientKey is the SCRAM
// ClientKey recovered from the client's proof (ClientProof XOR
// ClientSignature): with it mongobouncer can log in upstream as the same
// user without knowing the password (pass-through), for as long as the
// upstream has the same salt and iteration count. Never log it.
type Identity struct {
	User, DB  string
	Mechanism Mechanism
	// ClientKey is nil for mechanisms without one (x509).
	ClientKey []byte

	// stored are the credentials the client's proof verified against,
	// and password the auth_file's plain password if it gave one: with
	// ClientKey, what PassThrough hands to the upstream login.
	stored   scram.StoredCredentials
	password string
}

// PassThrough is what logging in upstream as an identity's own user takes
// (SCRAM pass-through): the plain password when the auth_file gave one,
// which works whatever salt the upstream has; otherwise the ClientKey with
// the stored credentials it was proven against, which work only where the
// upstream has the same salt and iteration count. Never log it.
type PassThrough struct {
	Mechanism Mechanism
	Password  string
	ClientKey []byte
	Stored    scram.StoredCredentials
}

// String names the mechanism only.
func (p PassThrough) String() string { return "pass-through secret (" + string(p.Mechanism) + ")" }

// GoString is String, for %#v.
func (p PassThrough) GoString() string { return p.String() }

// LogValue is String, for slog.
func (p PassThrough) LogValue() slog.Value { return slog.StringValue(p.String()) }

// PassThrough returns the secret to log in upstream as id, false for an
// identity without one (an X.509 login).
func (id *Identity) PassThrough() (PassThrough, bool) {
	if id == nil || (id.password == "" && id.ClientKey == nil) {
		return PassThrough{}, false
	}
	return PassThrough{Mechanism: id.Mechanism, Password: id.password, ClientKey: id.ClientKey, Stored: id.stored}, true
}

// ID returns who logged in: the key of every per-user map.
func (id Identity) ID() UserID { return UserID{User: id.User, DB: id.DB} }

// String names the user and mechanism only, never the ClientKey.
func (id Identity) String() string { return id.ID().String() + " (" + string(id.Mechanism) + ")" }

// GoString is String, for %#v.
func (id Identity) GoString() string { return id.String() }

// LogValue is String, for slog.
func (id Identity) LogValue() slog.Value { return slog.StringValue(id.String()) }
