package e2e

// Regression tests for the inputs that have made SCRAM servers panic (the
// xdg-go/scram server side did, in older versions, on an overlong client
// proof and on an empty channel-binding flag): through a real client
// connection with client authentication on, each gets a clean error reply
// on a connection that stays usable, and another logged-in client is
// served throughout.

import (
	"bytes"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/xdg-go/scram"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// saslStart sends a saslStart with payload and returns the reply.
func saslStart(r *rawClient, mech, payload string) bson.Raw {
	return r.cmd(bson.D{{Key: "saslStart", Value: 1}, {Key: "mechanism", Value: mech},
		{Key: "payload", Value: bson.Binary{Data: []byte(payload)}}, {Key: "$db", Value: "admin"}})
}

// stillServed checks that the raw client's connection is open and served
// (a ping, allowed before a login), and so is the logged-in other client.
func stillServed(t *testing.T, what string, r *rawClient, other func() error) {
	t.Helper()
	if rep := r.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}}); okOf(rep) != 1 {
		t.Fatalf("%s: the connection is not served after it: %v", what, rep)
	}
	if err := other(); err != nil {
		t.Fatalf("%s: the other client: %v", what, err)
	}
}

// A client-final message with a proof of the wrong length (64 bytes, more
// than either hash: the length that made a server panic), an empty one, a
// short one or one that is not base64 fails the login with
// AuthenticationFailed (18), on SCRAM-SHA-1 and SCRAM-SHA-256; a good
// login works afterwards.
func TestSCRAMBadProofFailsCleanly(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		_, addr, _ := authSetup(t, up.URI(), nil)
		other := authDriver(t, addr, "SCRAM-SHA-256", "bob", authUsers["bob"])
		ping := func() error { return other.Ping(ctxT(t, 10*time.Second), nil) }
		if err := ping(); err != nil {
			t.Fatal(err)
		}
		proofs := map[string]string{
			"overlong 64 bytes": base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xA5}, 64)),
			"overlong 4 KiB":    base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0x5A}, 4096)),
			"empty":             "",
			"one byte":          base64.StdEncoding.EncodeToString([]byte{1}),
			"not base64":        "%%%not-base64%%%",
		}
		for _, mech := range []string{"SCRAM-SHA-1", "SCRAM-SHA-256"} {
			hg := scram.SHA256
			if mech == "SCRAM-SHA-1" {
				hg = scram.SHA1
			}
			for name, proof := range proofs {
				what := mech + " " + name
				r := dialRaw(t, addr)
				r.hello()
				cl, err := hg.NewClientUnprepped("app", "irrelevant", "")
				if err != nil {
					t.Fatal(err)
				}
				c1, _ := cl.NewConversation().Step("")
				rep := saslStart(r, mech, c1)
				if okOf(rep) != 1 {
					t.Fatalf("%s: saslStart: %v", what, rep)
				}
				_, s1, _ := rep.Lookup("payload").BinaryOK()
				nonce := ""
				for _, attr := range strings.Split(string(s1), ",") {
					if v, ok := strings.CutPrefix(attr, "r="); ok {
						nonce = v
					}
				}
				if nonce == "" {
					t.Fatalf("%s: no nonce in the server-first message %q", what, s1)
				}
				final := "c=biws,r=" + nonce + ",p=" + proof
				rep = r.cmd(bson.D{{Key: "saslContinue", Value: 1}, {Key: "conversationId", Value: rep.Lookup("conversationId")},
					{Key: "payload", Value: bson.Binary{Data: []byte(final)}}, {Key: "$db", Value: "admin"}})
				if okOf(rep) != 0 || codeOf(rep) != 18 {
					t.Fatalf("%s: %v, want AuthenticationFailed (18)", what, rep)
				}
				stillServed(t, what, r, ping)
			}
		}
		r := dialRaw(t, addr)
		r.hello()
		if rep := rawLogin(t, r, "SCRAM-SHA-256", "app", authUsers["app"], false); okOf(rep) != 1 {
			t.Fatalf("a good login after the bad proofs: %v", rep)
		}
	})
}

