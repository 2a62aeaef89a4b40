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
		Database: "admin", AuthSource: "admin", AuthSourceSet: true, AuthMechanism: "SCRAM-SHA-256", ReplicaSet: "rs0",
		TLS: true, TLSCAFile: "/ca.pem", TLSCertificateKeyFile: "/key.pem", TLSCertificateKeyFilePassword: "kp",
		Compressors: []string{"zstd", "snappy"}, AppName: "app",
		MaxPoolSize: new(50), MinPoolSize: new(5), MaxIdleTime: new(time.Minute), MaxConnecting: new(3),
		WaitQueueTimeout: new(1500 * time.Millisecond), ConnectTimeout: new(2 * time.Second),
		HeartbeatInterval: new(15 * time.Second), ServerSelectionTimeout: new(9 * time.Second),
		ReadPreference: ReadSecondary,
		AppOptions:     map[string]string{"w": "majority", "uuidrepresentation": "standard"},
		redacted:       cs.redacted,
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
		{"mongodb+srv://a.example.net,b.example.net/", "mongodb+srv:// takes exactly one host", ErrConnString},
		{"mongodb+srv://a.example.net:27017/", "without a port", ErrConnString},
		{"mongodb+srv://a.example.net/?directConnection=true", "directConnection=true cannot be used with mongodb+srv://", ErrConnString},
		{"mongodb+srv://a.example.net/?srvMaxHosts=2&replicaSet=rs", "srvMaxHosts cannot be used with replicaSet", ErrConnString},
		{"mongodb+srv://a.example.net/?srvServiceName=a_b", "srvServiceName=", ErrConnString},
		{"mongodb://h/?srvMaxHosts=1", "srvMaxHosts is only for mongodb+srv://", ErrConnString},
		{"mongodb://h/?srvServiceName=x", "srvServiceName is only for mongodb+srv://", ErrConnString},
		{"mongodb://", "no host", ErrConnString},
		{"mongodb:///db", "no host", ErrConnString},
		{"mongodb://h:0/", "host 1 of 1: the port must be a number from 1 to 65535", ErrConnString},
		{"mongodb://a,h:65536/", "host 2 of 2: the port must be", ErrConnString},
		{"mongodb://a,,b/", "host 2 of 3 is empty", ErrConnString},
		{"mongodb://::1/", "host 1 of 1 is not host or host:port", ErrConnString},
		{"mongodb://[::1/", "", ErrConnString},
		{"mongodb://h%zz/", "host 1 of 1 is not valid percent-encoding", ErrConnString},
		{"mongodb://h/?proxyHost=p&proxyPort=1", "option proxyHost is not supported", ErrConnString},
		{"mongodb://h/?socketTimeoutMS=7500", "option socketTimeoutMS=7500 is not supported: mongobouncer sets no timeout on upstream", ErrConnString},
		{"mongodb://h/?timeoutMS=100", "option timeoutMS=100 is not supported", ErrConnString},
		{"mongodb://h/?compressors=zlib&zlibCompressionLevel=9", "option zlibCompressionLevel=9 is not supported", ErrConnString},
		{"mongodb://h/?zstdCompressionLevel=-1", "option zstdCompressionLevel=-1 is not supported", ErrConnString},
		{"mongodb://h/?tlsInsecure=false&tlsAllowInvalidHostnames=true", "tlsInsecure and tlsAllowInvalidHostnames cannot be given together", ErrConnString},
		{"mongodb://h/?w", `option "w" has no value`, ErrConnString},
		{"mongodb://h/?tls=true&ssl=false", "tls=true and ssl=false disagree", ErrConnString},
		{"mongodb://h/?tls=true&tls=false", "tls=true and tls=false disagree", ErrConnString},
		{"mongodb://h/?readPreference=primary&readPreferenceTags=dc:a", "readPreferenceTags cannot be used with readPreference=primary", ErrConnString},
		{"mongodb://h/?readPreference=primary&maxStalenessSeconds=120", "maxStalenessSeconds cannot be used with readPreference=primary", ErrConnString},
		{"mongodb://h/?readPreference=nearest&maxStalenessSeconds=30", "maxStalenessSeconds=30: must be -1 (no maximum) or at least 90", ErrConnString},
		{"mongodb://h/a$b", "database names cannot contain", ErrConnString},
		{"mongodb://u:p:q@h/", "unescaped : in the password", ErrConnString},
		{"mongodb://u/x:p@h/", "unescaped / in the username", ErrConnString},
		{"mongodb://u:p/x@h/", "unescaped / in the password", ErrConnString},
		{"mongodb://u:p@x@h/", "unescaped @ in the credentials", ErrConnString},
		{"mongodb://u:%zz@h/", "invalid percent-encoding in the password", ErrConnString},
		{"mongodb://%zz:p@h/", "invalid percent-encoding in the username", ErrConnString},
		{"mongodb://h?x=1", `unknown option "x"`, ErrConnString},
		{"mongodb://h/?maxPoolSise=5", `unknown option "maxPoolSise"; did you mean "maxPoolSize"?`, ErrConnString},
		{"mongodb://h/?foo=1&Bar=2", `unknown option "foo" (and 1 more unknown options)`, ErrConnString},
		{"mongodb://h/?compressors=lz4", `compressors: "lz4" is not supported; use any of snappy, zlib, zstd`, ErrConnString},
		{"mongodb://h/?tls=maybe", `tls="maybe": must be true or false`, ErrConnString},
		{"mongodb://h/?authMechanism=BOGUS", "invalid auth mechanism", ErrConnString},
		{"mongodb://h/?authMechanism=PLAIN", "username required for PLAIN", ErrConnString},
		{"mongodb://u@h/?authMechanism=SCRAM-SHA-256", "password required for SCRAM-SHA-256", ErrConnString},
		{"mongodb://a,b/?directConnection=true", "directConnection=true needs exactly one host", ErrConnString},
		{"mongodb://h/?directConnection=true&loadBalanced=true", "loadBalanced", ErrConnString},
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
		"mongodb+srv://u:" + secret + "@cluster:1/",
		"mongodb://u:" + secret + "@h/?proxyPassword=" + secret,
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

