package upstream

// SCRAM pass-through, as PgBouncer has it: logging in upstream as a
// client's own user without knowing the password. A client that logs in
// to mongobouncer with SCRAM reveals its ClientKey (ClientProof XOR
// ClientSignature); with it and the stored credentials the proof was
// verified against (salt, iteration count, StoredKey, ServerKey),
// mongobouncer can compute the proof of any later conversation, and check
// the server's signature, as long as the upstream has the same salt and
// iteration count for the user.
//
// xdg-go/scram's client only derives its keys from a password (its key
// cache is private), so the client side of SCRAM from keys (keyConv) is
// written here by hand, after RFC 5802; the SASL framing around it is
// scramConv's, shared with the password client.

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"log/slog"
	"strconv"
	"strings"

	"github.com/xdg-go/scram"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// ErrPassThroughMismatch reports that the upstream's salt or iteration
// count for a user differs from the stored credentials mongobouncer
// verified the client against, so the client's ClientKey cannot log in
// there. It arrives inside an *AuthError (itself inside a *ConnectError at
// stage "auth"); errors.Is finds it.
var ErrPassThroughMismatch = errors.New("upstream: the upstream's SCRAM salt or iteration count differs from mongobouncer's stored secret")

// maxSCRAMMessage bounds a server-first or server-final message the
// key-based client parses: a nonce, a salt and a count, or a signature,
// take a few hundred bytes.
const maxSCRAMMessage = 4096

// PassThrough is what logging in upstream as a client's own user takes:
// the mechanism and user the client logged in to mongobouncer with, the
// ClientKey recovered from its proof, and the stored credentials that
// proof was verified against. ClientKey, StoredKey and ServerKey are
// secrets (each is as good as the password for this mechanism and salt):
// never log them. String, GoString and LogValue print neither.
type PassThrough struct {
	// Mechanism is MechanismSCRAMSHA1 or MechanismSCRAMSHA256: the one
	// the client logged in to mongobouncer with.
	Mechanism string
	// Username and Source name the user; Source defaults to "admin".
	Username, Source string
	// ClientKey is HMAC(SaltedPassword, "Client Key").
	ClientKey []byte
	// Stored holds KeyFactors{Salt, Iters}, StoredKey and ServerKey.
	Stored scram.StoredCredentials
}

// String names the mechanism and the user only.
func (p PassThrough) String() string {
	return fmt.Sprintf("%s pass-through for user %q on %q", p.Mechanism, p.Username, p.Source)
}

// GoString is String, for %#v.
func (p PassThrough) GoString() string { return p.String() }

// LogValue is String, for slog.
func (p PassThrough) LogValue() slog.Value { return slog.StringValue(p.String()) }

// NewPassThroughAuthenticator returns a HandshakeAuthenticator that runs
// SCRAM with p's keys: p's mechanism, no negotiation, its first step as
// speculativeAuthenticate in the hello. It checks that p is usable (a
// SCRAM mechanism, a user, keys of the hash's size, a salt and iteration
// count, a ClientKey that hashes to the StoredKey); its errors name what is
// wrong, never a key. A server with another salt or iteration count ends
// the conversation with an *AuthError wrapping ErrPassThroughMismatch.
func NewPassThroughAuthenticator(p PassThrough) (HandshakeAuthenticator, error) {
	var h func() hash.Hash
	switch p.Mechanism {
	case MechanismSCRAMSHA1:
		h = sha1.New
	case MechanismSCRAMSHA256:
		h = sha256.New
	case "":
		return nil, errors.New("upstream: pass-through needs the mechanism the client logged in with")
	default:
		return nil, fmt.Errorf("upstream: pass-through: %w: %s (SCRAM only)", ErrUnsupportedMechanism, p.Mechanism)
	}
	if p.Username == "" {
		return nil, errors.New("upstream: pass-through needs a username")
	}
	if p.Source == "" {
		p.Source = "admin"
	}
	size := h().Size()
	for _, k := range []struct {
		name string
		key  []byte
	}{{"ClientKey", p.ClientKey}, {"StoredKey", p.Stored.StoredKey}, {"ServerKey", p.Stored.ServerKey}} {
		if len(k.key) != size {
			return nil, fmt.Errorf("upstream: pass-through for user %q: the %s has %d bytes, %s needs %d", p.Username, k.name, len(k.key), p.Mechanism, size)
		}
	}
	switch {
	case p.Stored.Iters <= 0:
		return nil, fmt.Errorf("upstream: pass-through for user %q: iteration count %d", p.Username, p.Stored.Iters)
	case p.Stored.Salt == "":
		return nil, fmt.Errorf("upstream: pass-through for user %q: empty salt", p.Username)
	}
	sum := h()
	sum.Write(p.ClientKey)
	if !hmac.Equal(sum.Sum(nil), p.Stored.StoredKey) {
		// Keys of two different logins (or mechanisms) mixed up: no
		// server would accept them.
		return nil, fmt.Errorf("upstream: pass-through for user %q: the ClientKey does not hash to the StoredKey", p.Username)
	}
	// Copies: the caller's slices may be reused.
	p.ClientKey = bytes.Clone(p.ClientKey)
	p.Stored.StoredKey = bytes.Clone(p.Stored.StoredKey)
	p.Stored.ServerKey = bytes.Clone(p.Stored.ServerKey)
	return &passThroughAuth{p: p, hash: h,
		cred: Credential{Mechanism: p.Mechanism, Username: p.Username, Source: p.Source}}, nil
}

