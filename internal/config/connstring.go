package config

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/connstring"

	"github.com/mongobouncer/mongobouncer/internal/sdam"
)

// DefaultPort is the port of a connection-string host that names none.
const DefaultPort = 27017

// Connection-string schemes.
const (
	SchemeMongoDB    = "mongodb"
	SchemeMongoDBSRV = "mongodb+srv"
)

// maxConnStringLen bounds a connection string. Real ones are well under a
// kilobyte even with dozens of hosts; the bound keeps a pasted file or a
// fuzzer from making the parser work on megabytes.
const maxConnStringLen = 16 * 1024

// redactedMark replaces secrets in printed connection strings.
const redactedMark = "xxxxx"

// secretOptions are the connection-string options whose values are secrets
// (lowercase). authMechanismProperties can carry AWS_SESSION_TOKEN.
var secretOptions = []string{
	"authmechanismproperties",
	"sslclientcertificatekeypassword",
	"tlscertificatekeyfilepassword",
	"proxypassword",
}

// supportedCompressors are the wire compressors mongobouncer implements.
var supportedCompressors = []string{"snappy", "zlib", "zstd"}

// Host is one upstream server from a connection string.
type Host struct {
	// Network is NetworkTCP or NetworkUnix.
	Network string
	// Address is host:port for TCP (IPv6 in brackets, DefaultPort when the
	// string names none), or the socket path for unix.
	Address string
}

// String returns the address.
func (h Host) String() string { return h.Address }

