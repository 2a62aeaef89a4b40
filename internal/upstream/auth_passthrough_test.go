package upstream

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/md5"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"log/slog"
	"regexp"
	"strings"
	"testing"

	"github.com/xdg-go/scram"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// deriveKeys computes, from a password, what a client's login to
// mongobouncer leaves it with: the stored credentials (xdg-go's
// derivation) and the ClientKey, HMAC(SaltedPassword, "Client Key"),
// computed here independently; the two must agree.
func deriveKeys(t testing.TB, mech, user, password string, kf scram.KeyFactors) ([]byte, scram.StoredCredentials) {
	t.Helper()
	a, err := newSCRAM(Credential{Mechanism: mech, Username: user, Password: password, Source: "admin"})
	if err != nil {
		t.Fatal(err)
	}
	pw := a.clients[mech].password // digested (SHA-1) or prepared (SHA-256)
	h, hf := scram.SHA1, func() hash.Hash { return sha1.New() }
	if mech == MechanismSCRAMSHA256 {
		h, hf = scram.SHA256, sha256.New
	}
	c, _ := h.NewClientUnprepped(user, pw, "")
	stored, err := c.GetStoredCredentialsWithError(kf)
	if err != nil {
		t.Fatal(err)
	}
	salted, err := pbkdf2.Key(hf, pw, []byte(kf.Salt), kf.Iters, hf().Size())
	if err != nil {
		t.Fatal(err)
	}
	m := hmac.New(hf, salted)
	m.Write([]byte("Client Key"))
	ck := m.Sum(nil)
	sum := hf()
	sum.Write(ck)
	if !bytes.Equal(sum.Sum(nil), stored.StoredKey) {
		t.Fatal("the ClientKey derived here does not hash to xdg-go's StoredKey")
	}
	return ck, stored
}

func newPassThrough(t testing.TB, p PassThrough, nonce string) *passThroughAuth {
	t.Helper()
	a, err := NewPassThroughAuthenticator(p)
	if err != nil {
		t.Fatal(err)
	}
	pa := a.(*passThroughAuth)
	if nonce != "" {
		pa.nonce = func() string { return nonce }
	}
	return pa
}

// TestPassThroughSpecExchanges replays the auth spec's worked SCRAM-SHA-1
// and SCRAM-SHA-256 exchanges with keys derived from the text's password:
// the pass-through client must send what the password client sends, byte
// for byte (and so the text's messages), accept the text's server
// signature, in the short and the long form, and refuse a forged one.
func TestPassThroughSpecExchanges(t *testing.T) {
	for _, mech := range []string{MechanismSCRAMSHA1, MechanismSCRAMSHA256} {
		t.Run(mech, func(t *testing.T) {
			x := readSpecExchange(t, mech)
			kf, ok := keyFactors([]byte(x.msgs[1]))
			if !ok {
				t.Fatalf("server-first %q", x.msgs[1])
			}
			ck, stored := deriveKeys(t, mech, x.user, x.password, kf)
			p := PassThrough{Mechanism: mech, Username: x.user, Source: "admin", ClientKey: ck, Stored: stored}
			for _, long := range []bool{false, true} {
				pw, err := newSCRAM(Credential{Mechanism: mech, Username: x.user, Password: x.password, Source: "admin"})
				if err != nil {
					t.Fatal(err)
				}
				pw.nonce = func() string { return x.nonce }
				byPassword, _ := pw.newConv(mech)
				byKeys, _ := newPassThrough(t, p, x.nonce).newConv(mech)

				same := func(i int, a, b bsoncore.Document) {
					t.Helper()
					if !bytes.Equal(a, b) {
						t.Fatalf("command %d differs:\n keys     %v\n password %v", i, a, b)
					}
					if got := payloadOf(t, a); got != x.msgs[i] {
						t.Fatalf("message %d:\n got %q\nwant %q", i, got, x.msgs[i])
					}
				}
				same(0, byKeys.start(false), byPassword.start(false))
				replies := []bsoncore.Document{saslReply(1, x.msgs[1], false), saslReply(1, x.msgs[3], !long)}
				k, kdone, err := byKeys.next(replies[0])
				if err != nil || kdone {
					t.Fatalf("after server-first: done %v, %v", kdone, err)
				}
				pcmd, _, err := byPassword.next(replies[0])
				if err != nil {
					t.Fatal(err)
				}
				same(2, k, pcmd)
				k, kdone, err = byKeys.next(replies[1])
				if err != nil {
					t.Fatalf("server-final: %v", err)
				}
				if !long {
					if !kdone {
						t.Fatal("short form not done after the server's final message")
					}
					continue
				}
				if kdone || payloadOf(t, k) != "" {
					t.Fatalf("long form: done %v; want an empty saslContinue", kdone)
				}
				if _, kdone, err = byKeys.next(saslReply(1, "", true)); err != nil || !kdone {
					t.Fatalf("long form end: done %v, %v", kdone, err)
				}
			}

			conv, _ := newPassThrough(t, p, x.nonce).newConv(mech)
			conv.start(false)
			if _, _, err := conv.next(saslReply(1, x.msgs[1], false)); err != nil {
				t.Fatal(err)
			}
			forged := "v=" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, len(ck)))
			_, done, err := conv.next(saslReply(1, forged, true))
			var ae *AuthError
			if done || !errors.As(err, &ae) || ae.Code != 0 || ae.Mechanism != mech {
				t.Fatalf("forged signature: done %v, %v; want an AuthError of our own", done, err)
			}
		})
	}
}