// passThroughAuth authenticates with a PassThrough. Every connection of
// one user's pool shares it; it holds no state between conversations.
type passThroughAuth struct {
	p    PassThrough
	hash func() hash.Hash
	cred Credential // p's mechanism and user, no password
	// nonce replaces the random client nonce (tests with the spec's
	// worked exchanges).
	nonce func() string
}

var _ HandshakeAuthenticator = (*passThroughAuth)(nil)

// String is p's, without secrets, should the authenticator be printed.
func (a *passThroughAuth) String() string { return a.p.String() }

// GoString is String, for %#v.
func (a *passThroughAuth) GoString() string { return a.String() }

// LogValue is String, for slog.
func (a *passThroughAuth) LogValue() slog.Value { return slog.StringValue(a.String()) }

// StartHandshake implements HandshakeAuthenticator: the first saslStart as
// speculativeAuthenticate, with the client's mechanism (no negotiation).
func (a *passThroughAuth) StartHandshake() ([]byte, Authenticator, error) {
	conv, err := a.newConv(a.cred.Mechanism)
	if err != nil {
		return nil, nil, err
	}
	elems := bsoncore.AppendDocumentElement(nil, "speculativeAuthenticate", conv.start(true))
	return elems, &scramHandshake{src: a, spec: conv}, nil
}

// Authenticate implements Authenticator for a connection whose hello did
// not come from StartHandshake.
func (a *passThroughAuth) Authenticate(ctx context.Context, c *Conn, hello *Hello) error {
	return (&scramHandshake{src: a}).Authenticate(ctx, c, hello)
}

// credential implements scramSource.
func (a *passThroughAuth) credential() *Credential { return &a.cred }

// newConv implements scramSource; mech is always p's.
func (a *passThroughAuth) newConv(mech string) (*scramConv, error) {
	gen := a.nonce
	if gen == nil {
		gen = newNonce
	}
	conv := &scramConv{cred: &a.cred, mech: mech, conv: &keyConv{p: &a.p, hash: a.hash, genNonce: gen}}
	conv.checkKeyFactors = func(kf scram.KeyFactors) *AuthError {
		if kf == a.p.Stored.KeyFactors {
			return nil
		}
		what := "salt"
		if kf.Iters != a.p.Stored.Iters {
			what = fmt.Sprintf("iteration count (%d, mongobouncer has %d)", kf.Iters, a.p.Stored.Iters)
			if kf.Salt != a.p.Stored.Salt {
				what = "salt and " + what
			}
		}
		ae := conv.fail("pass-through cannot log in: the upstream's " + what + " for this user differs from mongobouncer's stored secret;" +
			" auth_file must hold the user's plain password, or the upstream's own secret as usersInfo {showCredentials: true} shows it")
		ae.Err = ErrPassThroughMismatch
		return ae
	}
	return conv, nil
}

// newNonce is xdg-go/scram's client nonce: 24 random bytes in base64.
func newNonce() string {
	var raw [24]byte
	rand.Read(raw[:]) // never fails (crypto/rand panics instead)
	return base64.StdEncoding.EncodeToString(raw[:])
}

// keyConv states.
const (
	keyConvStart = iota
	keyConvFirst // client-first sent
	keyConvFinal // client-final sent
	keyConvDone
)