// A client-first message with an empty channel-binding flag (the input
// that made a server panic), another malformed gs2 header, or none, gets
// an error reply; the connection and the other client are served on.
func TestSCRAMMalformedGS2HeaderFailsCleanly(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		_, addr, _ := authSetup(t, up.URI(), nil)
		other := authDriver(t, addr, "SCRAM-SHA-256", "bob", authUsers["bob"])
		ping := func() error { return other.Ping(ctxT(t, 10*time.Second), nil) }
		if err := ping(); err != nil {
			t.Fatal(err)
		}
		for _, mech := range []string{"SCRAM-SHA-1", "SCRAM-SHA-256"} {
			for _, c1 := range []string{
				",,n=app,r=abcdefgh",             // empty channel-binding flag
				",",                              // nothing but it
				"p=tls-unique,,n=app,r=abcdefgh", // binding asked, never offered
				"p=,,n=app,r=abcdefgh",           // binding with no name
				"n,n=app,r=abcdefgh",             // the authzid's comma missing
				"n=app,r=abcdefgh",               // no gs2 header at all
				"x,,n=app,r=abcdefgh",            // an unknown flag
				"n,a,n=app,r=abcdefgh",           // an authzid without "a="
				"n,,",                            // a header and nothing after it
				"n,,n=app",                       // no nonce
				"",                               // nothing
			} {
				what := mech + " " + c1
				r := dialRaw(t, addr)
				r.hello()
				rep := saslStart(r, mech, c1)
				if okOf(rep) != 0 || codeOf(rep) == 0 {
					t.Fatalf("%s: %v, want an error reply", what, rep)
				}
				stillServed(t, what, r, ping)
			}
		}
	})
}

// "y,," says the client could bind a channel but thinks the server cannot,
// which is so: the login goes on, and its client-final message must
// repeat that header (c=eSws). One that repeats another (c=biws, "n,,"),
// even with a proof computed over it, is a channel-binding mismatch:
// AuthenticationFailed (18). The client that does repeat it logs in.
func TestSCRAMChannelBindingMismatchFails(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		_, addr, _ := authSetup(t, up.URI(), nil)
		other := authDriver(t, addr, "SCRAM-SHA-256", "bob", authUsers["bob"])
		ping := func() error { return other.Ping(ctxT(t, 10*time.Second), nil) }
		for _, mech := range []string{"SCRAM-SHA-1", "SCRAM-SHA-256"} {
			for _, tc := range []struct {
				cbind string // the client-final's c=, base64 of a gs2 header
				ok    bool
			}{
				{base64.StdEncoding.EncodeToString([]byte("y,,")), true},
				{base64.StdEncoding.EncodeToString([]byte("n,,")), false},
				{base64.StdEncoding.EncodeToString([]byte("p=tls-unique,,")), false},
				{"", false},
			} {
				what := mech + " c=" + tc.cbind
				r := dialRaw(t, addr)
				r.hello()
				bare := "n=app,r=fixedclientnonce"
				rep := saslStart(r, mech, "y,,"+bare)
				if okOf(rep) != 1 {
					t.Fatalf("%s: saslStart with y,,: %v", what, rep)
				}
				_, s1, _ := rep.Lookup("payload").BinaryOK()
				final := scramFinal(t, mech, "app", authUsers["app"], bare, string(s1), tc.cbind)
				rep = r.cmd(bson.D{{Key: "saslContinue", Value: 1}, {Key: "conversationId", Value: rep.Lookup("conversationId")},
					{Key: "payload", Value: bson.Binary{Data: []byte(final)}}, {Key: "$db", Value: "admin"}})
				switch {
				case tc.ok && okOf(rep) != 1:
					t.Fatalf("%s: %v, want the login to go on", what, rep)
				case !tc.ok && (okOf(rep) != 0 || codeOf(rep) != 18):
					t.Fatalf("%s: %v, want AuthenticationFailed (18)", what, rep)
				}
				stillServed(t, what, r, ping)
			}
		}
	})
}

// scramFinal computes the client-final message of a SCRAM login (RFC 5802)
// with channel-binding attribute cbind, whatever it says: the client
// library always sends "n,,".
func scramFinal(t *testing.T, mech, user, password, clientFirstBare, serverFirst, cbind string) string {
	t.Helper()
	h := sha256.New
	if mech == "SCRAM-SHA-1" {
		h = sha1.New
		password = md5hex(user + ":mongo:" + password)
	}
	var nonce, salt string
	iter := 0
	for _, attr := range strings.Split(serverFirst, ",") {
		k, v, _ := strings.Cut(attr, "=")
		switch k {
		case "r":
			nonce = v
		case "s":
			salt = v
		case "i":
			iter, _ = strconv.Atoi(v)
		}
	}
	saltB, err := base64.StdEncoding.DecodeString(salt)
	if err != nil || iter <= 0 || nonce == "" {
		t.Fatalf("server-first %q", serverFirst)
	}
	salted, err := pbkdf2.Key(h, password, saltB, iter, h().Size())
	if err != nil {
		t.Fatal(err)
	}
	mac := func(key []byte, msg string) []byte {
		m := hmac.New(h, key)
		m.Write([]byte(msg))
		return m.Sum(nil)
	}
	clientKey := mac(salted, "Client Key")
	sum := h()
	sum.Write(clientKey)
	withoutProof := "c=" + cbind + ",r=" + nonce
	sig := mac(sum.Sum(nil), clientFirstBare+","+serverFirst+","+withoutProof)
	for i := range clientKey {
		clientKey[i] ^= sig[i]
	}
	return withoutProof + ",p=" + base64.StdEncoding.EncodeToString(clientKey)
}
