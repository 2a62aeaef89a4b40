package fakemongo

// Authentication, as mongod does it, for tests of clients that log in:
// SCRAM-SHA-1 and SCRAM-SHA-256 over saslStart / saslContinue (the short
// conversation when the client asks for skipEmptyExchange, else the long
// one, or always the long one with Options.AuthLongForm as FerretDB),
// speculativeAuthenticate and saslSupportedMechs in hello, MONGODB-X509
// with the TLS peer certificate (Options.TLSConfig), and connectionStatus.
// With Options.Users set, every other command but a few (hello, ping,
// buildInfo, ...) needs an authenticated connection (13 Unauthorized).
// xdg-go/scram does the server side of SCRAM.

import (
	"crypto/md5"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"slices"
	"sync"

	"github.com/xdg-go/scram"
	"github.com/xdg-go/stringprep"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Mechanisms the fake authenticates with.
const (
	MechSCRAMSHA1   = "SCRAM-SHA-1"
	MechSCRAMSHA256 = "SCRAM-SHA-256"
	MechX509        = "MONGODB-X509"
)

// codeAuthenticationFailed and codeUnauthorized are the codes mongod
// answers a failed login and an unauthenticated command with.
const (
	codeAuthenticationFailed = 18
	codeUnauthorized         = 13
)

// DefaultIterations is the SCRAM iteration count of users that do not set
// one: the minimum clients accept.
const DefaultIterations = 4096

// User is an account of the fake.
type User struct {
	// Name and DB identify the user (DB defaults to "admin"). An X.509
	// user is named by its certificate's subject (RFC 2253, as
	// pkix.Name.String prints it) on "$external".
	Name string
	DB   string
	// Password is the SCRAM password.
	Password string
	// Mechanisms default to both SCRAM mechanisms; an X.509 user lists
	// MechX509.
	Mechanisms []string
	// Iterations is the SCRAM iteration count (DefaultIterations when 0).
	Iterations int
	// Restrictions are the user's authenticationRestrictions, which
	// usersInfo shows when asked (showAuthenticationRestrictions). The
	// fake does not enforce them on its own logins.
	Restrictions []Restriction
}

// Restriction is one authenticationRestrictions document: CIDR ranges or
// addresses the client must come from (clientSource) and must have
// connected to (serverAddress); nil leaves the field out.
type Restriction struct {
	ClientSource, ServerAddress []string
}

// authUsers holds the users with their SCRAM stored credentials, computed
// once at start (the PBKDF2 work).
type authUsers struct {
	mu      sync.Mutex           // guards byKey and changes (SetUserPassword)
	byKey   map[string]*authUser // "db.name"
	changes int
}

type authUser struct {
	User
	creds map[string]scram.StoredCredentials // by SCRAM mechanism
}

func newAuthUsers(users []User) (*authUsers, error) {
	if len(users) == 0 {
		return nil, nil
	}
	au := &authUsers{byKey: make(map[string]*authUser)}
	for i, u := range users {
		if u.DB == "" {
			u.DB = "admin"
		}
		if len(u.Mechanisms) == 0 {
			u.Mechanisms = []string{MechSCRAMSHA1, MechSCRAMSHA256}
		}
		if u.Iterations == 0 {
			u.Iterations = DefaultIterations
		}
		x, err := newAuthUser(u, fmt.Sprintf("%d", i))
		if err != nil {
			return nil, err
		}
		au.byKey[u.DB+"."+u.Name] = x
	}
	return au, nil
}

// newAuthUser derives u's stored credentials with salts made of tag.
func newAuthUser(u User, tag string) (*authUser, error) {
	x := &authUser{User: u, creds: make(map[string]scram.StoredCredentials)}
	for _, m := range u.Mechanisms {
		var h scram.HashGeneratorFcn
		pw := u.Password
		switch m {
		case MechSCRAMSHA1:
			sum := md5.Sum([]byte(u.Name + ":mongo:" + u.Password))
			h, pw = scram.SHA1, hex.EncodeToString(sum[:])
		case MechSCRAMSHA256:
			h = scram.SHA256
			var err error
			if pw, err = stringprep.SASLprep.Prepare(pw); err != nil {
				return nil, fmt.Errorf("fakemongo: user %s: SASLprep: %v", u.Name, err)
			}
		case MechX509:
			continue
		default:
			return nil, fmt.Errorf("fakemongo: user %s: unknown mechanism %q", u.Name, m)
		}
		c, _ := h.NewClientUnprepped(u.Name, pw, "")
		salt := fmt.Sprintf("fakemongo-salt-%s-%s", m, tag)
		sc, err := c.GetStoredCredentialsWithError(scram.KeyFactors{Salt: salt, Iters: u.Iterations})
		if err != nil {
			return nil, fmt.Errorf("fakemongo: user %s: %v", u.Name, err)
		}
		x.creds[m] = sc
	}
	return x, nil
}

// SetUserPassword changes the password of user name on db, as
// updateUser {pwd} does: its stored credentials are derived again with
// new salts. Connections already logged in as the user stay so.
func (s *Server) SetUserPassword(name, db, password string) error {
	au := s.users
	if au == nil {
		return fmt.Errorf("fakemongo: no users")
	}
	au.mu.Lock()
	defer au.mu.Unlock()
	old := au.byKey[db+"."+name]
	if old == nil {
		return fmt.Errorf("fakemongo: no user %s.%s", db, name)
	}
	au.changes++
	u := old.User
	u.Password = password
	x, err := newAuthUser(u, fmt.Sprintf("%s.%s-v%d", db, name, au.changes))
	if err != nil {
		return err
	}
	au.byKey[db+"."+name] = x
	return nil
}

// DropUser removes user name on db, as dropUser does. Connections logged
// in as the user stay so.
func (s *Server) DropUser(name, db string) error {
	au := s.users
	if au == nil {
		return fmt.Errorf("fakemongo: no users")
	}
	au.mu.Lock()
	defer au.mu.Unlock()
	if au.byKey[db+"."+name] == nil {
		return fmt.Errorf("fakemongo: no user %s.%s", db, name)
	}
	delete(au.byKey, db+"."+name)
	au.changes++
	return nil
}

// get returns the user of key "db.name", or nil.
func (au *authUsers) get(key string) *authUser {
	au.mu.Lock()
	defer au.mu.Unlock()
	return au.byKey[key]
}

func (au *authUsers) lookup(db, name string) *authUser {
	if au == nil {
		return nil
	}
	au.mu.Lock()
	defer au.mu.Unlock()
	return au.byKey[db+"."+name]
}

// connAuth is one connection's authentication state, touched only by the
// connection's own goroutine except through mu.
type connAuth struct {
	// conv is the SCRAM conversation in progress, nil if none.
	conv      *scram.ServerConversation
	convMech  string
	convDB    string
	convID    int32
	skipEmpty bool
	awaitLast bool // the long form: the server's proof was sent, the empty exchange is due
	// pending is "db.name" of the user whose long conversation awaits its
	// empty exchange.
	pending string

	mu   sync.Mutex
	user string // "db.name" once authenticated; guarded by mu
}

func (a *connAuth) authenticated() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.user
}

