package main

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/xdg-go/scram"

	"github.com/mongobouncer/mongobouncer/internal/auth"
	"github.com/mongobouncer/mongobouncer/internal/testutil/logbuf"
)

// The printed line is a valid auth_file line whose secrets log the user in
// with both mechanisms, and never the password itself.
func TestHashPasswordLineLogsIn(t *testing.T) {
	var out, errb logbuf.Buffer
	code := hashPassword([]string{"--user", "ann", "--db", "sales"}, strings.NewReader("pä ss\n"), &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	line := strings.TrimSpace(out.String())
	if !strings.HasPrefix(line, `"ann@sales" "SCRAM-SHA-256$15000:`) || !strings.Contains(line, " SCRAM-SHA-1$10000:") || strings.Contains(line, "pä ss") {
		t.Fatalf("line %q", line)
	}
	var again logbuf.Buffer
	hashPassword([]string{"--user", "ann", "--db", "sales"}, strings.NewReader("pä ss"), &again, &errb)
	if again.String() == out.String() {
		t.Fatal("two runs gave the same salt")
	}
	users, err := auth.ParseFile([]byte(line), "users.txt")
	if err != nil {
		t.Fatal(err)
	}
	a := auth.New(users, nil, nil)
	for _, m := range auth.Mechanisms {
		for _, pw := range []string{"pä ss", "wrong"} {
			hg, secret := scram.SHA256, pw
			if m == auth.SCRAMSHA1 {
				hg = scram.SHA1
				secret = md5hex("ann:mongo:" + pw)
			}
			cl, _ := hg.NewClientUnprepped("ann", secret, "")
			cc := cl.NewConversation()
			c1, _ := cc.Step("")
			conv, s1, err := a.Start(context.Background(), m, "sales", []byte(c1), true)
			if err != nil {
				t.Fatal(err)
			}
			c2, _ := cc.Step(string(s1))
			_, _, err = conv.Step([]byte(c2))
			if (err == nil) != (pw == "pä ss") {
				t.Fatalf("%s with %q: %v", m, pw, err)
			}
		}
	}
}

func TestHashPasswordUsage(t *testing.T) {
	for _, c := range []struct {
		args  []string
		stdin string
		code  int
	}{
		{nil, "x\n", 2},
		{[]string{"--user", "u", "extra"}, "x\n", 2},
		{[]string{"--user", "u"}, "\n", 1},
		{[]string{"--user", "u"}, strings.Repeat("x", 5000), 1},
		{[]string{"--user", "u"}, "ok\r\n", 0},
	} {
		var out, errb logbuf.Buffer
		if got := hashPassword(c.args, strings.NewReader(c.stdin), &out, &errb); got != c.code {
			t.Errorf("%v: exit %d, want %d (%s)", c.args, got, c.code, errb.String())
		}
	}
}

func md5hex(s string) string {
	sum := md5.Sum([]byte(s))
	return hex.EncodeToString(sum[:])
}
