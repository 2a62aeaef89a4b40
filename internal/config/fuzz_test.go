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
		"[mongobouncer]\nread_preference = \"nearest\"\nmax_staleness = \"90s\"\n" + route +
			"read_preference_tags = [{dc = \"east\"}, {}]\nlocal_threshold = \"5ms\"\nserver_selection_timeout = \"1s\"\n",
		"[databases.a]\nconnection_string = \"mongodb+srv://c.example.net/?readPreference=secondary&maxStalenessSeconds=120\"\nread_preference_tags = [1, {a = 2}]\n",
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
		"mongodb+srv://u:pw@c.example.net/db?srvServiceName=s&srvMaxHosts=2&tls=false",
		"mongodb+srv://c.example.net:1/?directConnection=true",
		"mongodb://h?readPreference=nearest&readPreferenceTags=dc:a,rack:1&readPreferenceTags=&maxStalenessSeconds=-1&localThresholdMS=20",
		"mongodb://h/?maxPoolSize=x&maxPoolSize=5&journal=&heartbeatIntervalMS=600&heartbeatFrequencyMS=700",
		"mongodb://h/?authMechanism=MONGODB-OIDC&authMechanismProperties=TOKEN_RESOURCE:mongodb://a%2Cb,ENVIRONMENT:azure",
		"mongodb://rel%2Fm.sock,m.sock,[::1]:1/a.b?tls=true&ssl=true&proxyHost=p&wtimeout=5&wTimeoutMS=1",
	} {
		f.Add(s, "Secret9")
	}
	f.Fuzz(func(t *testing.T, s, pw string) {
		// Only a password long enough to mean something, that could stand
		// in the userinfo as it is and that s does not already contain, is
		// checked for leaks.
		i := strings.Index(s, "://")
		if i < 0 || len(pw) < 6 || strings.ContainsAny(pw, ":/@%?#[],&;=") || strings.Contains(s, pw) {
			_, _ = ParseConnString(s)
			return
		}
		with := func(p string) string { return s[:i+3] + "user:" + p + "@" + s[i+3:] }
		cs, err := ParseConnString(with(pw))
		// A message can contain pw without leaking it: the quotes around
		// an option name, or fixed text, may spell it. So the same string
		// is parsed with another password of the same length, and a leak
		// is pw showing up more often than it does there.
		alt := strings.Repeat("x", len(pw))
		if alt == pw {
			alt = strings.Repeat("y", len(pw))
		}
		cs2, err2 := ParseConnString(with(alt))
		if n, n2 := strings.Count(errText(err), pw), strings.Count(errText(err2), pw); n > n2 {
			t.Fatalf("password in error for %q: %v", with(pw), err)
		}
		if err == nil && err2 == nil && strings.Count(cs.Redacted(), pw) > strings.Count(cs2.Redacted(), pw) {
			t.Fatalf("password in Redacted for %q: %s", with(pw), cs.Redacted())
		}
		if err == nil && err2 == nil {
			w, w2 := strings.Join(cs.Warnings, "\n"), strings.Join(cs2.Warnings, "\n")
			if strings.Count(w, pw) > strings.Count(w2, pw) {
				t.Fatalf("password in a warning for %q: %q", with(pw), cs.Warnings)
			}
		}
		if err == nil && (cs.SRV != (len(cs.Hosts) == 0) || cs.SRV != (cs.SRVHost != "")) {
			t.Fatalf("%q: SRV %v with hosts %v and SRV host %q", with(pw), cs.SRV, cs.Hosts, cs.SRVHost)
		}
	})
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