func (a *connAuth) setUser(u string) {
	a.mu.Lock()
	a.user = u
	a.mu.Unlock()
}

// AuthAttempts returns how many authentication conversations clients
// started (saslStart, speculative or not, and authenticate).
func (s *Server) AuthAttempts() int64 { return s.authAttempts.Load() }

// AuthFailures returns how many of them failed.
func (s *Server) AuthFailures() int64 { return s.authFailures.Load() }

// AuthenticatedUsers returns "db.name" of the user each open connection
// has logged in as ("" for none), by connectionId.
func (s *Server) AuthenticatedUsers() map[int64]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := make(map[int64]string, len(s.conns))
	for c := range s.conns {
		m[c.id] = c.auth.authenticated()
	}
	return m
}

// authExempt are the commands mongod runs without authentication.
var authExempt = []string{"hello", "isMaster", "ismaster", "saslStart", "saslContinue", "authenticate",
	"ping", "buildInfo", "buildinfo", "connectionStatus", "logout", "endSessions"}

// needsAuth answers a command that an unauthenticated connection may not
// run, when the server has users.
func (s *Server) needsAuth(req *Request, c *conn) (Reply, bool) {
	if s.users == nil || c == nil || slices.Contains(authExempt, req.Command) || c.auth.authenticated() != "" {
		return Reply{}, false
	}
	return Error(codeUnauthorized, "", fmt.Sprintf("Command %s requires authentication", req.Command)), true
}