// ConnString is a parsed mongodb:// or mongodb+srv:// connection string:
// what mongobouncer needs to reach and authenticate to an upstream
// deployment and to select its servers. Its String, GoString and LogValue
// methods print the redacted form, never the password.
//
// The pointer fields are the settings a connection string may set; nil
// means the string does not set them (see the package documentation for
// how they rank against the configuration's keys). Standard options that
// only matter to the application sending them (w, retryWrites, journal,
// readConcernLevel, ...) are accepted and kept in AppOptions only.
type ConnString struct {
	// Scheme is SchemeMongoDB or SchemeMongoDBSRV.
	Scheme string
	// Hosts are the seed list, in the order given. Empty when SRV is set:
	// the seed list then comes from DNS.
	Hosts []Host
	// SRV is set for a mongodb+srv:// string. SRVHost is then the name
	// whose _<SRVServiceName>._tcp SRV records list the hosts (and whose
	// TXT record may add authSource, replicaSet and loadBalanced). The
	// records are resolved when the route starts and polled while it runs
	// (the initial DNS seedlist discovery and SRV polling specs); config
	// itself does no DNS.
	SRV     bool
	SRVHost string
	// SRVServiceName is srvServiceName: "mongodb" unless the string names
	// another. Only set for SRV strings.
	SRVServiceName string
	// SRVMaxHosts is srvMaxHosts: how many of the SRV hosts to use, 0 for
	// all. Only SRV strings may set it.
	SRVMaxHosts int
	// Username and Password are the percent-decoded credentials; Password
	// is a secret.
	Username string
	Password string
	// Database is the database in the path: the default authentication
	// database.
	Database string
	// AuthSource is the authentication database: authSource, or the
	// default the auth spec gives for the mechanism when credentials are
	// present.
	AuthSource string
	// ServerMonitoringMode is serverMonitoringMode: how mongobouncer's
	// monitors check the servers ("stream", "poll", or "" / "auto": stream
	// where the server supports it).
	ServerMonitoringMode string
	// AuthSourceSet says the string names authSource itself (a
	// mongodb+srv:// TXT record's authSource applies only when it does
	// not).
	AuthSourceSet bool
	// AuthMechanism is authMechanism as given ("" to negotiate).
	AuthMechanism string
	// AuthMechanismProperties are authMechanismProperties; values may be
	// secrets (AWS_SESSION_TOKEN).
	AuthMechanismProperties map[string]string
	// ReplicaSet is replicaSet.
	ReplicaSet string
	// TLS says whether to use TLS (tls or ssl, or implied by a TLS file
	// option).
	TLS bool
	// TLSInsecure is tlsInsecure: skip certificate and host name checks.
	TLSInsecure bool
	// TLSAllowInvalidCertificates is tlsAllowInvalidCertificates: accept
	// a server certificate whatever signed it (expired, self-signed,
	// unknown CA), but still check that it names the host, unless
	// TLSAllowInvalidHostnames is set too. The connection-string spec
	// forbids it next to tlsInsecure.
	TLSAllowInvalidCertificates bool
	// TLSAllowInvalidHostnames is tlsAllowInvalidHostnames: verify the
	// server's certificate chain but not that it names the host dialled.
	TLSAllowInvalidHostnames bool
	// TLSCAFile is tlsCAFile.
	TLSCAFile string
	// TLSCertificateKeyFile is tlsCertificateKeyFile.
	TLSCertificateKeyFile string
	// TLSCertificateKeyFilePassword is tlsCertificateKeyFilePassword, a
	// secret.
	TLSCertificateKeyFilePassword string
	// Compressors are the compressors to offer upstream, in order of
	// preference.
	Compressors []string
	// LoadBalanced is loadBalanced.
	LoadBalanced bool
	// DirectConnection is directConnection: talk to the one host given as
	// a standalone, without discovering the rest of its replica set.
	DirectConnection bool
	// TLSDisableOCSPEndpointCheck and TLSDisableCertificateRevocationCheck
	// are the options of those names. Go's TLS stack checks neither OCSP
	// responders nor revocation lists, so they change nothing yet.
	TLSDisableOCSPEndpointCheck          bool
	TLSDisableCertificateRevocationCheck bool
	// ReadPreference is readPreference in the spec's spelling; "" when
	// not set.
	ReadPreference ReadPreferenceMode
	// ReadPreferenceTags are the readPreferenceTags tag sets in the order
	// given; an empty set matches any server. Nil when not set.
	ReadPreferenceTags []map[string]string
	// Warnings are the problems the connection-string spec says to warn
	// about rather than refuse: a value of the wrong type (ignored), a
	// repeated option (the last one wins), a deprecated spelling. They
	// never quote secrets; the application logs them at startup.
	Warnings []string
	// AppOptions are the options accepted only so that a string can be
	// copied from an application (w, journal, retryWrites, ...; and
	// socketTimeoutMS, timeoutMS and zlibCompressionLevel at their inert
	// values), by lowercase name, with their last valid value.
	// mongobouncer does not act on them; Config.Warnings names them.
	AppOptions map[string]string
	// AppName is appName; "" when not set.
	AppName string

	MaxPoolSize            *int           // maxPoolSize
	MinPoolSize            *int           // minPoolSize
	MaxIdleTime            *time.Duration // maxIdleTimeMS
	MaxConnecting          *int           // maxConnecting
	WaitQueueTimeout       *time.Duration // waitQueueTimeoutMS
	ConnectTimeout         *time.Duration // connectTimeoutMS
	HeartbeatInterval      *time.Duration // heartbeatFrequencyMS
	ServerSelectionTimeout *time.Duration // serverSelectionTimeoutMS
	LocalThreshold         *time.Duration // localThresholdMS
	// MaxStaleness is maxStalenessSeconds; 0 when the string says -1 (no
	// maximum).
	MaxStaleness *time.Duration

	redacted string
}

// Redacted returns the connection string as written with the password and
// secret option values replaced by xxxxx.
func (c ConnString) Redacted() string { return c.redacted }

// HasCredentials reports whether the string logs in: a user name or an
// authMechanism means authentication (a database or authSource alone does
// not).
func (c ConnString) HasCredentials() bool { return c.Username != "" || c.AuthMechanism != "" }

// String returns Redacted.
func (c ConnString) String() string { return c.redacted }

