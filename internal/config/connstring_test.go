package config

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

func tcp(addrs ...string) []Host {
	hs := make([]Host, len(addrs))
	for i, a := range addrs {
		hs[i] = Host{NetworkTCP, a}
	}
	return hs
}

func TestParseConnStringHosts(t *testing.T) {
	cases := []struct {
		in    string
		hosts []Host
	}{
		{"mongodb://localhost", tcp("localhost:27017")},
		{"mongodb://localhost/", tcp("localhost:27017")},
		{"mongodb://10.0.0.1:27018,10.0.0.2/", tcp("10.0.0.1:27018", "10.0.0.2:27017")},
		{"mongodb://[::1]/", tcp("[::1]:27017")},
		{"mongodb://[::1]:27019,[fd00::1:2]:1/", tcp("[::1]:27019", "[fd00::1:2]:1")},
		{"mongodb://%2Ftmp%2Fmongodb-27017.sock", []Host{{NetworkUnix, "/tmp/mongodb-27017.sock"}}},
		{"mongodb://%2Ftmp%2Fmongodb-27017.sock/db?replicaSet=rs", []Host{{NetworkUnix, "/tmp/mongodb-27017.sock"}}},
		{"mongodb://u:p@%2Fvar%2Frun%2Fm.sock,h2:1/", []Host{{NetworkUnix, "/var/run/m.sock"}, {NetworkTCP, "h2:1"}}},
	}
	for _, c := range cases {
		cs, err := ParseConnString(c.in)
		if err != nil {
			t.Errorf("%s: %v", c.in, err)
			continue
		}
		if !reflect.DeepEqual(cs.Hosts, c.hosts) || cs.Scheme != SchemeMongoDB {
			t.Errorf("%s: hosts %v, want %v", c.in, cs.Hosts, c.hosts)
		}
	}
}

func TestParseConnStringCredentials(t *testing.T) {
	cases := []struct {
		in, user, pass, db, authSource, redacted string
	}{
		{"mongodb://alice:s3cret@h/", "alice", "s3cret", "", "admin", "mongodb://alice:xxxxx@h/"},
		{"mongodb://alice:p%40ss%3Aw%2Fd@h/orders", "alice", "p@ss:w/d", "orders", "orders", "mongodb://alice:xxxxx@h/orders"},
		{"mongodb://us%20er:pw@h/?authSource=other", "us er", "pw", "", "other", "mongodb://us%20er:xxxxx@h/?authSource=other"},
		{"mongodb://alice@h/?authMechanism=MONGODB-X509", "alice", "", "", "$external", "mongodb://alice@h/?authMechanism=MONGODB-X509"},
		{"mongodb://alice:@h/", "alice", "", "", "admin", "mongodb://alice:xxxxx@h/"},
		{"mongodb://h/db", "", "", "db", "", "mongodb://h/db"},
		{"mongodb://a:b+c@h/", "a", "b+c", "", "admin", "mongodb://a:xxxxx@h/"},
	}
	for _, c := range cases {
		cs, err := ParseConnString(c.in)
		if err != nil {
			t.Errorf("%s: %v", c.in, err)
			continue
		}
		if cs.Username != c.user || cs.Password != c.pass || cs.Database != c.db || cs.AuthSource != c.authSource {
			t.Errorf("%s: user %q pass %q db %q authSource %q", c.in, cs.Username, cs.Password, cs.Database, cs.AuthSource)
		}
		if cs.Redacted() != c.redacted {
			t.Errorf("%s: Redacted() = %q, want %q", c.in, cs.Redacted(), c.redacted)
		}
		if c.pass == "" {
			continue
		}
		for _, format := range []string{"%v", "%+v", "%#v", "%s"} {
			if s := fmt.Sprintf(format, cs); strings.Contains(s, c.pass) {
				t.Errorf("%s of ConnString shows the password: %s", format, s)
			}
			if s := fmt.Sprintf(format, URI(c.in)); strings.Contains(s, c.pass) || strings.Contains(s, "s3cret") {
				t.Errorf("%s of URI shows the password: %s", format, s)
			}
			if s := fmt.Sprintf(format, []ConnString{cs}); strings.Contains(s, c.pass) {
				t.Errorf("%s of []ConnString shows the password: %s", format, s)
			}
		}
	}
}

