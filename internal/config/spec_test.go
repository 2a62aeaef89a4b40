// The runners of the official connection-string and URI-options suites.
// They read the JSON files from ../shared/specs at run time (the suites'
// licence forbids copying them here) and check every case: valid or not,
// warning or not, the hosts, the credentials and the options.

package config

import (
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/testutil/specdir"
)

// specRejected are the spec cases mongobouncer refuses on purpose although
// the spec calls them valid, by file/description. Each names the option
// the error must name, and why. Nothing else is skipped.
var specRejected = map[string]struct{ option, why string }{
	// Unknown options: the spec ignores them with a warning; a pooler
	// refuses them, since a misspelt option (maxPoolSise=5) would
	// otherwise be silently ignored and change how it runs.
	"valid-warnings/Unrecognized option keys are ignored":  {"foo", "unknown option refused, not ignored: a misspelling must not pass silently"},
	"valid-warnings/Unsupported option values are ignored": {"fsync", "fsync is no option of the URI-options spec; refused as unknown"},
	// Settings mongobouncer could be expected to apply to its upstreams
	// but does not (useUnapplied): refused unless inert.
	"compression-options/Valid compression options are parsed correctly":           {"zlibCompressionLevel", "mongobouncer compresses at the library's default level; only -1 is accepted"},
	"connection-options/Valid connection and timeout options are parsed correctly": {"socketTimeoutMS", "no upstream socket timeout or operation timeout of mongobouncer's own; only 0 is accepted"},
	// SOCKS5 proxies: mongobouncer dials its upstreams itself.
	"proxy-options/only host present":                             {"proxyHost", "no SOCKS5 proxy support: refused, not silently bypassed"},
	"proxy-options/host and default port present":                 {"proxyHost", "no SOCKS5 proxy support"},
	"proxy-options/host and non-default port present":             {"proxyHost", "no SOCKS5 proxy support"},
	"proxy-options/replicaset, host and non-default port present": {"proxyHost", "no SOCKS5 proxy support"},
	"proxy-options/all options present":                           {"proxyHost", "no SOCKS5 proxy support"},
}

// specCase is one case of either suite.
type specCase struct {
	Description string         `json:"description"`
	URI         string         `json:"uri"`
	Valid       bool           `json:"valid"`
	Warning     bool           `json:"warning"`
	Hosts       []specHost     `json:"hosts"`
	Auth        *specAuth      `json:"auth"`
	Options     map[string]any `json:"options"`
}

type specHost struct {
	Type string `json:"type"`
	Host string `json:"host"`
	Port *int   `json:"port"`
}

type specAuth struct {
	Username *string `json:"username"`
	Password *string `json:"password"`
	DB       *string `json:"db"`
}

func TestConnStringSpec(t *testing.T) { runURISuite(t, "connection-string", 98) }

func TestURIOptionsSpec(t *testing.T) { runURISuite(t, "uri-options", 159) }

// runURISuite runs every case of one suite and checks the number of cases,
// so that a suite that shrinks or fails to load cannot pass unnoticed.
func runURISuite(t *testing.T, suite string, want int) {
	dir := specdir.Dir(t, suite)
	files := specdir.Files(t, dir, "*.json")
	var ran, rejected int
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Tests []specCase `json:"tests"`
		}
		if err := json.Unmarshal(data, &doc); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		// Named like the other runners' subtests: the file without .json.
		name := strings.TrimSuffix(filepath.Base(file), ".json")
		t.Run(name, func(t *testing.T) {
			// tls-options names ca.pem and cert.pem relative to the
			// suite; nothing here opens them, but the path stays
			// meaningful.
			for _, c := range doc.Tests {
				ran++
				key := name + "/" + c.Description
				if r, ok := specRejected[key]; ok {
					rejected++
					t.Run(c.Description, func(t *testing.T) {
						_, err := ParseConnString(c.URI)
						if err == nil || !strings.Contains(err.Error(), r.option) {
							t.Fatalf("expected a rejection naming %s (%s), got %v", r.option, r.why, err)
						}
					})
					continue
				}
				t.Run(c.Description, func(t *testing.T) { checkSpecCase(t, c) })
			}
		})
	}
	if ran != want {
		t.Errorf("%s: ran %d cases, the suite has %d", suite, ran, want)
	}
	t.Logf("%s: %d cases, %d refused on purpose (see specRejected)", suite, ran, rejected)
}

