package upstream

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/xdg-go/scram"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/specdir"
)

// specExchange is one worked SCRAM exchange of the auth spec: the user,
// password and client nonce it assumes, the four SCRAM messages
// (client-first, server-first, client-final, server-final) and the
// base64 payloads of the same exchange over MongoDB's SASL commands.
type specExchange struct {
	user, password, nonce string
	msgs                  []string
	bindata               []string
}

var (
	reGiven   = regexp.MustCompile(`(?s)username\W+\w*\W*"([^"]*)".*?password\W+\w*\W*"([^"]*)".*?r value\W+\w*\W*"([^"]*)"`)
	reMsg     = regexp.MustCompile(`(?m)^(?:CMD|RESP) = "([^"]*)"$`)
	reBinData = regexp.MustCompile(`BinData\(0, ?"([^"]*)"\)`)
)

// readSpecExchange reads the worked exchange of mech from the auth spec's
// text at run time (the text may not be copied into the repository): the
// "Conversation" part of the mechanism's section.
func readSpecExchange(t *testing.T, mech string) specExchange {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(specdir.Dir(t, "texts"), "auth.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	start := strings.Index(text, "\n### "+mech+"\n")
	if start < 0 {
		t.Fatalf("auth.md has no section %s", mech)
	}
	sec := text[start+1:]
	if end := strings.Index(sec[4:], "\n### "); end >= 0 {
		sec = sec[:end+4]
	}
	conv := strings.Index(sec, "#### Conversation")
	if conv < 0 {
		t.Fatalf("auth.md: %s has no Conversation", mech)
	}
	sec = sec[conv:]
	var x specExchange
	m := reGiven.FindStringSubmatch(sec)
	if m == nil {
		t.Fatalf("auth.md: %s: no user, password and nonce found", mech)
	}
	x.user, x.password, x.nonce = m[1], m[2], m[3]
	for _, m := range reMsg.FindAllStringSubmatch(sec, -1) {
		x.msgs = append(x.msgs, m[1])
	}
	for _, m := range reBinData.FindAllStringSubmatch(sec, -1) {
		x.bindata = append(x.bindata, m[1])
	}
	if len(x.msgs) != 4 || len(x.bindata) != 4 {
		t.Fatalf("auth.md: %s: found %d messages and %d payloads, want 4 and 4", mech, len(x.msgs), len(x.bindata))
	}
	return x
}

func saslReply(id int32, payload string, done bool) bsoncore.Document {
	return bsoncore.NewDocumentBuilder().
		AppendInt32("conversationId", id).
		AppendBinary("payload", 0, []byte(payload)).
		AppendBoolean("done", done).
		AppendDouble("ok", 1).
		Build()
}

func payloadOf(t *testing.T, cmd bsoncore.Document) string {
	t.Helper()
	_, data, ok := cmd.Lookup("payload").BinaryOK()
	if !ok {
		t.Fatalf("no binary payload in %v", cmd)
	}
	return string(data)
}

// TestSCRAMSpecExchanges replays the worked SCRAM-SHA-1 and SCRAM-SHA-256
// exchanges of the auth spec with the nonce the text fixes: every client
// message must be the text's, byte for byte, in both the short and the
// long conversation, and a server signature that is not the text's must
// be refused.
func TestSCRAMSpecExchanges(t *testing.T) {
	for _, mech := range []string{MechanismSCRAMSHA1, MechanismSCRAMSHA256} {
		t.Run(mech, func(t *testing.T) {
			x := readSpecExchange(t, mech)
			newAuth := func() *scramAuth {
				a, err := newSCRAM(Credential{Mechanism: mech, Username: x.user, Password: x.password, Source: "admin"})
				if err != nil {
					t.Fatal(err)
				}
				a.nonce = func() string { return x.nonce }
				return a
			}
			// start: the client-first message, in saslStart.
			check := func(t *testing.T, cmd bsoncore.Document, i int, name string) {
				t.Helper()
				if got := firstKeyOf(cmd); got != name {
					t.Fatalf("command %d is %q, want %s", i, got, name)
				}
				p := payloadOf(t, cmd)
				if p != x.msgs[i] {
					t.Fatalf("message %d:\n got %q\nwant %q", i, p, x.msgs[i])
				}
				if b64 := base64.StdEncoding.EncodeToString([]byte(p)); b64 != x.bindata[i] {
					t.Fatalf("payload %d is %s, the spec's %s", i, b64, x.bindata[i])
				}
			}
			for _, long := range []bool{false, true} {
				conv, err := newAuth().newConv(mech)
				if err != nil {
					t.Fatal(err)
				}
				start := conv.start(false)
				check(t, start, 0, "saslStart")
				if m, _ := start.Lookup("mechanism").StringValueOK(); m != mech {
					t.Fatalf("mechanism %q", m)
				}
				if skip, _ := start.Lookup("options", "skipEmptyExchange").BooleanOK(); !skip {
					t.Fatal("saslStart lacks options.skipEmptyExchange")
				}
				if _, err := start.LookupErr("db"); err == nil {
					t.Fatal("a non-speculative saslStart has db")
				}
				cmd, done, err := conv.next(saslReply(1, x.msgs[1], false))
				if err != nil || done {
					t.Fatalf("after server-first: done %v, %v", done, err)
				}
				check(t, cmd, 2, "saslContinue")
				if id, _ := cmd.Lookup("conversationId").Int32OK(); id != 1 {
					t.Fatalf("conversationId %d", id)
				}
				cmd, done, err = conv.next(saslReply(1, x.msgs[3], !long))
				if err != nil {
					t.Fatal(err)
				}
				if !long {
					if !done {
						t.Fatal("short form not done after the server's final message")
					}
					continue
				}
				if done || payloadOf(t, cmd) != "" {
					t.Fatalf("long form: done %v, payload %q; want an empty saslContinue", done, payloadOf(t, cmd))
				}
				if _, done, err = conv.next(saslReply(1, "", true)); err != nil || !done {
					t.Fatalf("long form end: done %v, %v", done, err)
				}
			}

			// A server that does not know the password cannot sign.
			conv, _ := newAuth().newConv(mech)
			conv.start(false)
			if _, _, err := conv.next(saslReply(1, x.msgs[1], false)); err != nil {
				t.Fatal(err)
			}
			forged := "v=" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 20))
			_, _, err := conv.next(saslReply(1, forged, true))
			var ae *AuthError
			if !errors.As(err, &ae) || ae.Code != 0 || ae.Mechanism != mech {
				t.Fatalf("forged signature: %v, want an AuthError of our own", err)
			}
			if strings.Contains(err.Error(), x.password) {
				t.Fatalf("error shows the password: %v", err)
			}
		})
	}
}

