package config

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/connstring"
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
}

// ignoredOptions are options other drivers define that only matter inside
// the client that sends them; they are accepted so a connection string can
// be copied from an application, and ignored (lowercase).
var ignoredOptions = []string{"uuidrepresentation", "waitqueuemultiple"}

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

// ConnString is a parsed mongodb:// connection string: what mongobouncer
// needs to reach and authenticate to an upstream deployment. Its String,
// GoString and LogValue methods print the redacted form, never the
// password.
//
// The pointer fields are the pool options a connection string may set; nil
// means the string does not set them (see the package documentation for
// how they rank against the configuration's keys). Standard options that
// only matter to the client sending them (readPreference, w, retryWrites,
// ...) are accepted and not kept.
type ConnString struct {
	// Scheme is SchemeMongoDB (SchemeMongoDBSRV strings are refused).
	Scheme string
	// Hosts are the seed list, in the order given.
	Hosts []Host
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
	// DirectConnection is directConnection.
	DirectConnection bool
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

	redacted string
}

// Redacted returns the connection string as written with the password and
// secret option values replaced by xxxxx.
func (c ConnString) Redacted() string { return c.redacted }

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

// ParseConnString parses a mongodb:// connection string with the official
// driver's parser (so its validation rules apply) and extracts what
// mongobouncer uses. Errors wrap ErrConnString, or ErrSRVUnsupported for a
// mongodb+srv:// string (no DNS lookup is made), and never contain the
// password or other secrets.
//
// Hosts default to port 27017; IPv6 hosts go in brackets; a unix socket is
// its percent-encoded path ending in .sock, as in
// mongodb://%2Ftmp%2Fmongodb-27017.sock. Credentials are percent-decoded.
// Unknown options are refused, since a misspelt maxPoolSize would otherwise
// be silently ignored.
func ParseConnString(s string) (ConnString, error) {
	if len(s) > maxConnStringLen {
		return ConnString{}, connStringError(ErrConnString, "longer than %d bytes", maxConnStringLen)
	}
	var rest string
	switch {
	case strings.HasPrefix(s, SchemeMongoDBSRV+"://"):
		// Resolving the SRV and TXT records means DNS at load time and
		// re-resolving while running (SRV polling); until that exists, an
		// explicit host list is the honest answer.
		return ConnString{}, fmt.Errorf("%w: list the hosts instead, as in mongodb://host1:27017,host2:27017/?replicaSet=name&tls=true", ErrSRVUnsupported)
	case strings.HasPrefix(s, SchemeMongoDB+"://"):
		rest = s[len(SchemeMongoDB)+3:]
	case s == "":
		return ConnString{}, connStringError(ErrConnString, "empty")
	default:
		return ConnString{}, connStringError(ErrConnString, "must start with mongodb://")
	}

	// Take the credentials out before the driver sees the string: its
	// errors quote what they reject, and a password must never reach a
	// message. The placeholders keep what the driver's auth checks look at:
	// whether each part is present and empty.
	var user, pass, userinfo string
	var hasUser, hasPass bool
	if i := strings.IndexByte(rest, '@'); i >= 0 {
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
	if err := checkOptionEncoding(rest); err != nil {
		return ConnString{}, err
	}
	if err := checkHosts(rest); err != nil {
		return ConnString{}, err
	}

	dcs, err := connstring.ParseAndValidate(SchemeMongoDB + "://" + userinfo + rest)
	if err != nil {
		msg := err.Error()
		for _, prefix := range []string{"error parsing uri: ", "error validating uri: "} {
			msg = strings.TrimPrefix(msg, prefix)
		}
		return ConnString{}, connStringError(ErrConnString, "%s", msg)
	}

	cs := ConnString{
		Scheme:                  SchemeMongoDB,
		Database:                dcs.Database,
		AuthSource:              dcs.AuthSource,
		AuthMechanism:           dcs.AuthMechanism,
		AuthMechanismProperties: dcs.AuthMechanismProperties,
		ReplicaSet:              dcs.ReplicaSet,
		TLS:                     dcs.SSL,
		TLSInsecure:             dcs.SSLInsecure,
		TLSCAFile:               dcs.SSLCaFile,
		TLSCertificateKeyFile:   dcs.SSLClientCertificateKeyFile,
		LoadBalanced:            dcs.LoadBalanced,
		DirectConnection:        dcs.DirectConnection,
		AppName:                 dcs.AppName,
		redacted:                redactURI(s),
	}
	if hasUser {
		cs.Username, cs.Password = user, pass
	}
	if dcs.SSLClientCertificateKeyPasswordSet && dcs.SSLClientCertificateKeyPassword != nil {
		cs.TLSCertificateKeyFilePassword = dcs.SSLClientCertificateKeyPassword()
	}

	for _, h := range dcs.Hosts {
		host, err := normalizeHost(h)
		if err != nil {
			return ConnString{}, err
		}
		cs.Hosts = append(cs.Hosts, host)
	}

	for _, c := range dcs.Compressors {
		if !slices.Contains(supportedCompressors, c) {
			return ConnString{}, connStringError(ErrConnString, "compressors: %q is not supported; use any of %s", c, strings.Join(supportedCompressors, ", "))
		}
	}
	cs.Compressors = dcs.Compressors

	if cs.MaxPoolSize, err = countOption(dcs.MaxPoolSizeSet, dcs.MaxPoolSize, "maxPoolSize"); err != nil {
		return ConnString{}, err
	}
	if cs.MinPoolSize, err = countOption(dcs.MinPoolSizeSet, dcs.MinPoolSize, "minPoolSize"); err != nil {
		return ConnString{}, err
	}
	if cs.MaxConnecting, err = countOption(dcs.MaxConnectingSet, dcs.MaxConnecting, "maxConnecting"); err != nil {
		return ConnString{}, err
	}
	// The driver multiplies milliseconds without checking for overflow, so
	// the durations are read again from the option text.
	durations := []struct {
		name string
		set  bool
		dst  **time.Duration
	}{
		{"maxIdleTimeMS", dcs.MaxConnIdleTimeSet, &cs.MaxIdleTime},
		{"connectTimeoutMS", dcs.ConnectTimeoutSet, &cs.ConnectTimeout},
		{"heartbeatFrequencyMS", dcs.HeartbeatIntervalSet, &cs.HeartbeatInterval},
		{"serverSelectionTimeoutMS", dcs.ServerSelectionTimeoutSet, &cs.ServerSelectionTimeout},
		// Not a driver option: the Go driver leaves it in UnknownOptions.
		{"waitQueueTimeoutMS", true, &cs.WaitQueueTimeout},
	}
	for _, d := range durations {
		if !d.set {
			continue
		}
		if *d.dst, err = millisOption(dcs.Options, d.name); err != nil {
			return ConnString{}, err
		}
	}
	// heartbeatIntervalMS is the driver's legacy spelling of
	// heartbeatFrequencyMS; honour whichever was given.
	if cs.HeartbeatInterval == nil && dcs.HeartbeatIntervalSet {
		if cs.HeartbeatInterval, err = millisOption(dcs.Options, "heartbeatIntervalMS"); err != nil {
			return ConnString{}, err
		}
	}

	var unknown []string
	for k := range dcs.UnknownOptions {
		if k != "waitqueuetimeoutms" && !slices.Contains(ignoredOptions, k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		msg := fmt.Sprintf("unknown option %q", optionAsWritten(rest, unknown[0]))
		if s := suggest(unknown[0], knownOptions); s != "" {
			msg += fmt.Sprintf("; did you mean %q?", s)
		}
		if len(unknown) > 1 {
			msg += fmt.Sprintf(" (and %d more unknown options)", len(unknown)-1)
		}
		return ConnString{}, connStringError(ErrConnString, "%s", msg)
	}
	return cs, nil
}

// optionAsWritten finds how the connection string spells an option the
// driver reports in lowercase, so the message shows what the user typed.
func optionAsWritten(rest, lower string) string {
	if i := strings.IndexByte(rest, '?'); i >= 0 {
		for _, pair := range strings.FieldsFunc(rest[i+1:], func(r rune) bool { return r == '&' || r == ';' }) {
			k, _, _ := strings.Cut(pair, "=")
			if key, err := url.QueryUnescape(k); err == nil && strings.ToLower(key) == lower {
				return key
			}
		}
	}
	return lower
}

// knownOptions are the option names suggested for misspelt ones.
var knownOptions = []string{
	"appName", "authMechanism", "authMechanismProperties", "authSource", "compressors",
	"connectTimeoutMS", "directConnection", "heartbeatFrequencyMS", "loadBalanced",
	"maxConnecting", "maxIdleTimeMS", "maxPoolSize", "minPoolSize", "readPreference",
	"replicaSet", "retryReads", "retryWrites", "serverSelectionTimeoutMS", "socketTimeoutMS",
	"timeoutMS", "tls", "tlsCAFile", "tlsCertificateKeyFile", "tlsCertificateKeyFilePassword",
	"tlsInsecure", "w", "waitQueueTimeoutMS", "zlibCompressionLevel",
}

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

// checkOptionEncoding rejects an option whose name or value is not valid
// percent-encoding before the driver does, because the driver's message
// quotes the value, which may be a secret.
func checkOptionEncoding(rest string) error {
	i := strings.IndexByte(rest, '?')
	if i < 0 {
		return nil
	}
	for _, pair := range strings.FieldsFunc(rest[i+1:], func(r rune) bool { return r == '&' || r == ';' }) {
		k, v, _ := strings.Cut(pair, "=")
		key, err := url.QueryUnescape(k)
		if err != nil {
			return connStringError(ErrConnString, "an option name is not valid percent-encoding")
		}
		if _, err := url.QueryUnescape(v); err != nil {
			return connStringError(ErrConnString, "the value of option %q is not valid percent-encoding: write %% as %%25", key)
		}
	}
	return nil
}

// checkHosts checks the host list before the driver does. The driver's
// messages quote a rejected host, and a host list can hold a secret when the
// credentials are malformed (a password with an unescaped @, or a forgotten
// @ that makes user:password look like host:port), so these messages name a
// host by its position only.
func checkHosts(rest string) error {
	hosts := rest
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		hosts = rest[:i]
	}
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
		if strings.HasSuffix(host, ".sock") {
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

// countOption converts a pool-size option, which the driver has already
// checked is a non-negative integer, refusing values that do not fit.
func countOption(set bool, v uint64, name string) (*int, error) {
	if !set {
		return nil, nil
	}
	if v > math.MaxInt32 {
		return nil, connStringError(ErrConnString, "%s=%d is too large", name, v)
	}
	n := int(v)
	return &n, nil
}

// millisOption reads a milliseconds option (the last one given, as the
// driver does) as a duration, refusing values that overflow.
func millisOption(options map[string][]string, name string) (*time.Duration, error) {
	vals := options[strings.ToLower(name)]
	if len(vals) == 0 {
		return nil, nil
	}
	n, err := strconv.ParseInt(vals[len(vals)-1], 10, 64)
	if err != nil || n < 0 {
		return nil, connStringError(ErrConnString, "%s=%q must be a whole number of milliseconds, 0 or more", name, vals[len(vals)-1])
	}
	if n > int64(math.MaxInt64/time.Millisecond) {
		return nil, connStringError(ErrConnString, "%s=%d is too large", name, n)
	}
	d := time.Duration(n) * time.Millisecond
	return &d, nil
}

// normalizeHost turns a host from the driver (already percent-decoded, port
// optional) into a dialable Host.
func normalizeHost(h string) (Host, error) {
	if strings.HasSuffix(h, ".sock") {
		if !strings.HasPrefix(h, "/") {
			return Host{}, connStringError(ErrConnString, "unix socket %q must be an absolute path", h)
		}
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