func checkSpecCase(t *testing.T, c specCase) {
	cs, err := ParseConnString(c.URI)
	if !c.Valid {
		if err == nil {
			t.Fatalf("%s: parsed, want an error (warnings %q)", c.URI, cs.Warnings)
		}
		return
	}
	if err != nil {
		t.Fatalf("%s: %v", c.URI, err)
	}
	if got := len(cs.Warnings) > 0; got != c.Warning {
		t.Errorf("warning = %v (%q), want %v", got, cs.Warnings, c.Warning)
	}
	if c.Hosts != nil {
		checkSpecHosts(t, cs, c.Hosts)
	}
	if c.Auth != nil {
		for _, f := range []struct {
			what string
			want *string
			got  string
		}{{"username", c.Auth.Username, cs.Username}, {"password", c.Auth.Password, cs.Password}, {"db", c.Auth.DB, cs.Database}} {
			if f.want != nil && *f.want != f.got {
				t.Errorf("%s = %q, want %q", f.what, f.got, *f.want)
			}
		}
	}
	if c.Options != nil {
		checkSpecOptions(t, cs, c.URI, c.Options, c.Warning)
	}
}

func checkSpecHosts(t *testing.T, cs ConnString, want []specHost) {
	if len(cs.Hosts) != len(want) {
		t.Fatalf("hosts %v, want %d", cs.Hosts, len(want))
	}
	for i, w := range want {
		h := cs.Hosts[i]
		typ, host, port := "unix", h.Address, 0
		if h.Network == NetworkTCP {
			var p string
			var err error
			if host, p, err = net.SplitHostPort(h.Address); err != nil {
				t.Fatalf("host %d: %v", i, err)
			}
			port, _ = strconv.Atoi(p)
			switch ip := net.ParseIP(host); {
			case ip == nil:
				typ = "hostname"
			case strings.Contains(host, ":"):
				typ = "ip_literal"
			default:
				typ = "ipv4"
			}
		}
		if typ != w.Type || host != w.Host {
			t.Errorf("host %d = %s %q, want %s %q", i, typ, host, w.Type, w.Host)
		}
		if w.Port != nil && port != *w.Port {
			t.Errorf("host %d port = %d, want %d", i, port, *w.Port)
		}
		if w.Port == nil && typ != "unix" && port != DefaultPort {
			t.Errorf("host %d port = %d, want the default %d", i, port, DefaultPort)
		}
	}
}

// checkSpecOptions compares the expected options (names compared
// case-insensitively) with what the ConnString holds. In a case that warns,
// the options of the string the case leaves out are the ones warned about:
// they must have been ignored. (Other cases may list only some options.)
func checkSpecOptions(t *testing.T, cs ConnString, uri string, want map[string]any, warned bool) {
	expected := map[string]any{}
	for k, v := range want {
		expected[strings.ToLower(k)] = v
	}
	for k, w := range expected {
		// An option at its default counts as unset, so only the value is
		// compared here.
		if got, _ := specOption(cs, k); !sameOption(got, w) {
			t.Errorf("option %s = %#v, want %#v", k, got, w)
		}
	}
	if !warned {
		return
	}
	_, query, _ := strings.Cut(uri, "?")
	for pair := range strings.SplitSeq(query, "&") {
		k, _, _ := strings.Cut(pair, "=")
		k, _ = url.QueryUnescape(k)
		k = strings.ToLower(k)
		if _, listed := expected[k]; listed || k == "" {
			continue
		}
		if got, set := specOption(cs, k); set {
			t.Errorf("option %s = %#v, want it ignored", k, got)
		}
	}
}

