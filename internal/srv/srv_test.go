package srv

import (
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
)

func TestResolveHappyPath(t *testing.T) {
	z, r := startDNS(t)
	z.setSRV("_mongodb._tcp.cluster0.example.com.",
		srvRec{target: "Shard-00.Example.COM.", port: 27017, priority: 5, weight: 1},
		srvRec{target: "shard-01.example.com", port: 27018},
		srvRec{target: "a.b.example.com", port: 27019, priority: 1, weight: 9},
		srvRec{target: "shard-01.example.com.", port: 27018}, // a duplicate
	)
	res, err := Resolve(testCtx(t), r, "Cluster0.Example.com.", Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"a.b.example.com:27019", "shard-00.example.com:27017", "shard-01.example.com:27018"}
	if !slices.Equal(res.Hosts, want) {
		t.Errorf("hosts = %q, want %q", res.Hosts, want)
	}
	if res.TXT != (TXTOptions{}) {
		t.Errorf("TXT = %+v without a TXT record", res.TXT)
	}
}

func TestResolveServiceName(t *testing.T) {
	z, r := startDNS(t)
	z.setSRV("_mongodb._tcp.cluster0.example.com.", srvRec{target: "wrong.example.com", port: 1})
	z.setSRV("_customname._tcp.cluster0.example.com.", srvRec{target: "right.example.com", port: 2})
	res, err := Resolve(testCtx(t), r, "cluster0.example.com", Options{ServiceName: "customname"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"right.example.com:2"}; !slices.Equal(res.Hosts, want) {
		t.Errorf("hosts = %q, want %q", res.Hosts, want)
	}
}

func TestResolveTXTOptions(t *testing.T) {
	z, r := startDNS(t)
	z.setSRV("_mongodb._tcp.cluster0.example.com.", srvRec{target: "h1.example.com", port: 27017})
	// One record of two character strings, split inside a value: they are
	// concatenated.
	z.setTXT("cluster0.example.com.", []string{"authSource=this", "DB&replicaSet=repl0&loadBalanced=false"})
	res, err := Resolve(testCtx(t), r, "cluster0.example.com", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.TXT.AuthSource != "thisDB" || res.TXT.ReplicaSet != "repl0" || res.TXT.LoadBalanced == nil ||
		*res.TXT.LoadBalanced {
		t.Errorf("TXT = %+v, want authSource thisDB, replicaSet repl0, loadBalanced false", res.TXT)
	}

	z.setTXT("cluster0.example.com.", []string{"loadBalanced=true"})
	res, err = Resolve(testCtx(t), r, "cluster0.example.com", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.TXT.LoadBalanced == nil || !*res.TXT.LoadBalanced {
		t.Errorf("TXT = %+v, want loadBalanced true", res.TXT)
	}
}

func TestResolveTXTErrors(t *testing.T) {
	z, r := startDNS(t)
	z.setSRV("_mongodb._tcp.cluster0.example.com.",
		srvRec{target: "h1.example.com", port: 27017}, srvRec{target: "h2.example.com", port: 27017})
	cases := []struct {
		name string
		txt  [][]string
		max  int
		want error
	}{
		{"disallowed option", [][]string{{"authSource=admin&readPreference=secondary"}}, 0, ErrTXTOption},
		{"ssl is not allowed", [][]string{{"ssl=false"}}, 0, ErrTXTOption},
		{"tls is not allowed", [][]string{{"tls=false"}}, 0, ErrTXTOption},
		{"malformed", [][]string{{"replicaSet"}}, 0, ErrTXTOption},
		{"bad loadBalanced", [][]string{{"loadBalanced=yes"}}, 0, ErrTXTOption},
		{"two records", [][]string{{"authSource=admin"}, {"replicaSet=rs0"}}, 0, ErrMultipleTXT},
		{"srvMaxHosts with replicaSet", [][]string{{"replicaSet=rs0"}}, 1, ErrOptionConflict},
		{"srvMaxHosts with loadBalanced", [][]string{{"loadBalanced=true"}}, 1, ErrOptionConflict},
		{"loadBalanced with two hosts", [][]string{{"loadBalanced=true"}}, 0, ErrOptionConflict},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			z.setTXT("cluster0.example.com.", c.txt...)
			res, err := Resolve(testCtx(t), r, "cluster0.example.com", Options{MaxHosts: c.max})
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v (hosts %q), want %v", err, res.Hosts, c.want)
			}
			if res.Hosts != nil {
				t.Errorf("hosts %q returned with an error", res.Hosts)
			}
		})
	}
}