func firstKeyOf(d bsoncore.Document) string {
	e, err := d.IndexErr(0)
	if err != nil {
		return ""
	}
	return e.Key()
}

// TestSCRAMConversationRefusesBadServers feeds replies a correct server
// never sends: each ends the conversation with an *AuthError of our own.
func TestSCRAMConversationRefusesBadServers(t *testing.T) {
	x := readSpecExchange(t, MechanismSCRAMSHA256)
	cases := []struct {
		name    string
		replies []bsoncore.Document
	}{
		{"done before the server's proof", []bsoncore.Document{saslReply(1, x.msgs[1], true)}},
		{"no conversationId", []bsoncore.Document{bsoncore.NewDocumentBuilder().AppendBinary("payload", 0, []byte(x.msgs[1])).Build()}},
		{"conversationId changes", []bsoncore.Document{saslReply(1, x.msgs[1], false), saslReply(2, x.msgs[3], true)}},
		{"nonce not extended", []bsoncore.Document{saslReply(1, strings.Replace(x.msgs[1], x.nonce, "other", 1), false)}},
		{"too few iterations", []bsoncore.Document{saslReply(1, regexp.MustCompile(`i=\d+`).ReplaceAllString(x.msgs[1], "i=4095"), false)}},
		{"too many iterations", []bsoncore.Document{saslReply(1, regexp.MustCompile(`i=\d+`).ReplaceAllString(x.msgs[1], "i=2000000000"), false)}},
		{"no iteration count", []bsoncore.Document{saslReply(1, regexp.MustCompile(`,i=\d+`).ReplaceAllString(x.msgs[1], ""), false)}},
		{"payload of the wrong type", []bsoncore.Document{bsoncore.NewDocumentBuilder().AppendInt32("conversationId", 1).AppendInt32("payload", 3).Build()}},
		{"long form never ends", []bsoncore.Document{saslReply(1, x.msgs[1], false), saslReply(1, x.msgs[3], false), saslReply(1, "", false)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, err := newSCRAM(Credential{Mechanism: MechanismSCRAMSHA256, Username: x.user, Password: x.password, Source: "admin"})
			if err != nil {
				t.Fatal(err)
			}
			a.nonce = func() string { return x.nonce }
			conv, _ := a.newConv(MechanismSCRAMSHA256)
			conv.start(false)
			for i, r := range c.replies {
				_, done, err := conv.next(r)
				if done {
					t.Fatalf("reply %d: conversation accepted", i)
				}
				if err != nil {
					var ae *AuthError
					if !errors.As(err, &ae) || ae.Code != 0 {
						t.Fatalf("reply %d: %v, want an AuthError of our own", i, err)
					}
					return
				}
			}
			t.Fatal("no error")
		})
	}
}