// GoString returns Redacted, quoted, so that %#v prints no secrets.
func (c ConnString) GoString() string { return strconv.Quote(c.redacted) }

// LogValue returns Redacted.
func (c ConnString) LogValue() slog.Value { return slog.StringValue(c.redacted) }

// connStringError builds a connection-string error of the given category.
// Messages never quote the credentials or secret option values.
func connStringError(category error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", category, fmt.Sprintf(format, args...))
}

// ParseConnString parses a mongodb:// or mongodb+srv:// connection string
// by the connection-string and URI-options specs and extracts what
// mongobouncer uses. The official driver's parser then checks the
// authentication options and the conflicts between options, so its rules
// apply too. Errors wrap ErrConnString and never contain the password or
// other secrets.
//
// Hosts default to port 27017; IPv6 hosts go in brackets; a unix socket is
// its percent-encoded path ending in .sock, as in
// mongodb://%2Ftmp%2Fmongodb-27017.sock. Credentials are percent-decoded.
// A mongodb+srv:// string names exactly one host without a port, whose DNS
// records are resolved later (see ConnString.SRV); no DNS lookup is made
// here.
//
// An option value of the wrong type is ignored with a warning
// (ConnString.Warnings), as the spec says. Unknown options are refused,
// since a misspelt maxPoolSize would otherwise be silently ignored, and so
// are options of features mongobouncer lacks (proxyHost, ...), naming the
// option.
func ParseConnString(s string) (ConnString, error) {
	if len(s) > maxConnStringLen {
		return ConnString{}, connStringError(ErrConnString, "longer than %d bytes", maxConnStringLen)
	}
	var rest, scheme string
	switch {
	case strings.HasPrefix(s, SchemeMongoDBSRV+"://"):
		scheme, rest = SchemeMongoDBSRV, s[len(SchemeMongoDBSRV)+3:]
	case strings.HasPrefix(s, SchemeMongoDB+"://"):
		scheme, rest = SchemeMongoDB, s[len(SchemeMongoDB)+3:]
	case s == "":
		return ConnString{}, connStringError(ErrConnString, "empty")
	default:
		return ConnString{}, connStringError(ErrConnString, "must start with mongodb:// or mongodb+srv://")
	}
	srv := scheme == SchemeMongoDBSRV

	// Take the credentials out before the driver sees the string: its
	// errors quote what they reject, and a password must never reach a
	// message. The placeholders keep what the driver's auth checks look at:
	// whether each part is present and empty. The userinfo ends at the
	// first @ before the options, which may contain @ themselves.
	var user, pass, userinfo string
	var hasUser, hasPass bool
	authority := rest
	if q := strings.IndexByte(rest, '?'); q >= 0 {
		authority = rest[:q]
	}
	if i := strings.IndexByte(authority, '@'); i >= 0 {
		rawUser, rawPass, colon := strings.Cut(rest[:i], ":")
		rest = rest[i+1:]
		var err error
		if user, err = decodeUserinfo(rawUser, "username"); err != nil {
			return ConnString{}, err
		}
		hasUser = true
		if colon {
			if strings.Contains(rawPass, ":") {
				return ConnString{}, connStringError(ErrConnString, "unescaped : in the password: percent-encode it as %%3A")
			}
			if pass, err = decodeUserinfo(rawPass, "password"); err != nil {
				return ConnString{}, err
			}
			hasPass = true
		}
		if user != "" {
			userinfo = "u"
		}
		if hasPass {
			userinfo += ":"
			if pass != "" {
				userinfo += "p"
			}
		}
		userinfo += "@"
	}

	// Split hosts, database and options. The spec accepts a string without
	// the / before the options (mongodb://host?tls=true).
	hostList, rawDB, query := rest, "", ""
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		hostList = rest[:i]
		tail := rest[i:]
		if tail[0] == '/' {
			rawDB, query, _ = strings.Cut(tail[1:], "?")
		} else {
			query = tail[1:]
		}
	}
	if err := checkHosts(hostList); err != nil {
		return ConnString{}, err
	}
	db, err := url.QueryUnescape(rawDB)
	if err != nil {
		return ConnString{}, connStringError(ErrConnString, "the database is not valid percent-encoding")
	}
	if strings.ContainsAny(db, "/\\ \"$") {
		return ConnString{}, connStringError(ErrConnString, "database %q: database names cannot contain / \\ space \" or $", db)
	}
	if srv {
		if strings.Contains(hostList, ",") {
			return ConnString{}, connStringError(ErrConnString, "mongodb+srv:// takes exactly one host name, whose SRV records list the servers")
		}
		if h, _ := url.QueryUnescape(hostList); strings.ContainsAny(h, ":/[]") {
			return ConnString{}, connStringError(ErrConnString, "mongodb+srv:// takes a host name without a port (the SRV records give the ports)")
		}
	}

	po, err := parseOptions(query)
	if err != nil {
		return ConnString{}, err
	}
	cs := ConnString{Scheme: scheme, Warnings: po.warnings, redacted: redactURI(s)}
	if err := cs.setOptions(po, srv, strings.Count(hostList, ",")+1); err != nil {
		return ConnString{}, err
	}

	// The driver checks what it knows best: the authentication options and
	// the conflicts between topology, TLS and write-concern options. It
	// gets only those options, already checked, and never the host as an
	// SRV name (it would resolve it).
	var driverQuery []string
	for _, k := range sortedKeys(po.values) {
		if !slices.Contains(driverChecked, k) {
			continue
		}
		driverQuery = append(driverQuery, url.QueryEscape(k)+"="+url.QueryEscape(po.values[k]))
	}
	dcs, err := connstring.ParseAndValidate(SchemeMongoDB + "://" + userinfo + hostList + "/" + rawDB + "?" + strings.Join(driverQuery, "&"))
	if err != nil {
		msg := err.Error()
		for _, prefix := range []string{"error parsing uri: ", "error validating uri: "} {
			msg = strings.TrimPrefix(msg, prefix)
		}
		return ConnString{}, connStringError(ErrConnString, "%s", msg)
	}
	cs.Database = dcs.Database
	cs.AuthSource = dcs.AuthSource
	_, cs.AuthSourceSet = po.values["authsource"]
	cs.AuthMechanism = dcs.AuthMechanism
	cs.AuthMechanismProperties = dcs.AuthMechanismProperties
	cs.TLS = dcs.SSL
	if _, set := po.values["tls"]; srv && !set {
		// SRV implies TLS unless the string says otherwise.
		cs.TLS = true
	}
	if hasUser {
		cs.Username, cs.Password = user, pass
	}
	if srv {
		cs.SRVHost = strings.ToLower(dcs.Hosts[0])
		return cs, nil
	}
	for _, h := range dcs.Hosts {
		host, err := normalizeHost(h)
		if err != nil {
			return ConnString{}, err
		}
		cs.Hosts = append(cs.Hosts, host)
	}
	return cs, nil
}

