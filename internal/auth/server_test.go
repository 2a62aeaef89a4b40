package auth

import (
	"context"
	"crypto/hmac"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/xdg-go/scram"

	"github.com/mongobouncer/mongobouncer/internal/testutil/specdir"
)

// specExchange is one worked SCRAM conversation of the auth specification:
// two client messages, two server messages.
type specExchange struct {
	mech       Mechanism
	cmd, resp  [2]string
	user, pass string
}

// specExchanges reads the worked conversations from the auth
// specification at run time (never copied into the repository).
func specExchanges(t *testing.T) []specExchange {
	dir := specdir.Dir(t, "texts")
	data, err := os.ReadFile(filepath.Join(dir, "auth.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	line := regexp.MustCompile(`(?m)^(CMD|RESP) = "([^"]*)"$`)
	var out []specExchange
	for _, m := range []Mechanism{SCRAMSHA1, SCRAMSHA256} {
		start := strings.Index(text, "\n### "+string(m)+"\n")
		if start < 0 {
			t.Fatalf("no %s section in auth.md", m)
		}
		sec := text[start+1:]
		if end := strings.Index(sec[4:], "\n### "); end >= 0 {
			sec = sec[:end+4]
		}
		found := line.FindAllStringSubmatch(sec, 4)
		if len(found) != 4 {
			t.Fatalf("%s: %d CMD/RESP lines, want 4", m, len(found))
		}
		ex := specExchange{mech: m, user: "user", pass: "pencil"}
		ex.cmd = [2]string{found[0][2], found[2][2]}
		ex.resp = [2]string{found[1][2], found[3][2]}
		out = append(out, ex)
	}
	return out
}

// attr returns the value of SCRAM attribute k in msg.
func attr(msg, k string) string {
	for _, f := range strings.Split(msg, ",") {
		if strings.HasPrefix(f, k+"=") {
			return f[len(k)+1:]
		}
	}
	return ""
}

// TestSpecConversations replays the specification's worked exchanges
// against the server side with its nonce fixed: the server must answer
// the same first message and the same proof, byte for byte, from
// credentials derived as an auth_file's plain password is.
func TestSpecConversations(t *testing.T) {
	for _, ex := range specExchanges(t) {
		t.Run(string(ex.mech), func(t *testing.T) {
			cnonce := attr(ex.cmd[0], "r")
			full := attr(ex.resp[0], "r")
			salt, err := b64(attr(ex.resp[0], "s"))
			if err != nil {
				t.Fatal(err)
			}
			var iters int
			for _, ch := range attr(ex.resp[0], "i") {
				iters = iters*10 + int(ch-'0')
			}
			sc, err := Derive(ex.mech, ex.user, ex.pass, salt, iters)
			if err != nil {
				t.Fatal(err)
			}
			users, err := ParseFile([]byte(`"user@admin" "`+FormatStored(ex.mech, sc)+`"`), "t")
			if err != nil {
				t.Fatal(err)
			}
			a := New(users, nil, nil)
			a.nonce = func() string { return strings.TrimPrefix(full, cnonce) }
			conv, s1, err := a.Start(context.Background(), ex.mech, "admin", []byte(ex.cmd[0]), true)
			if err != nil {
				t.Fatal(err)
			}
			if string(s1) != ex.resp[0] {
				t.Fatalf("server-first %q, want %q", s1, ex.resp[0])
			}
			s2, done, err := conv.Step([]byte(ex.cmd[1]))
			if err != nil || !done || string(s2) != ex.resp[1] {
				t.Fatalf("server-final %q done=%v err=%v, want %q", s2, done, err, ex.resp[1])
			}
			id := conv.Identity()
			if id == nil || id.User != "user" || id.DB != "admin" || id.Mechanism != ex.mech {
				t.Fatalf("identity %v", id)
			}
			// The recovered ClientKey hashes to the StoredKey.
			h := hashOf(ex.mech)()
			h.Write(id.ClientKey)
			if !hmac.Equal(h.Sum(nil), sc.StoredKey) {
				t.Fatal("ClientKey does not hash to StoredKey")
			}
			// Pass-through gets the key with the credentials it was
			// proven against; a stored form gives no password.
			pt, ok := id.PassThrough()
			if !ok || pt.Password != "" || !hmac.Equal(pt.ClientKey, id.ClientKey) ||
				!hmac.Equal(pt.Stored.StoredKey, sc.StoredKey) || !hmac.Equal(pt.Stored.ServerKey, sc.ServerKey) ||
				pt.Stored.Salt != sc.Salt || pt.Stored.Iters != sc.Iters || pt.Mechanism != ex.mech {
				t.Fatalf("pass-through secret %v does not match the stored credentials", ok)
			}
		})
	}
}

// login runs a whole client conversation against a.
func login(t *testing.T, a *Authenticator, m Mechanism, user, db, password string, skipEmpty bool) (*Identity, error) {
	t.Helper()
	var cl *scram.Client
	var err error
	if m == SCRAMSHA1 {
		cl, err = scram.SHA1.NewClientUnprepped(user, mongoPasswordDigest(user, password), "")
	} else {
		cl, err = scram.SHA256.NewClient(user, password, "")
	}
	if err != nil {
		t.Fatal(err)
	}
	cc := cl.NewConversation()
	c1, _ := cc.Step("")
	conv, s1, err := a.Start(context.Background(), m, db, []byte(c1), skipEmpty)
	if err != nil {
		return nil, err
	}
	c2, err := cc.Step(string(s1))
	if err != nil {
		t.Fatal(err)
	}
	s2, done, err := conv.Step([]byte(c2))
	if err != nil {
		return nil, err
	}
	if _, err := cc.Step(string(s2)); err != nil {
		t.Fatalf("client refuses the server's proof: %v", err)
	}
	if !skipEmpty {
		if done {
			t.Fatal("long form done after the proof")
		}
		if _, done, err = conv.Step(nil); err != nil || !done {
			t.Fatalf("empty step: done=%v err=%v", done, err)
		}
	} else if !done {
		t.Fatal("short form not done after the proof")
	}
	if _, _, err := conv.Step(nil); !errors.Is(err, ErrConversation) {
		t.Fatalf("step after the end: %v", err)
	}
	return conv.Identity(), nil
}

func TestLoginPlainAndStored(t *testing.T) {
	line, err := HashPassword("bob", "app", "s3cret")
	if err != nil {
		t.Fatal(err)
	}
	users, err := ParseFile([]byte("\"alice@admin\" \"pässwörd\"\n"+line+"\n"), "t")
	if err != nil {
		t.Fatal(err)
	}
	a := New(users, []UserID{{User: "alice", DB: "admin"}}, nil)
	for _, m := range Mechanisms {
		for _, skip := range []bool{true, false} {
			id, err := login(t, a, m, "alice", "admin", "pässwörd", skip)
			if err != nil || id == nil || id.ID() != (UserID{User: "alice", DB: "admin"}) {
				t.Fatalf("%s skip=%v: %v %v", m, skip, id, err)
			}
			if !a.IsAdmin(id) {
				t.Fatal("alice is an admin")
			}
			id, err = login(t, a, m, "bob", "app", "s3cret", skip)
			if err != nil || id.ID() != (UserID{User: "bob", DB: "app"}) || a.IsAdmin(id) {
				t.Fatalf("%s bob: %v %v", m, id, err)
			}
		}
	}
	// Wrong password, unknown user, wrong database: one error.
	var msgs []string
	for _, c := range [][3]string{{"alice", "admin", "nope"}, {"carol", "admin", "x"}, {"bob", "admin", "s3cret"}} {
		for _, m := range Mechanisms {
			_, err := login(t, a, m, c[0], c[1], c[2], true)
			if !IsAuthFailed(err) {
				t.Fatalf("%v %s: %v", c, m, err)
			}
			msgs = append(msgs, strings.SplitN(err.Error(), ":", 2)[0])
		}
	}
	for _, m := range msgs {
		if m != msgs[0] {
			t.Fatalf("messages differ: %q", msgs)
		}
	}
}

// A plain auth_file password is SASLprepped for SCRAM-SHA-256 as a
// driver prepares the client's: stored "I\u00ADX" (a soft hyphen, mapped to
// nothing) accepts a client whose password is "IX", and stored "IX" one
// whose password is "I\u00ADX". SCRAM-SHA-1 digests the password as it is:
// there only the very same password logs in.
func TestLoginSASLprep(t *testing.T) {
	for _, c := range []struct {
		stored, client string
		mech           Mechanism
		ok             bool
	}{
		{"I\u00ADX", "IX", SCRAMSHA256, true},
		{"IX", "I\u00ADX", SCRAMSHA256, true},
		{"I\u00ADX", "I\u00ADX", SCRAMSHA1, true},
		{"I\u00ADX", "IX", SCRAMSHA1, false},
	} {
		users, err := ParseFile([]byte(`"u@admin" "`+c.stored+`"`), "t")
		if err != nil {
			t.Fatal(err)
		}
		id, err := login(t, New(users, nil, nil), c.mech, "u", "admin", c.client, true)
		if c.ok && (err != nil || id == nil || id.ID() != (UserID{User: "u", DB: "admin"})) {
			t.Errorf("%s, stored %q, client %q: %v %v", c.mech, c.stored, c.client, id, err)
		}
		if !c.ok && !IsAuthFailed(err) {
			t.Errorf("%s, stored %q, client %q: %v, want a failed login", c.mech, c.stored, c.client, err)
		}
	}
}

func TestUnknownUserLooksKnown(t *testing.T) {
	a := New(&Users{}, nil, nil)
	first := func(user string) string {
		cl, _ := scram.SHA256.NewClient(user, "x", "")
		c1, _ := cl.NewConversation().Step("")
		_, s1, err := a.Start(context.Background(), SCRAMSHA256, "admin", []byte(c1), true)
		if err != nil {
			t.Fatal(err)
		}
		return string(s1)
	}
	s1, s2 := first("ghost"), first("ghost")
	if attr(s1, "s") != attr(s2, "s") || attr(s1, "i") != "15000" {
		t.Fatalf("fake salt not stable or wrong iterations: %q %q", s1, s2)
	}
	if attr(first("other"), "s") == attr(s1, "s") {
		t.Fatal("two unknown users share a salt")
	}
	if got := a.Mechanisms(context.Background(), "ghost", "admin"); len(got) != 2 {
		t.Fatalf("mechanisms of an unknown user: %v", got)
	}
}

func TestStartRefusesMechanismAndGarbage(t *testing.T) {
	a := New(&Users{}, nil, nil)
	if _, _, err := a.Start(context.Background(), "PLAIN", "admin", []byte("x"), true); !errors.Is(err, ErrMechanism) {
		t.Fatal(err)
	}
	if _, _, err := a.Start(context.Background(), SCRAMSHA1, "admin", []byte("garbage"), true); !IsAuthFailed(err) {
		t.Fatal(err)
	}
}

func TestLookupUsedForMissingUsers(t *testing.T) {
	sc256, _ := Derive(SCRAMSHA256, "dyn", "pw", []byte("0123456789abcdef"), 4096)
	creds, err := NewCreds(map[Mechanism]scram.StoredCredentials{SCRAMSHA256: sc256})
	if err != nil {
		t.Fatal(err)
	}
	cache := NewCache(LookupFunc(func(ctx context.Context, user, db string) (Creds, error) {
		if user == "dyn" && db == "admin" {
			return creds, nil
		}
		return Creds{}, ErrNotFound
	}), CacheOptions{})
	a := New(&Users{}, nil, cache)
	if id, err := login(t, a, SCRAMSHA256, "dyn", "admin", "pw", true); err != nil || id.User != "dyn" {
		t.Fatal(id, err)
	}
	// Both mechanisms, as for anyone: saslSupportedMechs tells nobody who
	// exists (the SCRAM-SHA-1 login below then fails as a wrong password).
	if got := a.Mechanisms(context.Background(), "dyn", "admin"); len(got) != 2 {
		t.Fatal(got)
	}
	if _, err := login(t, a, SCRAMSHA1, "dyn", "admin", "pw", true); !IsAuthFailed(err) {
		t.Fatal("a mechanism the user lacks must fail like a wrong password", err)
	}
}

// A plain auth_file password is handed to pass-through as it is: it logs
// in upstream whatever salt the upstream has. An X.509 identity has no
// pass-through secret.
func TestPassThroughCarriesPlainPassword(t *testing.T) {
	users, err := ParseFile([]byte(`"u@admin" "plain pässword"`), "t")
	if err != nil {
		t.Fatal(err)
	}
	a := New(users, nil, nil)
	for _, m := range Mechanisms {
		id, err := login(t, a, m, "u", "admin", "plain pässword", true)
		if err != nil {
			t.Fatal(err)
		}
		pt, ok := id.PassThrough()
		if !ok || pt.Password != "plain pässword" || pt.Mechanism != m || len(pt.ClientKey) == 0 {
			t.Fatalf("%s: pass-through %v %v", m, ok, pt.Mechanism)
		}
	}
	if _, ok := (&Identity{User: "CN=x", DB: "$external", Mechanism: "MONGODB-X509"}).PassThrough(); ok {
		t.Fatal("an X.509 identity has a pass-through secret")
	}
}

// TestUserIDsNeverCollide: "@" is legal in user and database names, so
// user "a" on "b@c" and user "a@b" on "c" write the same "a@b@c". The
// auth_file line names the second (its database follows the last @); the
// first is someone else, who neither logs in with that line's password nor
// is an admin because admin_users names the second.
func TestUserIDsNeverCollide(t *testing.T) {
	users, err := ParseFile([]byte(`"a@b@c" "pw"`), "t")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := users.Lookup("a@b", "c"); !ok {
		t.Fatal(`the line "a@b@c" is not user "a@b" on "c"`)
	}
	if _, ok := users.Lookup("a", "b@c"); ok {
		t.Fatal(`user "a" on "b@c" found under the line "a@b@c"`)
	}
	admin, ok := ParseUserID("a@b@c")
	if !ok || admin != (UserID{User: "a@b", DB: "c"}) {
		t.Fatalf("ParseUserID = %+v %v", admin, ok)
	}
	a := New(users, []UserID{admin}, nil)
	for _, m := range Mechanisms {
		if id, err := login(t, a, m, "a", "b@c", "pw", true); err == nil {
			t.Fatalf(`%s: user "a" on "b@c" logged in as %v with the password of "a@b" on "c"`, m, id)
		}
		id, err := login(t, a, m, "a@b", "c", "pw", false)
		if err != nil || !a.IsAdmin(id) {
			t.Fatalf("%s: the admin: %v %v", m, id, err)
		}
	}
	if a.IsAdmin(&Identity{User: "a", DB: "b@c"}) {
		t.Fatal(`user "a" on "b@c" is an admin because "a@b" on "c" is`)
	}
}

// TestFailedLastStepIsNoLogin: in the long form the proof verifies one
// step before the end; a last step that is not empty fails the login, and
// the conversation names nobody, before that step or after.
func TestFailedLastStepIsNoLogin(t *testing.T) {
	users, err := ParseFile([]byte(`"u@admin" "pw"`), "t")
	if err != nil {
		t.Fatal(err)
	}
	a := New(users, nil, nil)
	cl, _ := scram.SHA256.NewClient("u", "pw", "")
	cc := cl.NewConversation()
	c1, _ := cc.Step("")
	conv, s1, err := a.Start(context.Background(), SCRAMSHA256, "admin", []byte(c1), false)
	if err != nil {
		t.Fatal(err)
	}
	c2, _ := cc.Step(string(s1))
	if _, done, err := conv.Step([]byte(c2)); err != nil || done {
		t.Fatalf("proof step: done=%v %v", done, err)
	}
	if conv.Identity() != nil {
		t.Fatal("logged in before the last step")
	}
	if _, done, err := conv.Step([]byte("garbage")); !done || !IsAuthFailed(err) {
		t.Fatalf("garbage last step: done=%v %v", done, err)
	}
	if conv.Identity() != nil {
		t.Fatal("logged in after a failed last step")
	}
}