func TestNewAuthenticatorChecks(t *testing.T) {
	for _, c := range []struct {
		cred Credential
		want string // substring of the error; "" for success
	}{
		{Credential{Username: "u", Password: "s3cret!"}, ""},
		{Credential{Mechanism: MechanismSCRAMSHA1, Username: "u", Password: "s3cret!"}, ""},
		{Credential{Mechanism: MechanismSCRAMSHA256, Password: "s3cret!"}, "needs a username"},
		{Credential{Mechanism: MechanismSCRAMSHA256, Username: "u", Password: "a\u0007b"}, "SASLprep"},
		{Credential{Mechanism: MechanismX509}, ""},
		{Credential{Mechanism: MechanismX509, Username: "CN=x", Password: "s3cret!"}, "no password"},
		{Credential{Mechanism: MechanismX509, Source: "admin"}, "$external"},
		{Credential{Mechanism: "PLAIN", Username: "u", Password: "s3cret!"}, "not supported: PLAIN"},
	} {
		_, err := NewAuthenticator(c.cred)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%v: %v", c.cred, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%v: error %v, want one with %q", c.cred, err, c.want)
		case err != nil && c.cred.Password != "" && strings.Contains(err.Error(), c.cred.Password):
			t.Errorf("%v: error shows the password: %v", c.cred, err)
		}
	}
	if _, err := NewAuthenticator(Credential{Mechanism: "GSSAPI", Username: "u"}); !errors.Is(err, ErrUnsupportedMechanism) {
		t.Errorf("GSSAPI: %v, want ErrUnsupportedMechanism", err)
	}
}

func TestKeyFactorsCacheIsBounded(t *testing.T) {
	a, err := newSCRAM(Credential{Mechanism: MechanismSCRAMSHA256, Username: "u", Password: "p", Source: "admin"})
	if err != nil {
		t.Fatal(err)
	}
	first, _ := a.client(MechanismSCRAMSHA256)
	for i := range maxCachedKeyFactors {
		a.noteKeyFactors(MechanismSCRAMSHA256, keyFactorsN(i))
	}
	a.noteKeyFactors(MechanismSCRAMSHA256, keyFactorsN(0)) // seen: no change
	if c, _ := a.client(MechanismSCRAMSHA256); c != first {
		t.Fatal("the cache started over within its bound")
	}
	a.noteKeyFactors(MechanismSCRAMSHA256, keyFactorsN(maxCachedKeyFactors))
	if c, _ := a.client(MechanismSCRAMSHA256); c == first {
		t.Fatal("the cache grew past its bound")
	}
	if n := len(a.clients[MechanismSCRAMSHA256].seen); n != 1 {
		t.Fatalf("%d key factors after starting over, want 1", n)
	}
}

func keyFactorsN(i int) scram.KeyFactors {
	return scram.KeyFactors{Salt: "salt" + strconv.Itoa(i), Iters: 4096}
}

