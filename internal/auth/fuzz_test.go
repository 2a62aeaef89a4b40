package auth

import (
	"bytes"
	"context"
	"crypto/hmac"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/xdg-go/scram"
)

// FuzzParseFile feeds arbitrary auth_files to the parser: it must never
// panic, and what it accepts must give usable credentials.
func FuzzParseFile(f *testing.F) {
	line, _ := HashPassword("u", "db", "pw")
	for _, s := range []string{
		"", "# c\n", `"u@db" "pw"`, line, `"a""b@db" "x"` + "\r\n", `"u@db" "SCRAM-SHA-1$4096:YWJj$` + strings.Repeat("A", 27) + "=:x\"",
		`"u@db"`, `"u@db" "x" # y`, "\"u@db\" \"SCRAM-SHA-256$ SCRAM-SHA-1$\"",
	} {
		f.Add([]byte(s))
	}
	// One PBKDF2 round per plain password: the count takes no parsing
	// path, and MongoDB's 25,000 made the target hash rather than parse.
	plainIterations = func(Mechanism) int { return 1 }
	f.Cleanup(func() { plainIterations = iterationsOf })
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 4096 {
			return // plain passwords cost a key derivation per line
		}
		u, err := ParseFile(data, "fuzz")
		if err != nil {
			return
		}
		for _, c := range u.m {
			if len(c.Mechanisms()) == 0 {
				t.Fatal("a user without credentials")
			}
		}
	})
}

// fuzzServerNonce is FuzzConversation's server nonce: fixed, so that a
// client-final message can carry the nonce the server expects, and the
// fuzzer reaches the proof check (with a random one, every input stopped
// at the nonce comparison).
const fuzzServerNonce = "fuzzServerNonce0123456789"

// fuzzPassword is FuzzConversation's user's password.
const fuzzPassword = "a long random password nobody guesses"