func TestRedactURI(t *testing.T) {
	cases := map[string]string{
		"":                                   "",
		"hunter2":                            "xxxxx",
		"mongodb://h/":                       "mongodb://h/",
		"mongodb://u:hunter2@h/":             "mongodb://u:xxxxx@h/",
		"mongodb://u:hun@ter2@h/":            "mongodb://u:xxxxx@ter2@h/",
		"mongodb+srv://u:hunter2@c.example/": "mongodb+srv://u:xxxxx@c.example/",
		"mysql://u:hunter2@h":                "mysql://u:xxxxx@h",
		"mongodb://h/?tlsCertificateKeyFilePassword=hunter2&tls=true":                              "mongodb://h/?tlsCertificateKeyFilePassword=xxxxx&tls=true",
		"mongodb://h/?authMechanism=MONGODB-AWS;authMechanismProperties=AWS_SESSION_TOKEN:hunter2": "mongodb://h/?authMechanism=MONGODB-AWS;authMechanismProperties=xxxxx",
		"mongodb://h/?sslClientCertificateKeyPassword=hunter2":                                     "mongodb://h/?sslClientCertificateKeyPassword=xxxxx",
		"mongodb://h/?tlsCertificateKeyFile%50assword=hunter2":                                     "mongodb://h/?tlsCertificateKeyFile%50assword=xxxxx",
	}
	for in, want := range cases {
		if got := redactURI(in); got != want {
			t.Errorf("redactURI(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseConnStringOptions(t *testing.T) {
	cs, err := ParseConnString("mongodb://u:pw@h1,h2/admin?replicaSet=rs0&tls=true&tlsCAFile=%2Fca.pem" +
		"&tlsCertificateKeyFile=%2Fkey.pem&tlsCertificateKeyFilePassword=kp&compressors=zstd,snappy" +
		"&appName=app&authSource=admin&authMechanism=SCRAM-SHA-256&maxPoolSize=50&minPoolSize=5" +
		"&maxIdleTimeMS=60000&maxConnecting=3&waitQueueTimeoutMS=1500&connectTimeoutMS=2000" +
		"&heartbeatFrequencyMS=15000&serverSelectionTimeoutMS=9000&readPreference=secondary&w=majority" +
		"&uuidRepresentation=standard")
	if err != nil {
		t.Fatal(err)
	}
	want := ConnString{
		Scheme: SchemeMongoDB, Hosts: tcp("h1:27017", "h2:27017"), Username: "u", Password: "pw",
		Database: "admin", AuthSource: "admin", AuthMechanism: "SCRAM-SHA-256", ReplicaSet: "rs0",
		TLS: true, TLSCAFile: "/ca.pem", TLSCertificateKeyFile: "/key.pem", TLSCertificateKeyFilePassword: "kp",
		Compressors: []string{"zstd", "snappy"}, AppName: "app",
		MaxPoolSize: new(50), MinPoolSize: new(5), MaxIdleTime: new(time.Minute), MaxConnecting: new(3),
		WaitQueueTimeout: new(1500 * time.Millisecond), ConnectTimeout: new(2 * time.Second),
		HeartbeatInterval: new(15 * time.Second), ServerSelectionTimeout: new(9 * time.Second),
		redacted: cs.redacted,
	}
	if !reflect.DeepEqual(cs, want) {
		t.Fatalf("got  %#v\nwant %#v", fields(cs), fields(want))
	}
	if strings.Contains(cs.Redacted(), "kp") || strings.Contains(cs.Redacted(), "pw") {
		t.Errorf("Redacted() = %s", cs.Redacted())
	}

	cs, err = ParseConnString("mongodb://h/?loadBalanced=true&heartbeatIntervalMS=700")
	if err != nil || !cs.LoadBalanced || *cs.HeartbeatInterval != 700*time.Millisecond || cs.MaxPoolSize != nil || cs.WaitQueueTimeout != nil {
		t.Errorf("loadBalanced: %+v %v", fields(cs), err)
	}
	cs, err = ParseConnString("mongodb://h/?directConnection=true&maxPoolSize=0")
	if err != nil || !cs.DirectConnection || cs.MaxPoolSize == nil || *cs.MaxPoolSize != 0 {
		t.Errorf("directConnection: %+v %v", fields(cs), err)
	}
}

// fields prints a ConnString's fields, pointers dereferenced, for test
// failure messages (its own formatting shows only the redacted string).
func fields(c ConnString) string {
	v := reflect.ValueOf(c)
	var b strings.Builder
	for i := range v.NumField() {
		f := v.Field(i)
		if !v.Type().Field(i).IsExported() {
			continue
		}
		if f.Kind() == reflect.Pointer && !f.IsNil() {
			f = f.Elem()
		}
		fmt.Fprintf(&b, "%s=%v ", v.Type().Field(i).Name, f)
	}
	return b.String()
}

func TestParseConnStringErrors(t *testing.T) {
	cases := []struct {
		in, want string
		cat      error
	}{
		{"", "empty", ErrConnString},
		{"localhost:27017", "must start with mongodb://", ErrConnString},
		{"mongodb+srv://cluster0.example.net/", "mongodb+srv is not supported yet: list the hosts", ErrSRVUnsupported},
		{"mongodb://", "no host", ErrConnString},
		{"mongodb:///db", "no host", ErrConnString},
		{"mongodb://h:0/", "host 1 of 1: the port must be a number from 1 to 65535", ErrConnString},
		{"mongodb://a,h:65536/", "host 2 of 2: the port must be", ErrConnString},
		{"mongodb://a,,b/", "host 2 of 3 is empty", ErrConnString},
		{"mongodb://::1/", "host 1 of 1 is not host or host:port", ErrConnString},
		{"mongodb://[::1/", "", ErrConnString},
		{"mongodb://h%zz/", "host 1 of 1 is not valid percent-encoding", ErrConnString},
		{"mongodb://relative.sock/", "must be an absolute path", ErrConnString},
		{"mongodb://u:p:q@h/", "unescaped : in the password", ErrConnString},
		{"mongodb://u/x:p@h/", "unescaped / in the username", ErrConnString},
		{"mongodb://u:p/x@h/", "unescaped / in the password", ErrConnString},
		{"mongodb://u:p@x@h/", "unescaped @ in the credentials", ErrConnString},
		{"mongodb://u:%zz@h/", "invalid percent-encoding in the password", ErrConnString},
		{"mongodb://%zz:p@h/", "invalid percent-encoding in the username", ErrConnString},
		{"mongodb://h?x=1", "must have a / before the query ?", ErrConnString},
		{"mongodb://h/?maxPoolSize=-1", `invalid value for "maxPoolSize"`, ErrConnString},
		{"mongodb://h/?maxPoolSize=99999999999", "maxPoolSize=99999999999 is too large", ErrConnString},
		{"mongodb://h/?maxIdleTimeMS=9223372036854775807", "maxIdleTimeMS=9223372036854775807 is too large", ErrConnString},
		{"mongodb://h/?waitQueueTimeoutMS=-5", `waitQueueTimeoutMS="-5" must be a whole number of milliseconds`, ErrConnString},
		{"mongodb://h/?waitQueueTimeoutMS=abc", `waitQueueTimeoutMS="abc"`, ErrConnString},
		{"mongodb://h/?maxPoolSise=5", `unknown option "maxPoolSise"; did you mean "maxPoolSize"?`, ErrConnString},
		{"mongodb://h/?foo=1&Bar=2", `unknown option "Bar" (and 1 more unknown options)`, ErrConnString},
		{"mongodb://h/?compressors=lz4", `compressors: "lz4" is not supported; use any of snappy, zlib, zstd`, ErrConnString},
		{"mongodb://h/?tls=maybe", `invalid value for "tls"`, ErrConnString},
		{"mongodb://h/?authMechanism=BOGUS", "invalid auth mechanism", ErrConnString},
		{"mongodb://h/?authMechanism=PLAIN", "username required for PLAIN", ErrConnString},
		{"mongodb://u@h/?authMechanism=SCRAM-SHA-256", "password required for SCRAM-SHA-256", ErrConnString},
		{"mongodb://a,b/?directConnection=true", "multiple hosts", ErrConnString},
		{"mongodb://a,b/?loadBalanced=true", "loadBalanced", ErrConnString},
		{"mongodb://h/?appName=x%zz", `the value of option "appName" is not valid percent-encoding`, ErrConnString},
		{"mongodb://h/?" + strings.Repeat("a", maxConnStringLen), "longer than", ErrConnString},
	}
	for _, c := range cases {
		_, err := ParseConnString(c.in)
		if err == nil {
			t.Errorf("%q: no error", c.in)
			continue
		}
		if !errors.Is(err, c.cat) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v; want %v containing %q", c.in, err, c.cat, c.want)
		}
	}
}

// No error may quote a password or secret option, whatever is wrong with
// the string around it.
func TestParseConnStringErrorsHideSecrets(t *testing.T) {
	const secret = "Hunter2Zz"
	inputs := []string{
		"mongodb://u:" + secret + "@h:0/",
		"mongodb://u:" + secret + "%zz@h/",
		"mongodb://u:" + secret + "@@h/",
		"mongodb://u:" + secret + "@h/?authMechanism=MONGODB-X509",
		"mongodb://u:" + secret + "@h/?authMechanism=BOGUS",
		"mongodb://u:" + secret + "/x@h/",
		"mongodb://u:" + secret + ":x@h/",
		"mongodb://u:pa@" + secret + ":123@h/",
		"mongodb://u:" + secret + "/h",
		"mongodb://u:a:" + secret + "/h",
		"mongodb://h/?tlsCertificateKeyFilePassword=" + secret + "%zz",
		"mongodb://h/?authMechanismProperties=AWS_SESSION_TOKEN:" + secret + "%zz",
		"mongodb://h/?authMechanism=MONGODB-AWS&authMechanismProperties=AWS_SESSION_TOKEN:" + secret,
		"mongodb+srv://u:" + secret + "@cluster/",
		"mongodb://" + secret + "@h/?authMechanism=PLAIN",
	}
	for _, in := range inputs {
		_, err := ParseConnString(in)
		if err == nil {
			t.Errorf("%q: no error", in)
			continue
		}
		if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), strings.ToLower(secret)) {
			t.Errorf("%q: secret in error: %v", in, err)
		}
	}
}