// FuzzSCRAMConversation feeds two arbitrary server replies to a SCRAM
// conversation of each client, the password one and the pass-through one
// (with the seeds' salt and iteration count, so that inputs get past the
// key factors check): no input may panic, and none may end it as
// authenticated (only a server that knows the keys can).
func FuzzSCRAMConversation(f *testing.F) {
	f.Add([]byte(saslReply(1, "r=fixednonceSERVER,s=c2FsdHNhbHQ=,i=4096", false)), []byte(saslReply(1, "v=AAAA", true)))
	f.Add([]byte(saslReply(1, "r=fixednonceSERVER,s=c2FsdHNhbHQ=,i=4096", false)), []byte(saslReply(1, "", true)))
	f.Add([]byte(saslReply(1, "r=fixednonceSERVER,s=c2FsdHNhbHQ=,i=4096,x=ext", false)), []byte(saslReply(1, "e=other-error", true)))
	f.Add([]byte(saslReply(1, "m=ext,r=fixednonceSERVER,s=c2FsdHNhbHQ=,i=4096", false)), []byte(saslReply(1, "v=", false)))
	f.Add([]byte(saslReply(7, "", true)), []byte{})
	f.Add([]byte(bsoncore.NewDocumentBuilder().AppendInt64("conversationId", 1).AppendString("payload", "cj1maXhlZA==").Build()), []byte{5, 0, 0, 0, 0})
	a, err := newSCRAM(Credential{Mechanism: MechanismSCRAMSHA256, Username: "u", Password: "p", Source: "admin"})
	if err != nil {
		f.Fatal(err)
	}
	a.nonce = func() string { return "fixednonce" }
	ck, stored := deriveKeys(f, MechanismSCRAMSHA256, "u", "p", scram.KeyFactors{Salt: "saltsalt", Iters: 4096})
	pt := newPassThrough(f, PassThrough{Mechanism: MechanismSCRAMSHA256, Username: "u", ClientKey: ck, Stored: stored}, "fixednonce")
	f.Fuzz(func(t *testing.T, r1, r2 []byte) {
		for _, src := range []scramSource{a, pt} {
			conv, err := src.newConv(MechanismSCRAMSHA256)
			if err != nil {
				t.Fatal(err)
			}
			conv.start(false)
			for _, r := range [][]byte{r1, r2} {
				_, done, err := conv.next(bsoncore.Document(r))
				if done {
					t.Fatalf("%T: a server that does not know the keys was accepted", src)
				}
				if err != nil {
					var ae *AuthError
					if !errors.As(err, &ae) {
						t.Fatalf("%T: %v is not an AuthError", src, err)
					}
					break
				}
			}
		}
	})
}

// TestSASLprepPasswordLogsIn: SCRAM-SHA-256 prepares the password with
// SASLprep, so "I\u00ADX" (a soft hyphen, which SASLprep maps to nothing)
// logs in as a user whose password is "IX", negotiated or not; SCRAM-SHA-1
// does not (MongoDB digests the password as it is), so there the same
// password is wrong and "IX" is right.
func TestSASLprepPasswordLogsIn(t *testing.T) {
	s := fakemongo.Start(t, fakemongo.Options{Users: []fakemongo.User{{Name: "prep", Password: "IX"}}})
	for _, c := range []struct {
		mech, password string
		ok             bool
	}{
		{MechanismSCRAMSHA256, "I\u00ADX", true},
		{"", "I\u00ADX", true},
		{MechanismSCRAMSHA256, "IX", true},
		{MechanismSCRAMSHA1, "IX", true},
		{MechanismSCRAMSHA1, "I\u00ADX", false},
	} {
		conn, err := dialAuth(t, s.Addr(), Credential{Mechanism: c.mech, Username: "prep", Password: c.password}, nil)
		if !c.ok {
			var ae *AuthError
			if !errors.As(err, &ae) || !ae.AuthenticationFailed() {
				t.Errorf("%s %q: %v, want code 18", c.mech, c.password, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s %q: %v", c.mech, c.password, err)
		}
		if u := loggedInAs(t, conn); u != "admin.prep" {
			t.Errorf("%s %q: logged in as %q", c.mech, c.password, u)
		}
	}
}

// TestSCRAMRefusesIterationsPastTheBound: a server asking for more than
// MaxIterations is refused at its first message, before the client
// derives anything (10M iterations of PBKDF2 take seconds; the refusal
// microseconds), and its error says why.
func TestSCRAMRefusesIterationsPastTheBound(t *testing.T) {
	x := readSpecExchange(t, MechanismSCRAMSHA256)
	for _, n := range []int{DefaultMaxIterations + 1, 200_000, 10_000_000} {
		a, err := newSCRAM(Credential{Mechanism: MechanismSCRAMSHA256, Username: x.user, Password: x.password, Source: "admin"})
		if err != nil {
			t.Fatal(err)
		}
		a.nonce = func() string { return x.nonce }
		conv, _ := a.newConv(MechanismSCRAMSHA256)
		conv.start(false)
		start := time.Now()
		_, done, err := conv.next(saslReply(1, regexp.MustCompile(`i=\d+`).ReplaceAllString(x.msgs[1], fmt.Sprintf("i=%d", n)), false))
		var ae *AuthError
		if done || !errors.As(err, &ae) || !strings.Contains(err.Error(), "iterations") {
			t.Fatalf("i=%d: done=%v %v, want a refusal naming the iterations", n, done, err)
		}
		if d := time.Since(start); d > 50*time.Millisecond {
			t.Fatalf("i=%d: refused after %v: keys were derived first", n, d)
		}
	}
}
