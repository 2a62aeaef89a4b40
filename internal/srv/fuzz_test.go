package srv

import (
	"errors"
	"net"
	"strings"
	"testing"
)

func TestParseTXT(t *testing.T) {
	yes, no := true, false
	ok := []struct {
		in   string
		want TXTOptions
	}{
		{"", TXTOptions{}},
		{"authSource=admin", TXTOptions{AuthSource: "admin"}},
		{"AUTHSOURCE=admin&replicaset=rs%2F0", TXTOptions{AuthSource: "admin", ReplicaSet: "rs/0"}},
		{"loadBalanced=true", TXTOptions{LoadBalanced: &yes}},
		{"loadBalanced=false&authSource=a%20b", TXTOptions{LoadBalanced: &no, AuthSource: "a b"}},
	}
	for _, c := range ok {
		got, err := ParseTXT(c.in)
		if err != nil {
			t.Errorf("ParseTXT(%q): %v", c.in, err)
			continue
		}
		if got.AuthSource != c.want.AuthSource || got.ReplicaSet != c.want.ReplicaSet ||
			(got.LoadBalanced == nil) != (c.want.LoadBalanced == nil) ||
			got.LoadBalanced != nil && *got.LoadBalanced != *c.want.LoadBalanced {
			t.Errorf("ParseTXT(%q) = %+v, want %+v", c.in, got, c.want)
		}
	}
	for _, in := range []string{
		"authSource", "authSource=", "=admin", "authSource=a&authsource=b", "authSource=a&&replicaSet=b",
		"authSource=a&", "ssl=true", "tls=false", "w=majority", "loadBalanced=TRUE", "loadBalanced=1",
		"authSource=%zz", "auth%Source=a",
	} {
		if got, err := ParseTXT(in); !errors.Is(err, ErrTXTOption) {
			t.Errorf("ParseTXT(%q) = %+v, %v; want ErrTXTOption", in, got, err)
		}
	}
}

// FuzzParseTXT: no panic, every error is ErrTXTOption, and what parses
// sets only non-empty values that survive a second parse of their own
// encoding.
func FuzzParseTXT(f *testing.F) {
	for _, s := range []string{
		"", "authSource=admin", "replicaSet=rs0&authSource=thisDB", "loadBalanced=true", "loadBalanced=false",
		"ssl=false", "authSource=a&authSource=b", "a=b=c", "&", "=", "authSource=%41dmin", "authSource=%",
		"replicaSet=r+s", "LOADBALANCED=true&REPLICASET=x",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		o, err := ParseTXT(s)
		if err != nil {
			if !errors.Is(err, ErrTXTOption) {
				t.Fatalf("ParseTXT(%q): %v is not ErrTXTOption", s, err)
			}
			return
		}
		var parts []string
		if o.AuthSource != "" {
			parts = append(parts, "authSource="+escape(o.AuthSource))
		}
		if o.ReplicaSet != "" {
			parts = append(parts, "replicaSet="+escape(o.ReplicaSet))
		}
		if o.LoadBalanced != nil {
			parts = append(parts, "loadBalanced="+map[bool]string{true: "true", false: "false"}[*o.LoadBalanced])
		}
		if s != "" && len(parts) == 0 {
			t.Fatalf("ParseTXT(%q) accepted a non-empty record and set nothing", s)
		}
		again, err := ParseTXT(strings.Join(parts, "&"))
		if err != nil || again.AuthSource != o.AuthSource || again.ReplicaSet != o.ReplicaSet ||
			(again.LoadBalanced == nil) != (o.LoadBalanced == nil) {
			t.Fatalf("ParseTXT(%q) = %+v, but its re-encoding parses as %+v, %v", s, o, again, err)
		}
	})
}

// escape percent-encodes every byte so the re-encoding needs no URL
// package logic of its own.
func escape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		b.WriteString("%")
		b.WriteString(strings.ToUpper(string("0123456789abcdef"[s[i]>>4]) + string("0123456789abcdef"[s[i]&15])))
	}
	return b.String()
}

// FuzzTarget: the host name and parent domain checks never panic, and a
// target they accept is a lower-case host:port under the parent domain,
// never the parent domain itself.
func FuzzTarget(f *testing.F) {
	for _, s := range [][2]string{
		{"localhost", "test_1.localhost"}, {"mongo.local", "mongo.local"}, {"blogs.mongodb.com", "x.mongodb.com."},
		{"blogs.mongodb.com", "cluster.testmongodb.com"}, {"A.B.C", "X.B.C"}, {"a.b.c.", "."}, {"", ""},
		{"a:1", "b.a"}, {"a..b", "c.a..b"},
	} {
		f.Add(s[0], s[1], uint16(27017))
	}
	f.Fuzz(func(t *testing.T, host, target string, port uint16) {
		q, err := newQuery(host, Options{})
		if err != nil {
			if !errors.Is(err, ErrInvalidHost) {
				t.Fatalf("newQuery(%q): %v is not ErrInvalidHost", host, err)
			}
			return
		}
		hp, err := q.target(&net.SRV{Target: target, Port: port})
		if err != nil {
			if !errors.Is(err, ErrInvalidTarget) || errors.Is(err, ErrInvalidHost) {
				t.Fatalf("target(%q): %v is not ErrInvalidTarget", target, err)
			}
			return
		}
		h, _, err := net.SplitHostPort(hp)
		if err != nil {
			t.Fatalf("target(%q) = %q: %v", target, hp, err)
		}
		if h != strings.ToLower(h) || !strings.HasSuffix(h, q.suffix) || h == q.suffix[1:] {
			t.Fatalf("host %q, target %q accepted as %q (suffix %q)", host, target, hp, q.suffix)
		}
	})
}
