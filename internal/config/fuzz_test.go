package config

import (
	"os"
	"strings"
	"testing"
)

// FuzzParse checks that no document makes Parse panic, that every problem
// carries a message, and that a document Parse accepts also resolves.
func FuzzParse(f *testing.F) {
	if data, err := os.ReadFile("../../examples/mongobouncer.toml"); err == nil {
		f.Add(string(data))
	}
	for _, s := range []string{
		route,
		"[mongobouncer]\npool_mode = \"sessions\"\nmax_pool = 1\nconnect_timeout = 30\n" + route,
		"databases.orders = { connection_string = \"mongodb://u:p@h/?maxPoolSize=5\", max_pool = 1 }\n",
		"[databases]\norders = 5\n",
		"[[databases]]\nx = 1\n",
		"a = [1, {b = 2}]\n[databases.\"\\u0000\"]\nconnection_string = \"mongodb://%2Ftmp%2Fa.sock\"\n",
		"[mongobouncer]\nlisten = \"[::1]:0\"\nadmin_listen = \"/tmp/a.sock\"\n" + route + "listen = \":0\"\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, doc string) {
		c, err := Parse([]byte(doc), "f.toml")
		if err != nil {
			ps := Problems(err)
			if len(ps) == 0 {
				t.Fatalf("error without problems: %v", err)
			}
			for _, p := range ps {
				if p.Msg == "" || !strings.HasPrefix(p.Error(), "f.toml") {
					t.Fatalf("bad problem %#v", p)
				}
			}
			return
		}
		if _, err := c.Routes(); err != nil {
			t.Fatalf("Parse accepted what Routes refuses: %v", err)
		}
	})
}

// FuzzParseConnString checks that no connection string makes the parser
// panic and that a password never shows in an error or in Redacted.
func FuzzParseConnString(f *testing.F) {
	for _, s := range []string{
		"mongodb://u:pw@h1,h2:27018/db?replicaSet=rs&maxPoolSize=5",
		"mongodb://%2Ftmp%2Fm.sock",
		"mongodb://[::1]:1/?waitQueueTimeoutMS=5",
		"mongodb+srv://u:pw@c/",
		"mongodb://u:p@x@h/",
	} {
		f.Add(s, "Secret9")
	}
	f.Fuzz(func(t *testing.T, s, pw string) {
		// Only a password distinctive enough not to occur by chance in a
		// message is checked for leaks.
		distinctive := len(pw) >= 6 && !strings.ContainsAny(pw, ":/@%?#[],&;=") &&
			!strings.Contains(s, pw)
		in := s
		if distinctive {
			if i := strings.Index(s, "://"); i >= 0 {
				in = s[:i+3] + "user:" + pw + "@" + s[i+3:]
			}
		}
		cs, err := ParseConnString(in)
		if !distinctive || !strings.Contains(in, pw) {
			return
		}
		if err != nil && strings.Contains(err.Error(), pw) {
			t.Fatalf("password in error for %q: %v", in, err)
		}
		if err == nil && strings.Contains(cs.Redacted(), pw) {
			t.Fatalf("password in Redacted for %q: %s", in, cs.Redacted())
		}
	})
}