// TestPassThroughRefusesBadServers feeds the pass-through conversation
// replies a server with the user's keys never sends, and server-first
// messages with another salt or iteration count (ErrPassThroughMismatch,
// with a message that says what to do).
func TestPassThroughRefusesBadServers(t *testing.T) {
	x := readSpecExchange(t, MechanismSCRAMSHA256)
	kf, _ := keyFactors([]byte(x.msgs[1]))
	ck, stored := deriveKeys(t, MechanismSCRAMSHA256, x.user, x.password, kf)
	p := PassThrough{Mechanism: MechanismSCRAMSHA256, Username: x.user, ClientKey: ck, Stored: stored}
	reI := regexp.MustCompile(`i=\d+`)
	reS := regexp.MustCompile(`s=[^,]+`)
	otherSalt := "s=" + base64.StdEncoding.EncodeToString([]byte("another salt"))
	cases := []struct {
		name     string
		replies  []bsoncore.Document
		mismatch bool
	}{
		{"done before the server's proof", []bsoncore.Document{saslReply(1, x.msgs[1], true)}, false},
		{"no conversationId", []bsoncore.Document{bsoncore.NewDocumentBuilder().AppendBinary("payload", 0, []byte(x.msgs[1])).Build()}, false},
		{"conversationId changes", []bsoncore.Document{saslReply(1, x.msgs[1], false), saslReply(2, x.msgs[3], true)}, false},
		{"nonce not extended", []bsoncore.Document{saslReply(1, strings.Replace(x.msgs[1], x.nonce, "other", 1), false)}, false},
		{"nonce only ours", []bsoncore.Document{saslReply(1, regexp.MustCompile(`^r=[^,]+`).ReplaceAllString(x.msgs[1], "r="+x.nonce), false)}, false},
		{"extension first", []bsoncore.Document{saslReply(1, "m=x,"+x.msgs[1], false)}, false},
		{"fields out of order", []bsoncore.Document{saslReply(1, strings.Join(reorder(strings.Split(x.msgs[1], ",")), ","), false)}, false},
		{"huge server-first", []bsoncore.Document{saslReply(1, x.msgs[1]+",x="+strings.Repeat("a", maxSCRAMMessage), false)}, false},
		{"server error", []bsoncore.Document{saslReply(1, x.msgs[1], false), saslReply(1, "e=other-error", true)}, false},
		{"no signature", []bsoncore.Document{saslReply(1, x.msgs[1], false), saslReply(1, "x=1", true)}, false},
		{"long form never ends", []bsoncore.Document{saslReply(1, x.msgs[1], false), saslReply(1, x.msgs[3], false), saslReply(1, "", false)}, false},
		{"fewer iterations", []bsoncore.Document{saslReply(1, reI.ReplaceAllString(x.msgs[1], "i=4095"), false)}, true},
		{"more iterations", []bsoncore.Document{saslReply(1, reI.ReplaceAllString(x.msgs[1], "i=2000000000"), false)}, true},
		{"another salt", []bsoncore.Document{saslReply(1, reS.ReplaceAllString(x.msgs[1], otherSalt), false)}, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			conv, _ := newPassThrough(t, p, x.nonce).newConv(MechanismSCRAMSHA256)
			conv.start(false)
			for i, r := range c.replies {
				_, done, err := conv.next(r)
				if done {
					t.Fatalf("reply %d: conversation accepted", i)
				}
				if err == nil {
					continue
				}
				var ae *AuthError
				if !errors.As(err, &ae) || ae.Code != 0 {
					t.Fatalf("reply %d: %v, want an AuthError of our own", i, err)
				}
				if got := errors.Is(err, ErrPassThroughMismatch); got != c.mismatch {
					t.Fatalf("reply %d: %v: errors.Is(ErrPassThroughMismatch) = %v", i, err, got)
				}
				if c.mismatch && (!strings.Contains(err.Error(), "usersInfo {showCredentials: true}") || !strings.Contains(err.Error(), "auth_file")) {
					t.Fatalf("the mismatch does not say what to do: %v", err)
				}
				checkNoSecrets(t, err.Error(), ck, stored)
				return
			}
			t.Fatal("no error")
		})
	}
}