func authFailed() Reply {
	return Error(codeAuthenticationFailed, "", "Authentication failed.")
}

// saslStart begins a SCRAM conversation; cmd is the command (or the
// hello's speculativeAuthenticate) and db its database.
func (s *Server) saslStart(c *conn, cmd bsoncore.Document, db string) Reply {
	s.authAttempts.Add(1)
	a := &c.auth
	a.conv, a.awaitLast = nil, false
	mech, _ := cmd.Lookup("mechanism").StringValueOK()
	var h scram.HashGeneratorFcn
	switch mech {
	case MechSCRAMSHA1:
		h = scram.SHA1
	case MechSCRAMSHA256:
		h = scram.SHA256
	default:
		s.authFailures.Add(1)
		return Error(codeBadValue, "MechanismUnavailable", fmt.Sprintf("Received authentication for mechanism %s which is not enabled", mech))
	}
	_, payload, ok := cmd.Lookup("payload").BinaryOK()
	if !ok {
		s.authFailures.Add(1)
		return Error(codeBadValue, "", "saslStart needs a binary payload")
	}
	srv, _ := h.NewServer(func(name string) (scram.StoredCredentials, error) {
		u := s.users.lookup(db, name)
		if u == nil {
			return scram.StoredCredentials{}, fmt.Errorf("no user %s", name)
		}
		sc, ok := u.creds[mech]
		if !ok {
			return scram.StoredCredentials{}, fmt.Errorf("user %s has no %s credentials", name, mech)
		}
		return sc, nil
	})
	conv := srv.NewConversation()
	out, err := conv.Step(string(payload))
	if err != nil {
		s.authFailures.Add(1)
		return authFailed()
	}
	skip, _ := cmd.Lookup("options", "skipEmptyExchange").BooleanOK()
	a.conv, a.convMech, a.convDB = conv, mech, db
	a.convID++
	a.skipEmpty = skip && !s.opts.AuthLongForm
	return saslReply(a.convID, out, false)
}

// saslContinue carries on the connection's SCRAM conversation.
func (s *Server) saslContinue(c *conn, req *Request) Reply {
	a := &c.auth
	id, _ := req.Lookup("conversationId").AsInt64OK()
	if a.conv == nil || id != int64(a.convID) {
		return Error(codeBadValue, "ProtocolError", "No SASL session state found")
	}
	_, payload, _ := req.Lookup("payload").BinaryOK()
	if a.awaitLast {
		a.conv, a.awaitLast = nil, false
		a.setUser(a.pending)
		return saslReply(a.convID, "", true)
	}
	out, err := a.conv.Step(string(payload))
	if err != nil || !a.conv.Valid() {
		a.conv = nil
		s.authFailures.Add(1)
		return authFailed()
	}
	if a.skipEmpty {
		a.setUser(a.convDB + "." + a.conv.Username())
		a.conv = nil
		return saslReply(a.convID, out, true)
	}
	a.awaitLast, a.pending = true, a.convDB+"."+a.conv.Username()
	return saslReply(a.convID, out, false)
}

func saslReply(id int32, payload string, done bool) Reply {
	return Docs(bson.D{
		{Key: "conversationId", Value: id},
		{Key: "done", Value: done},
		{Key: "payload", Value: bson.Binary{Data: []byte(payload)}},
		{Key: "ok", Value: 1.0},
	})
}