// specOption returns the value of an option as the suites write it, from
// the ConnString field mongobouncer keeps it in, and whether it is set.
// Options with no field are looked up in AppOptions.
func specOption(cs ConnString, k string) (any, bool) {
	str := func(s string) (any, bool) { return s, s != "" }
	flag := func(b bool) (any, bool) { return b, b }
	count := func(n *int) (any, bool) {
		if n == nil {
			return nil, false
		}
		return float64(*n), true
	}
	dur := func(d *time.Duration, unit time.Duration) (any, bool) {
		if d == nil {
			return nil, false
		}
		return float64(*d / unit), true
	}
	switch k {
	case "appname":
		return str(cs.AppName)
	case "authmechanism":
		return str(cs.AuthMechanism)
	case "authmechanismproperties":
		if cs.AuthMechanismProperties == nil {
			return nil, false
		}
		m := map[string]any{}
		for k, v := range cs.AuthMechanismProperties {
			m[k] = v
		}
		return m, true
	case "authsource":
		return str(cs.AuthSource)
	case "compressors":
		var l []any
		for _, c := range cs.Compressors {
			l = append(l, c)
		}
		return l, l != nil
	case "connecttimeoutms":
		return dur(cs.ConnectTimeout, time.Millisecond)
	case "directconnection":
		return flag(cs.DirectConnection)
	case "heartbeatfrequencyms":
		return dur(cs.HeartbeatInterval, time.Millisecond)
	case "loadbalanced":
		return flag(cs.LoadBalanced)
	case "localthresholdms":
		return dur(cs.LocalThreshold, time.Millisecond)
	case "maxidletimems":
		return dur(cs.MaxIdleTime, time.Millisecond)
	case "maxpoolsize":
		return count(cs.MaxPoolSize)
	case "minpoolsize":
		return count(cs.MinPoolSize)
	case "maxconnecting":
		return count(cs.MaxConnecting)
	case "maxstalenessseconds":
		if cs.MaxStaleness != nil && *cs.MaxStaleness == 0 {
			return float64(-1), true
		}
		return dur(cs.MaxStaleness, time.Second)
	case "readpreference":
		return str(string(cs.ReadPreference))
	case "readpreferencetags":
		if cs.ReadPreferenceTags == nil {
			return nil, false
		}
		var l []any
		for _, set := range cs.ReadPreferenceTags {
			m := map[string]any{}
			for k, v := range set {
				m[k] = v
			}
			l = append(l, m)
		}
		return l, true
	case "servermonitoringmode":
		return str(cs.ServerMonitoringMode)
	case "replicaset":
		return str(cs.ReplicaSet)
	case "serverselectiontimeoutms":
		return dur(cs.ServerSelectionTimeout, time.Millisecond)
	case "srvmaxhosts":
		return float64(cs.SRVMaxHosts), cs.SRVMaxHosts != 0
	case "srvservicename":
		return cs.SRVServiceName, cs.SRVServiceName != "mongodb"
	case "tls", "ssl":
		return cs.TLS, true
	case "tlscafile":
		return str(cs.TLSCAFile)
	case "tlscertificatekeyfile":
		return str(cs.TLSCertificateKeyFile)
	case "tlscertificatekeyfilepassword":
		return str(cs.TLSCertificateKeyFilePassword)
	case "tlsinsecure":
		return flag(cs.TLSInsecure)
	case "tlsallowinvalidcertificates":
		return flag(cs.TLSAllowInvalidCertificates)
	case "tlsallowinvalidhostnames":
		return flag(cs.TLSAllowInvalidHostnames)
	case "tlsdisableocspendpointcheck":
		return flag(cs.TLSDisableOCSPEndpointCheck)
	case "tlsdisablecertificaterevocationcheck":
		return flag(cs.TLSDisableCertificateRevocationCheck)
	case "waitqueuetimeoutms":
		return dur(cs.WaitQueueTimeout, time.Millisecond)
	}
	v, ok := cs.AppOptions[k]
	return v, ok
}

// sameOption compares a value from specOption with one from the JSON.
// AppOptions hold text, so JSON numbers and booleans compare as text.
func sameOption(got, want any) bool {
	if s, ok := got.(string); ok {
		switch w := want.(type) {
		case float64:
			return s == strconv.FormatFloat(w, 'f', -1, 64)
		case bool:
			return s == strconv.FormatBool(w)
		}
	}
	if g, ok := got.(float64); ok {
		w, ok := want.(float64)
		return ok && math.Abs(g-w) < 0.5
	}
	return reflect.DeepEqual(got, want) || fmt.Sprint(got) == fmt.Sprint(want) && reflect.TypeOf(got) == reflect.TypeOf(want)
}
