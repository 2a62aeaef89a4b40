package auth

// A failed proof's second look: when a client's proof does not verify
// against credentials the auth_user lookup cached before the attempt
// began, the user is looked up again (once per attempt), since the
// password may have changed upstream. If the new credentials have the
// salt and iteration count the server-first message already gave the
// client, the proof is checked against them within the same attempt: a
// new password works at once. Otherwise the client derived its proof from
// the old salt and cannot be checked: the attempt fails, and the next one
// gets the new salt. A user dropped upstream fails at once either way.

import (
	"context"
	"crypto/hmac"
	"encoding/base64"
	"strings"

	"github.com/xdg-go/scram"
)

// retry looks the user up again after a failed proof c2 and checks c2
// against the new credentials. It returns the server-final message and
// true when they verify it; c.reason then says why not.
func (c *Conversation) retry(c2 []byte) (string, bool) {
	a := c.a
	if a.cache == nil || c.retried || c.user == "" {
		return "", false
	}
	c.retried = true
	ctx, cancel := context.WithTimeout(context.Background(), a.cache.opts.Timeout)
	defer cancel()
	if c.known {
		ctx = WithPeer(ctx, c.peer)
	}
	// An answer fetched since the attempt began is not asked again: it is
	// as new as a second look would be.
	creds, reason := a.resolve(ctx, c.peer, c.known, c.user, c.db, c.start)
	if reason != "" {
		c.reason = reason
		return "", false
	}
	sc, ok := creds.For(c.mech)
	if !ok {
		c.reason = FailUnknownUser
		return "", false
	}
	if sc.Salt != c.stored.Salt || sc.Iters != c.stored.Iters {
		return "", false // the next attempt gets the new salt
	}
	if hmac.Equal(sc.StoredKey, c.stored.StoredKey) && hmac.Equal(sc.ServerKey, c.stored.ServerKey) {
		c.reason = "" // unchanged: a wrong password
		return "", false
	}
	out, ok := verifyFinal(c.mech, sc, c.c1, c.s1, string(c2))
	if !ok {
		c.reason = ""
		return "", false
	}
	c.stored, c.reason = sc, ""
	c.password, _ = creds.Password()
	return out, true
}

// verifyFinal checks a client-final message c2 against stored
// credentials, for the conversation of client-first c1 and server-first
// s1 (RFC 5802 section 3: the channel binding is the GS2 header, the
// nonce the server's, and H(ClientProof XOR ClientSignature) the
// StoredKey), and returns the server-final message.
func verifyFinal(m Mechanism, sc scram.StoredCredentials, c1, s1, c2 string) (string, bool) {
	c1b := clientFirstBare(c1)
	gs2 := c1[:len(c1)-len(c1b)]
	nonce, _, _ := strings.Cut(s1, ",")
	fields := strings.Split(c2, ",")
	i := strings.LastIndex(c2, ",p=")
	if len(fields) < 3 || i < 0 || !strings.HasPrefix(nonce, "r=") ||
		fields[0] != "c="+base64.StdEncoding.EncodeToString([]byte(gs2)) || fields[1] != nonce {
		return "", false
	}
	ck := clientKey(m, sc.StoredKey, c1b, s1, c2)
	if ck == nil {
		return "", false
	}
	h := hashOf(m)()
	h.Write(ck)
	if !hmac.Equal(h.Sum(nil), sc.StoredKey) {
		return "", false
	}
	mac := hmac.New(hashOf(m), sc.ServerKey)
	mac.Write([]byte(c1b + "," + s1 + "," + c2[:i]))
	return "v=" + base64.StdEncoding.EncodeToString(mac.Sum(nil)), true
}