// FuzzConversation sends arbitrary client-first and client-final messages
// to the server side: no panic, and a login only with a proof of the
// password: the recovered ClientKey hashes to the stored key, and the
// channel binding repeats the client-first message's gs2 header. The
// seeds include, for each mechanism, a valid login (with the fixed client
// and server nonces) and its client-final message with proofs of the
// wrong length (64 bytes, the input that made SCRAM servers panic; 4 KiB;
// empty; one byte), not base64, and channel-binding mismatches.
func FuzzConversation(f *testing.F) {
	f.Add("n,,n=u,r=abc", "c=biws,r=abcdef,p=AAAA", true)
	f.Add("n,a=x,n=u,r=abc", "c=biws,r=abc,p=", false)
	f.Add("", "", true)
	// Empty and other malformed channel-binding flags.
	for _, c1 := range []string{",,n=u,r=abc", "y,,n=u,r=abc", "p=tls-unique,,n=u,r=abc", "n,n=u,r=abc", "n,,n=u,r=", ","} {
		f.Add(c1, "c=biws,r=abc"+fuzzServerNonce+",p=AAAA", false)
	}
	users, err := ParseFile([]byte(`"u@db" "`+FormatStored(SCRAMSHA256, mustDerive(f, SCRAMSHA256))+` `+FormatStored(SCRAMSHA1, mustDerive(f, SCRAMSHA1))+`"`), "f")
	if err != nil {
		f.Fatal(err)
	}
	a := New(users, nil, nil)
	a.nonce = func() string { return fuzzServerNonce }
	for _, m := range []Mechanism{SCRAMSHA1, SCRAMSHA256} {
		c1, c2 := validLogin(f, a, m)
		sha1 := m == SCRAMSHA1
		f.Add(c1, c2, sha1)
		i := strings.LastIndex(c2, ",p=")
		wop := c2[:i]
		for _, p := range []string{
			base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xA5}, 64)),
			base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0x5A}, 4096)),
			"",
			base64.StdEncoding.EncodeToString([]byte{1}),
			"%%%not-base64%%%",
			c2[i+3:] + "AAAA",
		} {
			f.Add(c1, wop+",p="+p, sha1)
		}
		// The right proof for another channel binding than c1's "n,,".
		for _, cb := range []string{"eSws", "cD10bHMtdW5pcXVlLCw=", "", "biws,c=eSws"} {
			f.Add(c1, strings.Replace(c2, "c=biws", "c="+cb, 1), sha1)
		}
		f.Add(c1, c2+",x=ext", sha1)
		f.Add(c1, strings.Replace(c2, fuzzServerNonce, fuzzServerNonce+"x", 1), sha1)
		f.Add("y,,"+c1[3:], strings.Replace(c2, "c=biws", "c=eSws", 1), sha1)
	}
	stored := map[Mechanism][]byte{
		SCRAMSHA1:   mustDerive(f, SCRAMSHA1).StoredKey,
		SCRAMSHA256: mustDerive(f, SCRAMSHA256).StoredKey,
	}
	f.Fuzz(func(t *testing.T, c1, c2 string, sha1 bool) {
		m := SCRAMSHA256
		if sha1 {
			m = SCRAMSHA1
		}
		conv, _, err := a.Start(context.Background(), m, "db", []byte(c1), true)
		if err != nil {
			return
		}
		_, _, err = conv.Step([]byte(c2))
		id := conv.Identity()
		if err != nil || id == nil {
			if id != nil {
				t.Fatalf("an identity after a failed step: %q %q", c1, c2)
			}
			return
		}
		// A login: it must have proven the password.
		h := hashOf(m)()
		h.Write(id.ClientKey)
		if !hmac.Equal(h.Sum(nil), stored[m]) {
			t.Fatalf("logged in without the password (the ClientKey does not hash to the stored key): %q %q", c1, c2)
		}
		header := strings.TrimSuffix(c1, clientFirstBare(c1))
		if cb, _, _ := strings.Cut(strings.TrimPrefix(c2, "c="), ","); cb != base64.StdEncoding.EncodeToString([]byte(header)) {
			t.Fatalf("logged in with channel binding %q for the gs2 header %q: %q %q", cb, header, c1, c2)
		}
		if id.User != "u" || id.DB != "db" || id.Mechanism != m {
			t.Fatalf("identity %+v: %q %q", id, c1, c2)
		}
	})
}

// validLogin runs a whole client conversation of m against a (whose server
// nonce is fixed) with a fixed client nonce, and returns its client-first
// and client-final messages: a login that verifies.
func validLogin(f *testing.F, a *Authenticator, m Mechanism) (c1, c2 string) {
	var cl *scram.Client
	var err error
	if m == SCRAMSHA1 {
		cl, err = scram.SHA1.NewClientUnprepped("u", mongoPasswordDigest("u", fuzzPassword), "")
	} else {
		cl, err = scram.SHA256.NewClient("u", fuzzPassword, "")
	}
	if err != nil {
		f.Fatal(err)
	}
	cc := cl.WithNonceGenerator(func() string { return "fuzzClientNonce" }).NewConversation()
	if c1, err = cc.Step(""); err != nil {
		f.Fatal(err)
	}
	conv, s1, err := a.Start(context.Background(), m, "db", []byte(c1), true)
	if err != nil {
		f.Fatal(err)
	}
	if c2, err = cc.Step(string(s1)); err != nil {
		f.Fatal(err)
	}
	if _, _, err := conv.Step([]byte(c2)); err != nil || conv.Identity() == nil {
		f.Fatalf("the valid %s login fails: %v", m, err)
	}
	return c1, c2
}

func mustDerive(f *testing.F, m Mechanism) scram.StoredCredentials {
	sc, err := Derive(m, "u", fuzzPassword, []byte("0123456789abcdef"), 4096)
	if err != nil {
		f.Fatal(err)
	}
	return sc
}
