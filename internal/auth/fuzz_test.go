package auth

import (
	"context"
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

// FuzzConversation sends arbitrary client-first and client-final messages
// to the server side: no panic, and no login without the password.
func FuzzConversation(f *testing.F) {
	f.Add("n,,n=u,r=abc", "c=biws,r=abcdef,p=AAAA", true)
	f.Add("n,a=x,n=u,r=abc", "c=biws,r=abc,p=", false)
	f.Add("", "", true)
	users, err := ParseFile([]byte(`"u@db" "`+FormatStored(SCRAMSHA256, mustDerive(f, SCRAMSHA256))+` `+FormatStored(SCRAMSHA1, mustDerive(f, SCRAMSHA1))+`"`), "f")
	if err != nil {
		f.Fatal(err)
	}
	a := New(users, nil, nil)
	f.Fuzz(func(t *testing.T, c1, c2 string, sha1 bool) {
		m := SCRAMSHA256
		if sha1 {
			m = SCRAMSHA1
		}
		conv, _, err := a.Start(context.Background(), m, "db", []byte(c1), true)
		if err != nil {
			return
		}
		if _, _, err := conv.Step([]byte(c2)); err == nil || conv.Identity() != nil {
			t.Fatalf("logged in without the password: %q %q", c1, c2)
		}
	})
}

func mustDerive(f *testing.F, m Mechanism) scram.StoredCredentials {
	sc, err := Derive(m, "u", "a long random password nobody guesses", []byte("0123456789abcdef"), 4096)
	if err != nil {
		f.Fatal(err)
	}
	return sc
}
