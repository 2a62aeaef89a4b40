package upstream

// SCRAM-SHA-1 and SCRAM-SHA-256 over MongoDB's SASL commands (the auth
// spec), with github.com/xdg-go/scram doing the SCRAM computations. What
// is MongoDB's own: the SHA-1 password is the hex MD5 digest of
// "user:mongo:password", SHA-256 prepares the password (not the user name)
// with SASLprep, saslStart asks for the short conversation
// (skipEmptyExchange) but the long one (a final empty saslContinue, as
// FerretDB has it) works too, and the first saslStart can ride in the
// hello (speculativeAuthenticate).

import (
	"context"
	"crypto/md5"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/xdg-go/scram"
	"github.com/xdg-go/stringprep"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// maxSASLSteps bounds the replies one conversation reads: SCRAM needs
// two, three in the long form.
const maxSASLSteps = 4

// DefaultMaxIterations is the default bound on the PBKDF2 iteration
// count a server may ask for (max_scram_iterations; mongod's defaults
// are 10000 and 15000): the derivation cannot be interrupted, so each
// 100k iterations hold a CPU for tens of milliseconds per connection a
// pool opens, past the connect timeout. It is the bound mongobouncer's
// own users have (auth.SetMaxIterations): more than six times the
// defaults, far from seconds per login. A server asking for more is
// refused before any key is derived.
const DefaultMaxIterations = 100_000

// maxIterations is the bound in force (SetMaxIterations); process-wide.
var maxIterations atomic.Int64

func init() { maxIterations.Store(DefaultMaxIterations) }

// SetMaxIterations sets the largest iteration count an upstream may ask
// for (max_scram_iterations); n < 1 is ignored.
func SetMaxIterations(n int) {
	if n >= 1 {
		maxIterations.Store(int64(n))
	}
}

// maxCachedKeyFactors bounds the (salt, iterations) pairs whose derived
// keys each mechanism keeps. One user has one pair per mechanism on every
// member of a deployment; past the bound the cache starts over, so a
// server sending ever new salts cannot grow it.
const maxCachedKeyFactors = 8

// scramAuth authenticates with SCRAM. It is shared by every connection of
// a route: the derived keys (the PBKDF2 work, thousands of hash
// iterations) are computed once per mechanism, salt and iteration count,
// as the spec requires, so a new pooled connection costs only the
// conversation's round trips and a few HMACs.
type scramAuth struct {
	cred Credential
	// nonce replaces the random client nonce (tests with the spec's
	// worked exchanges).
	nonce func() string

	mu      sync.Mutex
	clients map[string]*scramClient // by mechanism; guarded by mu
}

// scramClient is one mechanism's xdg-go client, which holds the key cache,
// and the key factors that cache has seen.
type scramClient struct {
	c        *scram.Client
	password string // prepared (SHA-256) or digested (SHA-1)
	seen     map[scram.KeyFactors]struct{}
}

var _ HandshakeAuthenticator = (*scramAuth)(nil)

// String is the credential's, without the password, should the
// authenticator be printed (the fields hold the password, and fmt prints
// unexported fields); GoString and LogValue likewise.
func (a *scramAuth) String() string { return a.cred.String() }

// GoString is String, for %#v.
func (a *scramAuth) GoString() string { return a.String() }

// LogValue is String, for slog.
func (a *scramAuth) LogValue() slog.Value { return slog.StringValue(a.String()) }

// String hides the prepared password (as good as the password).
func (sc *scramClient) String() string { return "SCRAM client" }

// GoString is String, for %#v.
func (sc *scramClient) GoString() string { return sc.String() }

func newSCRAM(c Credential) (*scramAuth, error) {
	a := &scramAuth{cred: c, clients: make(map[string]*scramClient)}
	if c.Mechanism != "" {
		// An unusable password is a configuration error: say so now.
		if _, err := a.client(c.Mechanism); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// client returns the xdg-go client of mech, creating it on first use.
func (a *scramAuth) client(mech string) (*scram.Client, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if sc := a.clients[mech]; sc != nil {
		return sc.c, nil
	}
	var pw string
	switch mech {
	case MechanismSCRAMSHA1:
		sum := md5.Sum([]byte(a.cred.Username + ":mongo:" + a.cred.Password))
		pw = hex.EncodeToString(sum[:])
	case MechanismSCRAMSHA256:
		var err error
		if pw, err = stringprep.SASLprep.Prepare(a.cred.Password); err != nil {
			// stringprep's message quotes the offending character of the
			// password: keep only its reason.
			msg := "invalid"
			var pe stringprep.Error
			if errors.As(err, &pe) {
				msg = pe.Msg
			}
			return nil, a.fail(mech, "the password cannot be prepared with SASLprep: "+msg)
		}
	default:
		return nil, fmt.Errorf("upstream: %w: %s", ErrUnsupportedMechanism, mech)
	}
	sc := &scramClient{password: pw}
	a.newClientLocked(mech, sc)
	a.clients[mech] = sc
	return sc.c, nil
}

// newClientLocked gives sc a fresh xdg-go client, and so an empty cache.
func (a *scramAuth) newClientLocked(mech string, sc *scramClient) {
	h := scram.SHA1
	if mech == MechanismSCRAMSHA256 {
		h = scram.SHA256
	}
	// Unprepped: the spec forbids SASLprep on the user name, and the
	// password was prepared (or digested) above.
	c, _ := h.NewClientUnprepped(a.cred.Username, sc.password, "") // never fails
	sc.c = c
	sc.seen = make(map[scram.KeyFactors]struct{})
}

// noteKeyFactors records that mech's cache is about to hold kf, starting
// the cache over when it holds too many others.
func (a *scramAuth) noteKeyFactors(mech string, kf scram.KeyFactors) {
	a.mu.Lock()
	defer a.mu.Unlock()
	sc := a.clients[mech]
	if sc == nil {
		return
	}
	if _, ok := sc.seen[kf]; ok {
		return
	}
	if len(sc.seen) >= maxCachedKeyFactors {
		a.newClientLocked(mech, sc)
	}
	sc.seen[kf] = struct{}{}
}

// fail builds an *AuthError of mongobouncer's own (no server code).
func (a *scramAuth) fail(mech, msg string) *AuthError {
	return &AuthError{Mechanism: mech, Username: a.cred.Username, Source: a.cred.Source, Message: msg}
}

// StartHandshake implements HandshakeAuthenticator: saslSupportedMechs
// when the mechanism is to be negotiated, and the first saslStart (of
// SCRAM-SHA-256 when negotiating, as the handshake spec says) as
// speculativeAuthenticate.
func (a *scramAuth) StartHandshake() ([]byte, Authenticator, error) {
	mech := a.cred.Mechanism
	var elems []byte
	if mech == "" {
		mech = MechanismSCRAMSHA256
		elems = bsoncore.AppendStringElement(elems, "saslSupportedMechs", a.cred.Source+"."+a.cred.Username)
	}
	conv, err := a.newConv(mech)
	if err != nil {
		if a.cred.Mechanism != "" {
			return nil, nil, err
		}
		// A password SASLprep refuses: no speculation; the negotiation
		// may still pick SCRAM-SHA-1.
		return elems, &scramHandshake{src: a}, nil
	}
	elems = bsoncore.AppendDocumentElement(elems, "speculativeAuthenticate", conv.start(true))
	return elems, &scramHandshake{src: a, spec: conv}, nil
}

// Authenticate implements Authenticator for a connection whose hello did
// not come from StartHandshake: the mechanism is the configured one, else
// chosen from hello.SaslSupportedMechs.
func (a *scramAuth) Authenticate(ctx context.Context, c *Conn, hello *Hello) error {
	return (&scramHandshake{src: a}).Authenticate(ctx, c, hello)
}

// credential implements scramSource.
func (a *scramAuth) credential() *Credential { return &a.cred }

// scramSource is what a scramHandshake starts conversations from: a
// password (scramAuth) or the keys of a client's own login
// (passThroughAuth).
type scramSource interface {
	// credential names the user; an empty Mechanism is negotiated.
	credential() *Credential
	// newConv starts a conversation of mech.
	newConv(mech string) (*scramConv, error)
}

// scramHandshake finishes the authentication of one connection.
type scramHandshake struct {
	src  scramSource
	spec *scramConv // the speculative conversation, nil if none was sent
}

// Authenticate implements Authenticator.
func (h *scramHandshake) Authenticate(ctx context.Context, c *Conn, hello *Hello) error {
	if h.spec != nil && hello.SpeculativeAuthenticate != nil {
		return h.spec.finish(ctx, c, hello.SpeculativeAuthenticate)
	}
	// No speculative answer (an older server, FerretDB, or a user the
	// server did not find): the ordinary conversation, with the mechanism
	// the spec's negotiation rules choose.
	cred := h.src.credential()
	mech := cred.Mechanism
	if mech == "" {
		mech = MechanismSCRAMSHA1
		if slices.Contains(hello.SaslSupportedMechs, MechanismSCRAMSHA256) {
			mech = MechanismSCRAMSHA256
		}
	}
	conv, err := h.src.newConv(mech)
	if err != nil {
		return err
	}
	reply, err := authCommand(ctx, c, cred, mech, conv.start(false))
	if err != nil {
		return err
	}
	return conv.finish(ctx, c, reply)
}

// newConv implements scramSource.
func (a *scramAuth) newConv(mech string) (*scramConv, error) {
	c, err := a.client(mech)
	if err != nil {
		return nil, err
	}
	if a.nonce != nil {
		c.WithNonceGenerator(a.nonce)
	}
	conv := &scramConv{cred: &a.cred, mech: mech, conv: c.NewConversation()}
	conv.checkKeyFactors = func(kf scram.KeyFactors) *AuthError {
		if limit := int(maxIterations.Load()); kf.Iters > limit {
			return conv.fail(fmt.Sprintf("the server asks for %d iterations, more than %d (max_scram_iterations)", kf.Iters, limit))
		}
		a.noteKeyFactors(mech, kf)
		return nil
	}
	return conv, nil
}

// scramSteps is the client side of SCRAM that a scramConv drives:
// xdg-go's ClientConversation, which derives its keys from a password, or
// keyConv, which is given them (pass-through). Step("") returns the
// client-first message; Done and Valid are as xdg-go has them.
type scramSteps interface {
	Step(challenge string) (string, error)
	Done() bool
	Valid() bool
}

// scramConv is one SCRAM conversation: the SASL commands around a SCRAM
// client's state machine. It does no I/O (finish aside), so that every
// server reply can be fuzzed through next.
type scramConv struct {
	cred *Credential
	mech string
	conv scramSteps
	// checkKeyFactors judges the salt and iteration count of the
	// server-first message before the client computes anything with
	// them; an *AuthError it returns ends the conversation.
	checkKeyFactors func(scram.KeyFactors) *AuthError
	id              int32 // conversationId
	hasID           bool
	steps           int
}

// fail builds an *AuthError of mongobouncer's own (no server code).
func (s *scramConv) fail(msg string) *AuthError {
	return &AuthError{Mechanism: s.mech, Username: s.cred.Username, Source: s.cred.Source, Message: msg}
}

// start returns the saslStart command; speculative adds the db field (the
// hello runs on admin, whatever the source).
func (s *scramConv) start(speculative bool) bsoncore.Document {
	first, _ := s.conv.Step("") // the client-first message cannot fail
	b := bsoncore.NewDocumentBuilder().
		AppendInt32("saslStart", 1).
		AppendString("mechanism", s.mech).
		AppendBinary("payload", 0, []byte(first)).
		AppendDocument("options", bsoncore.NewDocumentBuilder().AppendBoolean("skipEmptyExchange", true).Build())
	if speculative {
		b.AppendString("db", s.cred.Source)
	}
	return b.Build()
}

// finish carries the conversation from the server's first reply to its
// end.
func (s *scramConv) finish(ctx context.Context, c *Conn, reply bsoncore.Document) error {
	for {
		cmd, done, err := s.next(reply)
		if err != nil || done {
			return err
		}
		if reply, err = authCommand(ctx, c, s.cred, s.mech, cmd); err != nil {
			return err
		}
	}
}

// next takes a server reply ({conversationId, done, payload}) and returns
// the saslContinue to send, or done when the conversation has ended with
// the server proven to know the password.
func (s *scramConv) next(reply bsoncore.Document) (cmd bsoncore.Document, done bool, err error) {
	if s.steps++; s.steps > maxSASLSteps {
		return nil, false, s.fail("the server did not end the conversation")
	}
	if err := reply.Validate(); err != nil {
		return nil, false, s.fail("malformed reply: " + err.Error())
	}
	if v, err := reply.LookupErr("conversationId"); err == nil {
		id, ok := v.AsInt64OK()
		if !ok || id != int64(int32(id)) {
			return nil, false, s.fail("malformed reply: bad conversationId")
		}
		if s.hasID && int32(id) != s.id {
			return nil, false, s.fail("the server changed the conversationId")
		}
		s.id, s.hasID = int32(id), true
	} else if !s.hasID {
		return nil, false, s.fail("malformed reply: no conversationId")
	}
	serverDone, _ := reply.Lookup("done").BooleanOK()
	payload, ok := saslPayload(reply)
	if !ok {
		return nil, false, s.fail("malformed reply: bad payload")
	}
	if s.conv.Done() {
		// The reply to the empty saslContinue of the long form.
		if !serverDone {
			return nil, false, s.fail("the server did not end the conversation")
		}
		return nil, true, nil
	}
	if s.steps == 1 {
		kf, ok := keyFactors(payload)
		if !ok {
			return nil, false, s.fail("malformed server-first message")
		}
		if s.checkKeyFactors != nil {
			if ae := s.checkKeyFactors(kf); ae != nil {
				return nil, false, ae
			}
		}
	}
	out, err := s.conv.Step(string(payload))
	if err != nil {
		// Neither client's messages carry a secret: a bad nonce, too few
		// iterations, "server validation failed" for a wrong signature.
		return nil, false, s.fail("the server's SCRAM message was refused: " + err.Error())
	}
	if s.conv.Done() {
		if !s.conv.Valid() {
			return nil, false, s.fail("the server could not prove it knows the password")
		}
		if serverDone {
			return nil, true, nil
		}
		out = "" // the long form: one more, empty, exchange
	} else if serverDone {
		return nil, false, s.fail("the server ended the conversation before proving it knows the password")
	}
	return bsoncore.NewDocumentBuilder().
		AppendInt32("saslContinue", 1).
		AppendInt32("conversationId", s.id).
		AppendBinary("payload", 0, []byte(out)).
		Build(), false, nil
}

// saslPayload returns a reply's payload: binary, or a base64 string
// (servers send binary to clients that send binary). A missing payload is
// empty.
func saslPayload(reply bsoncore.Document) ([]byte, bool) {
	v, err := reply.LookupErr("payload")
	if err != nil {
		return nil, true
	}
	if _, data, ok := v.BinaryOK(); ok {
		return data, true
	}
	if s, ok := v.StringValueOK(); ok {
		b, err := base64.StdEncoding.DecodeString(s)
		return b, err == nil
	}
	return nil, false
}

// keyFactors reads the salt and iteration count of a server-first message
// (r=...,s=<base64>,i=<n>), as the key cache is keyed.
func keyFactors(msg []byte) (scram.KeyFactors, bool) {
	var kf scram.KeyFactors
	var haveSalt, haveIters bool
	for attr := range strings.SplitSeq(string(msg), ",") {
		switch {
		case strings.HasPrefix(attr, "s="):
			salt, err := base64.StdEncoding.DecodeString(attr[2:])
			if err != nil {
				return kf, false
			}
			kf.Salt, haveSalt = string(salt), true
		case strings.HasPrefix(attr, "i="):
			n, err := strconv.Atoi(attr[2:])
			if err != nil || n <= 0 {
				return kf, false
			}
			kf.Iters, haveIters = n, true
		}
	}
	return kf, haveSalt && haveIters
}