// driverChecked are the options handed to the driver's parser for its
// checks (lowercase).
var driverChecked = []string{
	"authmechanism", "authmechanismproperties", "authsource", "directconnection", "loadbalanced",
	"replicaset", "tls", "tlscafile", "tlscertificatekeyfile", "tlscertificatekeyfilepassword",
	"tlsinsecure", "tlsdisableocspendpointcheck", "tlsdisablecertificaterevocationcheck", "w", "journal",
}

// setOptions fills the fields of cs from checked options and checks the
// rules between them that the driver does not know or cannot see.
func (cs *ConnString) setOptions(po parsedOptions, srv bool, nhosts int) error {
	v := po.values
	cs.ReplicaSet = v["replicaset"]
	cs.ServerMonitoringMode = v["servermonitoringmode"]
	cs.AppName = v["appname"]
	cs.TLSInsecure = v["tlsinsecure"] == "true"
	cs.TLSAllowInvalidCertificates = v["tlsallowinvalidcertificates"] == "true"
	cs.TLSAllowInvalidHostnames = v["tlsallowinvalidhostnames"] == "true"
	if err := tlsConflicts(v); err != nil {
		return err
	}
	cs.TLSCAFile = v["tlscafile"]
	cs.TLSCertificateKeyFile = v["tlscertificatekeyfile"]
	cs.TLSCertificateKeyFilePassword = v["tlscertificatekeyfilepassword"]
	cs.TLSDisableOCSPEndpointCheck = v["tlsdisableocspendpointcheck"] == "true"
	cs.TLSDisableCertificateRevocationCheck = v["tlsdisablecertificaterevocationcheck"] == "true"
	cs.LoadBalanced = v["loadbalanced"] == "true"
	cs.DirectConnection = v["directconnection"] == "true"
	if c, ok := v["compressors"]; ok {
		for name := range strings.SplitSeq(c, ",") {
			if !slices.Contains(supportedCompressors, name) {
				return connStringError(ErrConnString, "compressors: %q is not supported; use any of %s", name, strings.Join(supportedCompressors, ", "))
			}
			cs.Compressors = append(cs.Compressors, name)
		}
	}
	count := func(name string) *int {
		if s, ok := v[name]; ok {
			n, _ := strconv.Atoi(s) // checked by parseOptions
			return &n
		}
		return nil
	}
	millis := func(name string, unit time.Duration) *time.Duration {
		if s, ok := v[name]; ok {
			n, _ := strconv.ParseInt(s, 10, 64) // checked by parseOptions
			d := time.Duration(n) * unit
			return &d
		}
		return nil
	}
	cs.MaxPoolSize = count("maxpoolsize")
	cs.MinPoolSize = count("minpoolsize")
	cs.MaxConnecting = count("maxconnecting")
	cs.MaxIdleTime = millis("maxidletimems", time.Millisecond)
	cs.WaitQueueTimeout = millis("waitqueuetimeoutms", time.Millisecond)
	cs.ConnectTimeout = millis("connecttimeoutms", time.Millisecond)
	cs.HeartbeatInterval = millis("heartbeatfrequencyms", time.Millisecond)
	cs.ServerSelectionTimeout = millis("serverselectiontimeoutms", time.Millisecond)
	cs.LocalThreshold = millis("localthresholdms", time.Millisecond)
	if s, ok := v["maxstalenessseconds"]; ok {
		n, _ := strconv.ParseInt(s, 10, 64)
		d := max(time.Duration(n)*time.Second, 0)
		if n == 0 || (sdam.ReadPref{Mode: sdam.Nearest, MaxStaleness: d}).Problems(0) != nil {
			return connStringError(ErrConnString, "maxStalenessSeconds=%d: must be -1 (no maximum) or at least 90", n)
		}
		cs.MaxStaleness = &d
	}
	cs.ReadPreference = ReadPreferenceMode(v["readpreference"])
	if po.tagsSet {
		cs.ReadPreferenceTags = po.tags
	}
	// Only an explicit primary is checked here. The max staleness spec
	// also refuses maxStalenessSeconds in a string with no mode at all,
	// but a route's read_preference key may give the mode; the resolved
	// settings are checked together by Validate. sdam decides.
	if cs.ReadPreference == ReadPrimary {
		rp := sdam.ReadPref{Mode: sdam.Primary}
		for _, ts := range cs.ReadPreferenceTags {
			rp.TagSets = append(rp.TagSets, sdam.TagSet(ts))
		}
		if cs.MaxStaleness != nil {
			rp.MaxStaleness = *cs.MaxStaleness
		}
		for _, e := range rp.Problems(0) {
			if e.Field == "tags" {
				return connStringError(ErrConnString, "readPreferenceTags cannot be used with readPreference=primary")
			}
			return connStringError(ErrConnString, "maxStalenessSeconds cannot be used with readPreference=primary")
		}
	}

	_, hasMax := v["srvmaxhosts"]
	_, hasName := v["srvservicename"]
	if !srv {
		if hasMax {
			return connStringError(ErrConnString, "srvMaxHosts is only for mongodb+srv:// strings")
		}
		if hasName {
			return connStringError(ErrConnString, "srvServiceName is only for mongodb+srv:// strings")
		}
	} else {
		cs.SRV = true
		cs.SRVServiceName = "mongodb"
		if hasName {
			cs.SRVServiceName = v["srvservicename"]
			if !validServiceName(cs.SRVServiceName) {
				return connStringError(ErrConnString, "srvServiceName=%q: must be 1 to 62 letters, digits or hyphens", truncateOpt(cs.SRVServiceName))
			}
		}
		cs.SRVMaxHosts = *cmp.Or(count("srvmaxhosts"), new(0))
		if cs.DirectConnection {
			return connStringError(ErrConnString, "directConnection=true cannot be used with mongodb+srv://, which names several servers")
		}
		if cs.SRVMaxHosts > 0 && cs.ReplicaSet != "" {
			return connStringError(ErrConnString, "srvMaxHosts cannot be used with replicaSet: a subset of the hosts cannot be checked against the set")
		}
		if cs.SRVMaxHosts > 0 && cs.LoadBalanced {
			return connStringError(ErrConnString, "srvMaxHosts cannot be used with loadBalanced=true")
		}
	}
	if cs.DirectConnection && nhosts > 1 {
		return connStringError(ErrConnString, "directConnection=true needs exactly one host")
	}
	if w, ok := v["w"]; ok {
		if n, err := strconv.Atoi(w); err == nil && n < 0 {
			// Let the driver not see it: it refuses what the spec ignores.
			delete(v, "w")
			cs.Warnings = append(cs.Warnings, fmt.Sprintf("w=%d ignored: must be 0 or more, or a tag set name", n))
		}
	}
	for k, val := range v {
		if u := uriOptions[k].use; u == useApp || u == useUnapplied {
			if cs.AppOptions == nil {
				cs.AppOptions = map[string]string{}
			}
			cs.AppOptions[k] = val
		}
	}
	return nil
}