// Values of the wrong type are ignored with a warning, as the spec says,
// and the warnings never quote a secret.
func TestParseConnStringWarnings(t *testing.T) {
	cases := []struct {
		in, want string
		check    func(ConnString) bool
	}{
		{"mongodb://h/?maxPoolSize=-1", `maxPoolSize="-1" ignored`, func(c ConnString) bool { return c.MaxPoolSize == nil }},
		{"mongodb://h/?maxPoolSize=99999999999", `must be a whole number from 0 to 2147483647`, func(c ConnString) bool { return c.MaxPoolSize == nil }},
		{"mongodb://h/?maxIdleTimeMS=9223372036854775807", `maxIdleTimeMS="9223372036854775807" ignored`, func(c ConnString) bool { return c.MaxIdleTime == nil }},
		{"mongodb://h/?waitQueueTimeoutMS=abc&waitQueueTimeoutMS=5", `waitQueueTimeoutMS="abc" ignored`, func(c ConnString) bool { return *c.WaitQueueTimeout == 5*time.Millisecond }},
		{"mongodb://h/?maxConnecting=0", `maxConnecting="0" ignored: must be a whole number from 1`, func(c ConnString) bool { return c.MaxConnecting == nil }},
		{"mongodb://h/?replicaSet=a&replicaSet=b", "replicaSet is given more than once", func(c ConnString) bool { return c.ReplicaSet == "b" }},
		{"mongodb://h/?heartbeatIntervalMS=600", "heartbeatIntervalMS is deprecated: write heartbeatFrequencyMS", func(c ConnString) bool { return *c.HeartbeatInterval == 600*time.Millisecond }},
		{"mongodb://h/?heartbeatFrequencyMS=900&heartbeatIntervalMS=600", "deprecated option heartbeatIntervalMS ignored", func(c ConnString) bool { return *c.HeartbeatInterval == 900*time.Millisecond }},
		{"mongodb://h/?heartbeatIntervalMS=600&heartbeatFrequencyMS=900", "deprecated option heartbeatIntervalMS ignored", func(c ConnString) bool { return *c.HeartbeatInterval == 900*time.Millisecond }},
		{"mongodb://h/?journal=", `journal="" ignored: empty value`, nil},
		{"mongodb://h/?w=-1", "w=-1 ignored", func(c ConnString) bool { return c.AppOptions["w"] == "" }},
		{"mongodb://h/?readPreferenceTags=bad", `readPreferenceTags="bad" ignored`, func(c ConnString) bool { return c.ReadPreferenceTags == nil }},
		{"mongodb://h/?readPreference=NEAREST&localThresholdMS=x", `localThresholdMS="x" ignored`, func(c ConnString) bool { return c.ReadPreference == ReadNearest && c.LocalThreshold == nil }},
		{"mongodb://h/?authMechanismProperties=TOKEN:a%2Cb_Hunter2Zz", "authMechanismProperties ignored", func(c ConnString) bool { return c.AuthMechanismProperties == nil }},
	}
	for _, c := range cases {
		cs, err := ParseConnString(c.in)
		if err != nil {
			t.Errorf("%s: %v", c.in, err)
			continue
		}
		got := strings.Join(cs.Warnings, "\n")
		if !strings.Contains(got, c.want) || strings.Contains(got, "Hunter2Zz") {
			t.Errorf("%s: warnings %q, want one containing %q", c.in, cs.Warnings, c.want)
		}
		if c.check != nil && !c.check(cs) {
			t.Errorf("%s: wrong value kept: %s", c.in, fields(cs))
		}
	}
	if cs, err := ParseConnString("mongodb://h/?tls=true&ssl=true&replicaSet=rs"); err != nil || len(cs.Warnings) != 0 {
		t.Errorf("clean string: %v %q", err, cs.Warnings)
	}
}