// authenticateX509 runs {authenticate: 1, mechanism: "MONGODB-X509"}: the
// TLS peer certificate's subject must be an X.509 user of $external (and
// the user field, when given, that subject).
func (s *Server) authenticateX509(c *conn, cmd bsoncore.Document, db string) Reply {
	s.authAttempts.Add(1)
	fail := func(msg string) Reply {
		s.authFailures.Add(1)
		return Error(codeAuthenticationFailed, "", msg)
	}
	if mech, _ := cmd.Lookup("mechanism").StringValueOK(); mech != MechX509 {
		return fail("Unsupported mechanism for authenticate: " + mech)
	}
	if db != "$external" {
		return fail("X.509 authentication must always use the $external database.")
	}
	tc, ok := c.nc.(*tls.Conn)
	if !ok {
		return fail("No verified subject name available from client")
	}
	certs := tc.ConnectionState().PeerCertificates
	if len(certs) == 0 {
		return fail("No verified subject name available from client")
	}
	subject := certs[0].Subject.String()
	if user, ok := cmd.Lookup("user").StringValueOK(); ok && user != subject {
		return fail("There is no x.509 client certificate matching the user.")
	}
	u := s.users.lookup("$external", subject)
	if u == nil || !slices.Contains(u.Mechanisms, MechX509) {
		return fail("Could not find user \"" + subject + "\" for db \"$external\"")
	}
	c.auth.setUser("$external." + subject)
	return OK(bson.E{Key: "dbname", Value: "$external"}, bson.E{Key: "user", Value: subject})
}

// appendHelloAuth adds what a hello asks of authentication to its reply:
// the user's mechanisms for saslSupportedMechs, and the answer to a
// speculativeAuthenticate (left out when it failed, as mongod does).
func (s *Server) appendHelloAuth(dst []byte, req *Request) []byte {
	if s.users == nil {
		return dst
	}
	if name, ok := req.Lookup("saslSupportedMechs").StringValueOK(); ok {
		if u := s.users.get(name); u != nil {
			var aidx int32
			aidx, dst = bsoncore.AppendArrayElementStart(dst, "saslSupportedMechs")
			for i, m := range u.Mechanisms {
				dst = bsoncore.AppendStringElement(dst, arrayKey(i), m)
			}
			dst = endDoc(dst, aidx)
		}
	}
	spec, ok := req.Lookup("speculativeAuthenticate").DocumentOK()
	if !ok || s.opts.NoSpeculativeAuth || req.conn == nil {
		return dst
	}
	var r Reply
	switch {
	case spec.Lookup("saslStart").Type != 0:
		db, _ := spec.Lookup("db").StringValueOK()
		r = s.saslStart(req.conn, spec, db)
	case spec.Lookup("authenticate").Type != 0:
		r = s.authenticateX509(req.conn, spec, "$external")
	default:
		return dst
	}
	doc := r.Docs[0]
	if ok, _ := doc.Lookup("ok").AsFloat64OK(); ok != 1 {
		return dst
	}
	// The reply without ok, as mongod nests it.
	idx, sub := bsoncore.AppendDocumentStart(nil)
	elems, _ := doc.Elements()
	for _, e := range elems {
		if e.Key() != "ok" {
			sub = append(sub, e...)
		}
	}
	sub = endDoc(sub, idx)
	return bsoncore.AppendDocumentElement(dst, "speculativeAuthenticate", sub)
}

// connectionStatus answers with the connection's authenticated user.
func (s *Server) connectionStatus(c *conn) Reply {
	users := bson.A{}
	if c != nil {
		if u := c.auth.authenticated(); u != "" {
			db, name, _ := cutDB(u)
			users = append(users, bson.D{{Key: "user", Value: name}, {Key: "db", Value: db}})
		}
	}
	return OK(bson.E{Key: "authInfo", Value: bson.D{
		{Key: "authenticatedUsers", Value: users},
		{Key: "authenticatedUserRoles", Value: bson.A{}},
	}})
}

// cutDB splits "db.name" at the first dot (database names have none).
func cutDB(s string) (db, name string, ok bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == '.' {
			return s[:i], s[i+1:], true
		}
	}
	return "", s, false
}