// keyConv is the client side of one SCRAM conversation (RFC 5802) from
// keys instead of a password: the proof is ClientKey XOR HMAC(StoredKey,
// AuthMessage), the server's signature HMAC(ServerKey, AuthMessage). It is
// hand-written because xdg-go/scram's client can only derive its keys
// from a password; the messages are xdg-go's byte for byte (no channel
// binding, no authzid, its name encoding and nonce).
type keyConv struct {
	p        *PassThrough
	hash     func() hash.Hash
	genNonce func() string

	state     int
	valid     bool
	nonce     string
	c1b       string // client-first-message-bare
	serverSig []byte
}

// Step implements scramSteps.
func (k *keyConv) Step(challenge string) (string, error) {
	switch k.state {
	case keyConvStart:
		k.state = keyConvFirst
		k.nonce = k.genNonce()
		k.c1b = "n=" + encodeSASLName(k.p.Username) + ",r=" + k.nonce
		return "n,," + k.c1b, nil
	case keyConvFirst:
		k.state = keyConvFinal
		return k.final(challenge)
	case keyConvFinal:
		k.state = keyConvDone
		return "", k.verify(challenge)
	}
	return "", errors.New("conversation already completed")
}

// Done implements scramSteps.
func (k *keyConv) Done() bool { return k.state == keyConvDone }

// Valid implements scramSteps: the server proved it has the ServerKey.
func (k *keyConv) Valid() bool { return k.valid }

// final parses the server-first message (r=<nonce>,s=<salt>,i=<count>
// [,extensions]) and returns the client-final message.
func (k *keyConv) final(s1 string) (string, error) {
	if len(s1) > maxSCRAMMessage {
		return "", fmt.Errorf("server-first message of %d bytes", len(s1))
	}
	if strings.HasPrefix(s1, "m=") {
		return "", errors.New("SCRAM message extensions are not supported")
	}
	fields := strings.Split(s1, ",")
	if len(fields) < 3 {
		return "", errors.New("not enough fields in the server-first message")
	}
	nonce, ok1 := strings.CutPrefix(fields[0], "r=")
	salt64, ok2 := strings.CutPrefix(fields[1], "s=")
	iters, ok3 := strings.CutPrefix(fields[2], "i=")
	if !ok1 || !ok2 || !ok3 {
		return "", errors.New("malformed server-first message")
	}
	if len(nonce) <= len(k.nonce) || !strings.HasPrefix(nonce, k.nonce) {
		return "", errors.New("server nonce did not extend client nonce")
	}
	salt, err := base64.StdEncoding.DecodeString(salt64)
	if err != nil {
		return "", errors.New("malformed salt")
	}
	n, err := strconv.Atoi(iters)
	if err != nil {
		return "", errors.New("malformed iteration count")
	}
	// checkKeyFactors has said so with a better message; this keeps
	// keyConv safe on its own.
	if string(salt) != k.p.Stored.Salt || n != k.p.Stored.Iters {
		return "", ErrPassThroughMismatch
	}
	// c=biws is base64("n,,"): no channel binding, no authzid.
	c2wop := "c=biws,r=" + nonce
	authMsg := []byte(k.c1b + "," + s1 + "," + c2wop)
	proof := k.hmac(k.p.Stored.StoredKey, authMsg)
	for i := range proof {
		proof[i] ^= k.p.ClientKey[i]
	}
	k.serverSig = k.hmac(k.p.Stored.ServerKey, authMsg)
	return c2wop + ",p=" + base64.StdEncoding.EncodeToString(proof), nil
}

// verify checks the server-final message (v=<signature> or e=<error>).
func (k *keyConv) verify(s2 string) error {
	if len(s2) > maxSCRAMMessage {
		return fmt.Errorf("server-final message of %d bytes", len(s2))
	}
	field, _, _ := strings.Cut(s2, ",")
	if e, ok := strings.CutPrefix(field, "e="); ok {
		return fmt.Errorf("server error: %.100q", e)
	}
	v, ok := strings.CutPrefix(field, "v=")
	if !ok {
		return errors.New("malformed server-final message")
	}
	sig, err := base64.StdEncoding.DecodeString(v)
	if err != nil {
		return errors.New("malformed server signature")
	}
	if !hmac.Equal(sig, k.serverSig) {
		return errors.New("server validation failed")
	}
	k.valid = true
	return nil
}

func (k *keyConv) hmac(key, msg []byte) []byte {
	m := hmac.New(k.hash, key)
	m.Write(msg)
	return m.Sum(nil)
}

// encodeSASLName escapes a SCRAM user name as RFC 5802 (and xdg-go) do:
// "=" as "=3D", "," as "=2C".
func encodeSASLName(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "=", "=3D"), ",", "=2C")
}