// reorder swaps the first two fields.
func reorder(f []string) []string {
	f[0], f[1] = f[1], f[0]
	return f
}

// checkNoSecrets fails when s shows a key in any usual encoding.
func checkNoSecrets(t *testing.T, s string, keys ...any) {
	t.Helper()
	var all [][]byte
	for _, k := range keys {
		switch k := k.(type) {
		case []byte:
			all = append(all, k)
		case scram.StoredCredentials:
			all = append(all, k.StoredKey, k.ServerKey)
		}
	}
	for _, k := range all {
		for _, enc := range []string{string(k), base64.StdEncoding.EncodeToString(k), hex.EncodeToString(k),
			fmt.Sprint(k), fmt.Sprintf("%#v", k), fmt.Sprintf("%q", k)} {
			if strings.Contains(s, enc) {
				t.Fatalf("a key shows in %q", s)
			}
		}
	}
}

func TestNewPassThroughAuthenticatorChecks(t *testing.T) {
	kf := scram.KeyFactors{Salt: "0123456789abcdef", Iters: 4096}
	ck1, st1 := deriveKeys(t, MechanismSCRAMSHA1, "u", "pw", kf)
	ck256, st256 := deriveKeys(t, MechanismSCRAMSHA256, "u", "pw", kf)
	good := PassThrough{Mechanism: MechanismSCRAMSHA256, Username: "u", ClientKey: ck256, Stored: st256}
	with := func(f func(*PassThrough)) PassThrough {
		p := good
		f(&p)
		return p
	}
	for _, c := range []struct {
		name string
		p    PassThrough
		want string // substring of the error; "" for success
	}{
		{"SCRAM-SHA-256", good, ""},
		{"SCRAM-SHA-1", PassThrough{Mechanism: MechanismSCRAMSHA1, Username: "u", Source: "app", ClientKey: ck1, Stored: st1}, ""},
		{"no mechanism", with(func(p *PassThrough) { p.Mechanism = "" }), "needs the mechanism"},
		{"X.509", with(func(p *PassThrough) { p.Mechanism = MechanismX509 }), "not supported"},
		{"no user", with(func(p *PassThrough) { p.Username = "" }), "needs a username"},
		{"SHA-1 keys for SHA-256", with(func(p *PassThrough) { p.ClientKey, p.Stored = ck1, st1 }), "ClientKey has 20 bytes, SCRAM-SHA-256 needs 32"},
		{"short StoredKey", with(func(p *PassThrough) { p.Stored.StoredKey = p.Stored.StoredKey[:31] }), "StoredKey has 31 bytes"},
		{"no ServerKey", with(func(p *PassThrough) { p.Stored.ServerKey = nil }), "ServerKey has 0 bytes"},
		{"no iterations", with(func(p *PassThrough) { p.Stored.Iters = 0 }), "iteration count 0"},
		{"no salt", with(func(p *PassThrough) { p.Stored.Salt = "" }), "empty salt"},
		{"keys of two logins", with(func(p *PassThrough) { p.ClientKey = bytes.Repeat([]byte{7}, 32) }), "does not hash to the StoredKey"},
	} {
		a, err := NewPassThroughAuthenticator(c.p)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: error %v, want one with %q", c.name, err, c.want)
		case err != nil:
			checkNoSecrets(t, err.Error(), ck1, st1, ck256, st256)
		case c.p.Source == "" && a.(*passThroughAuth).cred.Source != "admin":
			t.Errorf("%s: source %q, want admin by default", c.name, a.(*passThroughAuth).cred.Source)
		}
	}
	if _, err := NewPassThroughAuthenticator(with(func(p *PassThrough) { p.Mechanism = "PLAIN" })); !errors.Is(err, ErrUnsupportedMechanism) {
		t.Errorf("PLAIN: %v, want ErrUnsupportedMechanism", err)
	}
	// The authenticator keeps copies: a caller reusing its buffers cannot
	// change the keys under it.
	p := with(func(p *PassThrough) { p.ClientKey = bytes.Clone(ck256) })
	a := newPassThrough(t, p, "")
	clear(p.ClientKey)
	if !bytes.Equal(a.p.ClientKey, ck256) {
		t.Error("the authenticator shares the caller's ClientKey")
	}
}