// TestResolveParentDomain follows the spec's prose tests for the parent
// domain rule, including host names of one and two labels.
func TestResolveParentDomain(t *testing.T) {
	z, r := startDNS(t)
	cases := []struct {
		host, target string
		ok           bool
	}{
		{"localhost", "test_1.localhost", true},
		{"mongo.local", "test_1.mongo.local", true},
		{"blogs.mongodb.com", "blogs.mongodb.com", true},
		{"blogs.mongodb.com", "a.b.mongodb.com", true},
		{"localhost", "test_1.evil.local", false},
		{"mongo.local", "test_1.evil.local", false},
		{"blogs.mongodb.com", "test_1.evilmongodb.com", false},
		{"localhost", "localhost", false},
		{"mongo.local", "mongo.local", false},
		{"blogs.mongodb.com", "mongodb.com", false},
		{"localhost", "test_1.cluster_1localhost", false},
		{"mongo.local", "test_1.my_hostmongo.local", false},
		{"blogs.mongodb.com", "cluster.testmongodb.com", false},
	}
	for _, c := range cases {
		t.Run(c.host+"->"+c.target, func(t *testing.T) {
			// A valid record beside the tested one: one bad target spoils
			// the whole answer.
			z.setSRV("_mongodb._tcp."+c.host+".",
				srvRec{target: "good." + c.host, port: 27017}, srvRec{target: c.target, port: 27017})
			res, err := Resolve(testCtx(t), r, c.host, Options{})
			if c.ok {
				if err != nil {
					t.Fatal(err)
				}
				if len(res.Hosts) != 2 {
					t.Errorf("hosts = %q, want 2", res.Hosts)
				}
				return
			}
			if !errors.Is(err, ErrInvalidTarget) {
				t.Fatalf("err = %v (hosts %q), want ErrInvalidTarget", err, res.Hosts)
			}
			if !strings.Contains(err.Error(), c.target) {
				t.Errorf("error %q does not name the target", err)
			}
		})
	}
}

func TestResolveNoRecords(t *testing.T) {
	z, r := startDNS(t)
	// NXDOMAIN.
	_, err := Resolve(testCtx(t), r, "missing.example.com", Options{})
	if !errors.Is(err, ErrNoRecords) {
		t.Fatalf("NXDOMAIN: err = %v, want ErrNoRecords", err)
	}
	// The name has a TXT record but no SRV record.
	z.setTXT("_mongodb._tcp.nodata.example.com.", []string{"x"})
	_, err = Resolve(testCtx(t), r, "nodata.example.com", Options{})
	if !errors.Is(err, ErrNoRecords) {
		t.Fatalf("no SRV records: err = %v, want ErrNoRecords", err)
	}
}

func TestResolveDNSFailure(t *testing.T) {
	z, r := startDNS(t)
	z.setSRV("_mongodb._tcp.cluster0.example.com.", srvRec{target: "h1.example.com", port: 27017})
	z.setServfail(true)
	_, err := Resolve(testCtx(t), r, "cluster0.example.com", Options{})
	if !errors.Is(err, ErrLookup) {
		t.Fatalf("err = %v, want ErrLookup", err)
	}
	if _, ok := errors.AsType[*net.DNSError](err); !ok {
		t.Errorf("err = %v does not wrap the *net.DNSError", err)
	}
}

func TestResolveInvalidInputDoesNoDNS(t *testing.T) {
	z, r := startDNS(t)
	cases := []struct {
		host string
		o    Options
		want error
	}{
		{"", Options{}, ErrInvalidHost},
		{"cluster0.example.com:27017", Options{}, ErrInvalidHost},
		{"a.example.com,b.example.com", Options{}, ErrInvalidHost},
		{"a..example.com", Options{}, ErrInvalidHost},
		{strings.Repeat("a", 64) + ".example.com", Options{}, ErrInvalidHost},
		{"cluster0.example.com", Options{ServiceName: "bad_name"}, ErrInvalidHost},
		{"cluster0.example.com", Options{ServiceName: "-mongodb"}, ErrInvalidHost},
		{"cluster0.example.com", Options{ServiceName: "27017"}, ErrInvalidHost},
		{"cluster0.example.com", Options{ServiceName: strings.Repeat("a", 63)}, ErrInvalidHost},
		{"cluster0.example.com", Options{MaxHosts: -1}, ErrOptionConflict},
	}
	for _, c := range cases {
		if _, err := Resolve(testCtx(t), r, c.host, c.o); !errors.Is(err, c.want) {
			t.Errorf("Resolve(%q, %+v): err = %v, want %v", c.host, c.o, err, c.want)
		}
	}
	if n := z.queryCount(); n != 0 {
		t.Errorf("%d DNS queries for invalid input", n)
	}
}

func TestResolveMaxHosts(t *testing.T) {
	z, r := startDNS(t)
	var all []string
	var recs []srvRec
	for _, h := range []string{"h0", "h1", "h2", "h3", "h4"} {
		recs = append(recs, srvRec{target: h + ".example.com", port: 27017})
		all = append(all, h+".example.com:27017")
	}
	z.setSRV("_mongodb._tcp.cluster0.example.com.", recs...)

	for _, m := range []int{0, 5, 9} {
		res, err := Resolve(testCtx(t), r, "cluster0.example.com", Options{MaxHosts: m})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(res.Hosts, all) {
			t.Errorf("srvMaxHosts=%d: hosts = %q, want all %q", m, res.Hosts, all)
		}
	}

	// Two of five at random: always two distinct hosts of the five, and
	// not always the same two (the chance that 40 draws of 10 equally likely
	// pairs agree is 10^-39).
	seen := map[string]bool{}
	for range 40 {
		res, err := Resolve(testCtx(t), r, "cluster0.example.com", Options{MaxHosts: 2})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Hosts) != 2 || res.Hosts[0] == res.Hosts[1] {
			t.Fatalf("hosts = %q, want two distinct", res.Hosts)
		}
		for _, h := range res.Hosts {
			if !slices.Contains(all, h) {
				t.Fatalf("host %q is not in the SRV records", h)
			}
		}
		seen[strings.Join(res.Hosts, ",")] = true
	}
	if len(seen) < 2 {
		t.Errorf("srvMaxHosts=2 chose the same hosts 40 times: %v", seen)
	}
}