// validServiceName reports whether s can be the service name of an SRV
// query: one DNS label (with the leading underscore, at most 63 bytes).
func validServiceName(s string) bool {
	if s == "" || len(s) > 62 {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// knownOptions are the option names suggested for misspelt ones: the
// standard spellings of the options mongobouncer accepts.
var knownOptions = func() []string {
	var names []string
	for _, o := range uriOptions {
		if o.alias == "" && o.use != useRefused {
			names = append(names, o.name)
		}
	}
	slices.Sort(names)
	return names
}()

// decodeUserinfo percent-decodes a username or password, with errors that
// say which part is wrong but never quote it.
func decodeUserinfo(raw, what string) (string, error) {
	if strings.Contains(raw, "/") {
		return "", connStringError(ErrConnString, "unescaped / in the %s: percent-encode it as %%2F", what)
	}
	s, err := url.PathUnescape(raw)
	if err != nil {
		return "", connStringError(ErrConnString, "invalid percent-encoding in the %s: write %% as %%25", what)
	}
	return s, nil
}

// checkHosts checks the host list before the driver does. The driver's
// messages quote a rejected host, and a host list can hold a secret when the
// credentials are malformed (a password with an unescaped @, or a forgotten
// @ that makes user:password look like host:port), so these messages name a
// host by its position only.
func checkHosts(hosts string) error {
	if strings.Contains(hosts, "@") {
		return connStringError(ErrConnString, "unescaped @ in the credentials: percent-encode it as %%40")
	}
	if hosts == "" {
		return connStringError(ErrConnString, "no host: write at least one, as in mongodb://localhost:27017/")
	}
	list := strings.Split(hosts, ",")
	for i, h := range list {
		which := fmt.Sprintf("host %d of %d", i+1, len(list))
		host, err := url.QueryUnescape(h)
		if err != nil {
			return connStringError(ErrConnString, "%s is not valid percent-encoding", which)
		}
		if host == "" {
			return connStringError(ErrConnString, "%s is empty", which)
		}
		if isUnixSocket(host) {
			continue
		}
		_, port, err := net.SplitHostPort(host)
		if err != nil {
			var ae *net.AddrError
			if errors.As(err, &ae) && ae.Err == "missing port in address" {
				continue
			}
			return connStringError(ErrConnString, "%s is not host or host:port (IPv6 hosts go in brackets, as in [::1]:27017; a unix socket is its percent-encoded path ending in .sock)", which)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return connStringError(ErrConnString, "%s: the port must be a number from 1 to 65535", which)
		}
	}
	return nil
}

// isUnixSocket reports whether a decoded host is a unix socket path: it has
// a slash (so mongodb-27017.sock alone is a host name) and ends in .sock.
// A relative path is relative to mongobouncer's working directory.
func isUnixSocket(host string) bool {
	return strings.Contains(host, "/") && strings.HasSuffix(host, ".sock")
}

// normalizeHost turns a host from the driver (already percent-decoded, port
// optional) into a dialable Host.
func normalizeHost(h string) (Host, error) {
	if isUnixSocket(h) {
		if len(h) > maxUnixPath {
			return Host{}, connStringError(ErrConnString, "unix socket path is %d bytes, the limit is %d", len(h), maxUnixPath)
		}
		return Host{Network: NetworkUnix, Address: h}, nil
	}
	host, port, err := net.SplitHostPort(h)
	if err != nil {
		// The driver only lets a missing port through.
		host, port = h, strconv.Itoa(DefaultPort)
		if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
			host = host[1 : len(host)-1]
		}
	}
	if host == "" {
		return Host{}, connStringError(ErrConnString, "host %q has no host name", h)
	}
	if strings.ContainsAny(host, "[]/ \t") {
		return Host{}, connStringError(ErrConnString, "host %q is not a host name, IP address or unix socket path ending in .sock", h)
	}
	if strings.Contains(host, ":") && net.ParseIP(stripZone(host)) == nil {
		return Host{}, connStringError(ErrConnString, "host %q is not an IPv6 address (IPv6 hosts go in brackets, as in [::1]:27017)", h)
	}
	return Host{Network: NetworkTCP, Address: net.JoinHostPort(host, port)}, nil
}

// redactURI masks the password and secret option values in a connection
// string. It works on the text, so it also masks strings that do not parse.
func redactURI(s string) string {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		// Not a URI at all: it could be anything, including a bare
		// password pasted in the wrong place.
		if s == "" {
			return ""
		}
		return redactedMark
	}
	var b strings.Builder
	b.WriteString(scheme)
	b.WriteString("://")
	// Like the driver, the userinfo ends at the first @ anywhere.
	if at := strings.IndexByte(rest, '@'); at >= 0 {
		user, _, hasPass := strings.Cut(rest[:at], ":")
		b.WriteString(user)
		if hasPass {
			b.WriteString(":" + redactedMark)
		}
		b.WriteByte('@')
		rest = rest[at+1:]
	}
	q := strings.IndexByte(rest, '?')
	if q < 0 {
		b.WriteString(rest)
		return b.String()
	}
	b.WriteString(rest[:q+1])
	query := rest[q+1:]
	for query != "" {
		end := strings.IndexAny(query, "&;")
		pair, sep := query, ""
		if end >= 0 {
			pair, sep, query = query[:end], query[end:end+1], query[end+1:]
		} else {
			query = ""
		}
		k, _, hasValue := strings.Cut(pair, "=")
		key, err := url.QueryUnescape(k)
		if err != nil {
			key = k
		}
		if hasValue && slices.Contains(secretOptions, strings.ToLower(key)) {
			pair = k + "=" + redactedMark
		}
		b.WriteString(pair)
		b.WriteString(sep)
	}
	return b.String()
}