func TestParseConnStringSRV(t *testing.T) {
	cs, err := ParseConnString("mongodb+srv://u:pw@Cluster0.Example.net/db?srvServiceName=custom&srvMaxHosts=2&readPreference=secondaryPreferred&readPreferenceTags=dc:east,rack:1&readPreferenceTags=&maxStalenessSeconds=120&localThresholdMS=30")
	if err != nil {
		t.Fatal(err)
	}
	if !cs.SRV || cs.SRVHost != "cluster0.example.net" || cs.SRVServiceName != "custom" || cs.SRVMaxHosts != 2 ||
		len(cs.Hosts) != 0 || !cs.TLS || cs.Scheme != SchemeMongoDBSRV || cs.Password != "pw" || cs.Database != "db" {
		t.Errorf("SRV: %s", fields(cs))
	}
	if cs.ReadPreference != ReadSecondaryPreferred || *cs.MaxStaleness != 120*time.Second || *cs.LocalThreshold != 30*time.Millisecond ||
		!reflect.DeepEqual(cs.ReadPreferenceTags, []map[string]string{{"dc": "east", "rack": "1"}, {}}) {
		t.Errorf("read preference: %s", fields(cs))
	}
	cs, err = ParseConnString("mongodb+srv://c.example.net/?tls=false&maxStalenessSeconds=-1")
	if err != nil || cs.TLS || cs.SRVServiceName != "mongodb" || cs.MaxStaleness == nil || *cs.MaxStaleness != 0 {
		t.Errorf("tls=false: %v %s", err, fields(cs))
	}
}

// Options mongobouncer could be expected to apply but does not are
// accepted at their inert values only, and a value the spec ignores is
// ignored with a warning as usual, never refused.
func TestUnappliedOptionsInertValues(t *testing.T) {
	cs, err := ParseConnString("mongodb://h/?socketTimeoutMS=0&timeoutMS=0&zlibCompressionLevel=-1")
	if err != nil {
		t.Fatal(err)
	}
	if len(cs.Warnings) != 0 || len(cs.AppOptions) != 3 || cs.AppOptions["sockettimeoutms"] != "0" {
		t.Errorf("warnings %q, AppOptions %v", cs.Warnings, cs.AppOptions)
	}
	cs, err = ParseConnString("mongodb://h/?socketTimeoutMS=-5&zlibCompressionLevel=10")
	if err != nil || len(cs.Warnings) != 2 || len(cs.AppOptions) != 0 {
		t.Errorf("invalid values: %v, warnings %q, AppOptions %v", err, cs.Warnings, cs.AppOptions)
	}
}