// TestPassThroughPrintsNoSecrets prints a PassThrough (and its
// authenticator) every way fmt and slog can: the user shows, no key does.
func TestPassThroughPrintsNoSecrets(t *testing.T) {
	ck, st := deriveKeys(t, MechanismSCRAMSHA256, "alice", "pw", scram.KeyFactors{Salt: "0123456789abcdef", Iters: 4096})
	p := PassThrough{Mechanism: MechanismSCRAMSHA256, Username: "alice", Source: "app", ClientKey: ck, Stored: st}
	a, err := NewPassThroughAuthenticator(p)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	for _, v := range []any{p, &p, a} {
		fmt.Fprintf(&out, "%v|%+v|%#v|%s\n", v, v, v, v)
	}
	fmt.Fprintf(&out, "%v %+v\n", []PassThrough{p}, map[string]PassThrough{"k": p})
	for _, h := range []slog.Handler{slog.NewTextHandler(&out, nil), slog.NewJSONHandler(&out, nil)} {
		slog.New(h).Info("login", "p", p, "ptr", &p, slog.Any("any", p), slog.Group("g", "p", p))
	}
	s := out.String()
	if !strings.Contains(s, `"alice"`) || !strings.Contains(s, MechanismSCRAMSHA256) {
		t.Fatalf("the user does not show:\n%s", s)
	}
	checkNoSecrets(t, s, ck, st)
}

// TestCredentialsPrintNoSecrets is TestPassThroughPrintsNoSecrets for a
// password: no way of printing a Credential, the authenticators built
// from one (with their per-mechanism clients made), the Options holding
// them or a Dialer shows the password, its SHA-1 digest or the TLS key.
func TestCredentialsPrintNoSecrets(t *testing.T) {
	const pw = "hunter2-pässword"
	cred := Credential{Username: "alice", Password: pw, Source: "app"}
	a, err := NewAuthenticator(cred)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{MechanismSCRAMSHA1, MechanismSCRAMSHA256} {
		if _, err := a.(*scramAuth).client(m); err != nil { // each holds the prepared password
			t.Fatal(err)
		}
	}
	x, err := NewAuthenticator(Credential{Mechanism: MechanismX509, Username: "CN=alice"})
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	o := Options{AppName: "app", Authenticator: a,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{{1}}, PrivateKey: key}}}}
	d := NewDialer(o)
	sc := a.(*scramAuth).clients[MechanismSCRAMSHA1]
	var out strings.Builder
	for _, v := range []any{cred, &cred, a, x, sc, o, &o, d, []Credential{cred}, map[string]Options{"k": o}} {
		fmt.Fprintf(&out, "%v|%+v|%#v|%s\n", v, v, v, v)
	}
	for _, h := range []slog.Handler{slog.NewTextHandler(&out, nil), slog.NewJSONHandler(&out, nil)} {
		slog.New(h).Info("dial", "cred", cred, "ptr", &cred, "a", a, "x", x, "opts", o, "optsPtr", &o, "d", d,
			slog.Any("any", cred), slog.Group("g", "cred", cred, "opts", o))
	}
	s := out.String()
	if !strings.Contains(s, `"alice"`) || !strings.Contains(s, "CN=alice") {
		t.Fatalf("the user does not show:\n%s", s)
	}
	digest := md5.Sum([]byte("alice:mongo:" + pw))
	for _, secret := range []string{"hunter2", hex.EncodeToString(digest[:]), key.D.String(), key.D.Text(16)} {
		if strings.Contains(s, secret) {
			t.Fatalf("%q shows in:\n%s", secret, s)
		}
	}
}

// fakeStoredCredentials reads a user's stored SCRAM credentials from the
// server with usersInfo {showCredentials: true}, as auth_user does,
// logged in as that user with its password.
func fakeStoredCredentials(t *testing.T, addr, db, user, password, mech string) scram.StoredCredentials {
	t.Helper()
	c, err := dialAuth(t, addr, Credential{Username: user, Password: password, Source: db}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.RoundTrip(testCtx(t), db, doc(func(b *bsoncore.DocumentBuilder) {
		b.AppendDocument("usersInfo", bsoncore.NewDocumentBuilder().AppendString("user", user).AppendString("db", db).Build())
		b.AppendBoolean("showCredentials", true)
	}))
	if err != nil {
		t.Fatal(err)
	}
	cr, ok := r.Lookup("users", "0", "credentials", mech).DocumentOK()
	if !ok {
		t.Fatalf("usersInfo has no %s credentials: %v", mech, r)
	}
	b64 := func(k string) []byte {
		s, _ := cr.Lookup(k).StringValueOK()
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil || len(b) == 0 {
			t.Fatalf("usersInfo %s: %q", k, s)
		}
		return b
	}
	iters, ok := cr.Lookup("iterationCount").AsInt64OK()
	if !ok {
		t.Fatalf("usersInfo iterationCount: %v", cr)
	}
	return scram.StoredCredentials{KeyFactors: scram.KeyFactors{Salt: string(b64("salt")), Iters: int(iters)},
		StoredKey: b64("storedKey"), ServerKey: b64("serverKey")}
}

// passThroughFor is the PassThrough a client's login with password would
// give mongobouncer whose stored credentials are st; the derived keys
// must be the server's.
func passThroughFor(t *testing.T, mech, db, user, password string, st scram.StoredCredentials) PassThrough {
	t.Helper()
	ck, mine := deriveKeys(t, mech, user, password, st.KeyFactors)
	if !bytes.Equal(mine.StoredKey, st.StoredKey) || !bytes.Equal(mine.ServerKey, st.ServerKey) {
		t.Fatal("the keys derived from the password are not the server's")
	}
	return PassThrough{Mechanism: mech, Username: user, Source: db, ClientKey: ck, Stored: st}
}

func dialPassThrough(t *testing.T, addr string, p PassThrough) (*Conn, error) {
	t.Helper()
	a, err := NewPassThroughAuthenticator(p)
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewDialer(Options{Authenticator: a, Logger: quiet}).Dial(testCtx(t), addr, 1)
	if err == nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}

// TestPassThroughAgainstFake logs in to fakemongo's SCRAM server with the
// keys of its stored credentials (read with usersInfo), for both
// mechanisms, in the short and the long form, with and without
// speculativeAuthenticate, and counts the round trips.
func TestPassThroughAgainstFake(t *testing.T) {
	for _, mech := range []string{MechanismSCRAMSHA1, MechanismSCRAMSHA256} {
		for _, long := range []bool{false, true} {
			for _, speculative := range []bool{true, false} {
				name := fmt.Sprintf("%s/long=%v/speculative=%v", mech, long, speculative)
				t.Run(name, func(t *testing.T) {
					s := fakemongo.Start(t, fakemongo.Options{
						Users:             []fakemongo.User{{Name: testUser, DB: "app", Password: testPassword}},
						AuthLongForm:      long,
						NoSpeculativeAuth: !speculative,
						InMemory:          true,
					})
					p := passThroughFor(t, mech, "app", testUser, testPassword,
						fakeStoredCredentials(t, s.Addr(), "app", testUser, testPassword, mech))
					starts, continues := s.Requests("saslStart"), s.Requests("saslContinue")
					var helloMech string
					s.Handle("hello", func(req *fakemongo.Request) fakemongo.Reply {
						helloMech, _ = req.Lookup("speculativeAuthenticate", "mechanism").StringValueOK()
						if _, err := req.Body.LookupErr("saslSupportedMechs"); err == nil {
							t.Error("pass-through asks for saslSupportedMechs")
						}
						return s.Builtin(req)
					})
					c, err := dialPassThrough(t, s.Addr(), p)
					if err != nil {
						t.Fatal(err)
					}
					if helloMech != mech {
						t.Errorf("hello speculates with %q, want %s", helloMech, mech)
					}
					checkConversation(t, c, s, speculative, long, starts, continues)
				})
			}
		}
	}
}

// TestPassThroughFailuresAgainstFake: keys of another password with the
// server's salt are refused by the server (code 18); keys with another
// salt or iteration count end with ErrPassThroughMismatch before any
// proof is sent. Both are *AuthErrors in a *ConnectError at stage auth,
// and neither shows a key.
func TestPassThroughFailuresAgainstFake(t *testing.T) {
	s := fakemongo.Start(t, fakemongo.Options{Users: []fakemongo.User{{Name: testUser, DB: "app", Password: testPassword}}, InMemory: true})
	for _, mech := range []string{MechanismSCRAMSHA1, MechanismSCRAMSHA256} {
		st := fakeStoredCredentials(t, s.Addr(), "app", testUser, testPassword, mech)
		for _, c := range []struct {
			name     string
			kf       scram.KeyFactors
			mismatch bool
		}{
			{"wrong ClientKey", st.KeyFactors, false},
			{"other salt", scram.KeyFactors{Salt: st.Salt + "x", Iters: st.Iters}, true},
			{"other iteration count", scram.KeyFactors{Salt: st.Salt, Iters: st.Iters + 1}, true},
		} {
			ck, wrong := deriveKeys(t, mech, testUser, "not-the-password", c.kf)
			p := PassThrough{Mechanism: mech, Username: testUser, Source: "app", ClientKey: ck, Stored: wrong}
			continues := s.Requests("saslContinue")
			_, err := dialPassThrough(t, s.Addr(), p)
			var ce *ConnectError
			var ae *AuthError
			if !errors.As(err, &ce) || ce.Stage != "auth" || !errors.As(err, &ae) {
				t.Fatalf("%s %s: %v, want a ConnectError at auth wrapping an AuthError", mech, c.name, err)
			}
			if ae.Username != testUser || ae.Source != "app" || ae.Mechanism != mech {
				t.Errorf("%s %s: AuthError %+v", mech, c.name, ae)
			}
			if got := errors.Is(err, ErrPassThroughMismatch); got != c.mismatch {
				t.Errorf("%s %s: %v: errors.Is(ErrPassThroughMismatch) = %v", mech, c.name, err, got)
			}
			if c.mismatch {
				if ae.Code != 0 || !strings.Contains(err.Error(), "usersInfo") {
					t.Errorf("%s %s: %v", mech, c.name, err)
				}
				if n := s.Requests("saslContinue") - continues; n != 0 {
					t.Errorf("%s %s: %d saslContinue sent after a mismatch", mech, c.name, n)
				}
			} else if !ae.AuthenticationFailed() {
				t.Errorf("%s %s: %v, want code 18", mech, c.name, err)
			}
			checkNoSecrets(t, err.Error(), ck, wrong, p.ClientKey)
		}
	}
}
