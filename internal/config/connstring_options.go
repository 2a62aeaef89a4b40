// This file reads the options of a connection string (the part after ?)
// by the connection-string and URI-options specs: each value is checked
// against the type the spec gives its option, a value that does not fit is
// ignored with a warning, a repeated option keeps its last value with a
// warning, and deprecated spellings are honoured with a warning. Options a
// pooler cannot honour and names nobody defines are errors, because a
// silently ignored misspelling would change what mongobouncer does.

package config

import (
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// optKind is the value type the URI-options spec gives an option.
type optKind int

const (
	kindString optKind = iota
	kindBool
	kindInt      // an integer from min to max
	kindMillis   // a non-negative integer of milliseconds
	kindEnum     // one of enum, compared case-insensitively
	kindTags     // comma-separated key:value pairs, repeatable: a list
	kindKeyPairs // comma-separated key:value pairs (authMechanismProperties)
)

// optUse says what mongobouncer does with an option.
type optUse int

const (
	// useKept options are read into ConnString fields.
	useKept optUse = iota
	// useApp options only matter inside the application that sends them;
	// they are accepted so a string can be copied from an application, and
	// kept in ConnString.AppOptions only.
	useApp
	// useRefused options name a feature mongobouncer does not have; a
	// string that sets them is refused, since ignoring them would connect
	// in a way the user did not ask for.
	useRefused
	// useUnapplied options set something mongobouncer could be expected
	// to do to its upstreams but does not (a socket timeout, a compression
	// level): their inert value, which asks for what mongobouncer does
	// anyway, is accepted and kept in ConnString.AppOptions, any other
	// valid value refused. A value the spec ignores with a warning is
	// ignored with one, as for every option.
	useUnapplied
)

// optSpec describes one option.
type optSpec struct {
	name     string // as the spec spells it
	kind     optKind
	use      optUse
	min, max int64    // for kindInt
	enum     []string // for kindEnum
	// alias is, for a deprecated or legacy spelling, the option it stands
	// for (lowercase); "" for a standard name.
	alias string
	// why explains a refused option.
	why string
	// inert is, for a useUnapplied option, the value that asks for
	// nothing mongobouncer does not do ("" when every value does).
	inert string
	// strict makes a value of the wrong type an error instead of a
	// warning: ignoring tls=ture would connect without TLS.
	strict bool
}

const maxInt64 = int64(^uint64(0) >> 1)

// uriOptions are the options mongobouncer knows, by lowercase name.
var uriOptions = func() map[string]optSpec {
	m := map[string]optSpec{}
	add := func(s optSpec) { m[strings.ToLower(s.name)] = s }
	nonNeg := func(name string, use optUse) optSpec {
		return optSpec{name: name, kind: kindInt, use: use, min: 0, max: maxInt64}
	}
	// Options mongobouncer reads.
	add(optSpec{name: "appName", kind: kindString})
	add(optSpec{name: "authMechanism", kind: kindString})
	add(optSpec{name: "authMechanismProperties", kind: kindKeyPairs})
	add(optSpec{name: "authSource", kind: kindString})
	add(optSpec{name: "compressors", kind: kindString})
	add(optSpec{name: "connectTimeoutMS", kind: kindMillis})
	add(optSpec{name: "directConnection", kind: kindBool})
	add(optSpec{name: "heartbeatFrequencyMS", kind: kindMillis})
	add(optSpec{name: "loadBalanced", kind: kindBool})
	add(optSpec{name: "localThresholdMS", kind: kindMillis})
	add(optSpec{name: "maxIdleTimeMS", kind: kindMillis})
	add(optSpec{name: "maxPoolSize", kind: kindInt, min: 0, max: 1<<31 - 1})
	add(optSpec{name: "minPoolSize", kind: kindInt, min: 0, max: 1<<31 - 1})
	add(optSpec{name: "maxConnecting", kind: kindInt, min: 1, max: 1<<31 - 1})
	add(optSpec{name: "maxStalenessSeconds", kind: kindInt, min: -1, max: int64(maxDuration / time.Second)})
	add(optSpec{name: "readPreference", kind: kindEnum, enum: readPreferenceModes})
	add(optSpec{name: "readPreferenceTags", kind: kindTags})
	add(optSpec{name: "replicaSet", kind: kindString})
	add(optSpec{name: "serverSelectionTimeoutMS", kind: kindMillis})
	add(optSpec{name: "srvMaxHosts", kind: kindInt, min: 0, max: 1<<31 - 1})
	add(optSpec{name: "srvServiceName", kind: kindString})
	add(optSpec{name: "tls", kind: kindBool, strict: true})
	add(optSpec{name: "ssl", kind: kindBool, alias: "tls", strict: true})
	add(optSpec{name: "tlsCAFile", kind: kindString})
	add(optSpec{name: "tlsCertificateKeyFile", kind: kindString})
	add(optSpec{name: "tlsCertificateKeyFilePassword", kind: kindString})
	add(optSpec{name: "tlsInsecure", kind: kindBool})
	add(optSpec{name: "tlsAllowInvalidCertificates", kind: kindBool})
	add(optSpec{name: "tlsAllowInvalidHostnames", kind: kindBool})
	// Go's crypto/tls checks neither OCSP responders nor revocation
	// lists, so these change nothing; they are kept so that the
	// conflicts the spec defines with tlsInsecure are still found.
	add(optSpec{name: "tlsDisableCertificateRevocationCheck", kind: kindBool})
	add(optSpec{name: "tlsDisableOCSPEndpointCheck", kind: kindBool})
	// Not a standard option, but every CMAP pool has the setting.
	add(optSpec{name: "waitQueueTimeoutMS", kind: kindMillis})
	// Legacy spellings the Go driver has always accepted.
	add(optSpec{name: "heartbeatIntervalMS", kind: kindMillis, alias: "heartbeatfrequencyms"})
	add(optSpec{name: "sslInsecure", kind: kindBool, alias: "tlsinsecure"})
	add(optSpec{name: "sslCertificateAuthorityFile", kind: kindString, alias: "tlscafile"})
	add(optSpec{name: "sslClientCertificateKeyFile", kind: kindString, alias: "tlscertificatekeyfile"})
	add(optSpec{name: "sslClientCertificateKeyPassword", kind: kindString, alias: "tlscertificatekeyfilepassword"})

	// serverMonitoringMode chooses how mongobouncer's own monitors check
	// the route's servers (ConnString.ServerMonitoringMode).
	add(optSpec{name: "serverMonitoringMode", kind: kindEnum, enum: []string{"stream", "poll", "auto"}})

	// Options of the application only.
	add(optSpec{name: "journal", kind: kindBool, use: useApp})
	add(optSpec{name: "readConcernLevel", kind: kindString, use: useApp})
	add(optSpec{name: "retryReads", kind: kindBool, use: useApp})
	add(optSpec{name: "retryWrites", kind: kindBool, use: useApp})
	add(optSpec{name: "serverSelectionTryOnce", kind: kindBool, use: useApp})
	add(optSpec{name: "w", kind: kindString, use: useApp})
	add(nonNeg("wTimeoutMS", useApp))
	add(optSpec{name: "wtimeout", kind: kindInt, use: useApp, min: 0, max: maxInt64, alias: "wtimeoutms"})

	// Options mongobouncer could be expected to apply to its upstreams
	// but does not: only their inert values are accepted.
	add(optSpec{name: "socketTimeoutMS", kind: kindInt, use: useUnapplied, min: 0, max: maxInt64, inert: "0",
		why: "mongobouncer sets no timeout on upstream reads and writes (a client's own socketTimeoutMS applies between it and mongobouncer); remove it or set 0"})
	add(optSpec{name: "timeoutMS", kind: kindInt, use: useUnapplied, min: 0, max: maxInt64, inert: "0",
		why: "mongobouncer applies no operation timeout of its own (a client's own timeoutMS travels in its commands as maxTimeMS); remove it or set 0"})
	add(optSpec{name: "zlibCompressionLevel", kind: kindInt, use: useUnapplied, min: -1, max: 9, inert: "-1",
		why: "mongobouncer compresses with zlib at the library's default level; remove it or set -1"})
	add(optSpec{name: "zstdCompressionLevel", kind: kindInt, use: useUnapplied, min: -1, max: 22,
		why: "mongobouncer compresses with zstd at the library's default level; remove it"})
	add(nonNeg("maxAdaptiveRetries", useApp))
	add(optSpec{name: "enableOverloadRetargeting", kind: kindBool, use: useApp})
	add(optSpec{name: "uuidRepresentation", kind: kindString, use: useApp})
	add(optSpec{name: "waitQueueMultiple", kind: kindString, use: useApp})

	// Options of features mongobouncer does not have.
	const proxy = "mongobouncer does not connect through a SOCKS5 proxy; run it where it can reach the servers"
	for _, n := range []string{"proxyHost", "proxyPort", "proxyUsername", "proxyPassword"} {
		add(optSpec{name: n, kind: kindString, use: useRefused, why: proxy})
	}
	return m
}()

// isInert reports whether clean, a valid value of a useUnapplied option,
// is the one that asks for nothing mongobouncer does not do.
func isInert(spec optSpec, clean string) bool {
	if spec.inert == "" {
		return false
	}
	n, err := strconv.ParseInt(clean, 10, 64)
	want, _ := strconv.ParseInt(spec.inert, 10, 64)
	return err == nil && n == want
}

// maxDuration is the largest time.Duration.
const maxDuration = time.Duration(1<<63 - 1)

// rawOption is one key=value pair as written.
type rawOption struct {
	key, value string // percent-decoded; key as written
	lower      string // canonical lowercase name (the alias target for an alias)
	spec       optSpec
}

// parsedOptions are the options of one connection string after the checks:
// the last valid value of each, by canonical lowercase name, and the list
// of readPreferenceTags.
type parsedOptions struct {
	values   map[string]string
	tags     []map[string]string
	tagsSet  bool
	warnings []string
}

// parseOptions reads the query of a connection string (without the ?).
// Problems a driver would only warn about become warnings and drop the
// value; unknown and refused options are errors. No message quotes the
// value of a secret option.
func parseOptions(query string) (parsedOptions, error) {
	po := parsedOptions{values: map[string]string{}}
	if query == "" {
		return po, nil
	}
	var unknown []string
	seen := map[string]string{} // canonical name -> spelling last seen
	for _, pair := range strings.FieldsFunc(query, func(r rune) bool { return r == '&' || r == ';' }) {
		k, v, ok := strings.Cut(pair, "=")
		if !ok || k == "" {
			return po, connStringError(ErrConnString, "option %q has no value: write key=value", truncateOpt(k))
		}
		key, err := url.QueryUnescape(k)
		if err != nil {
			return po, connStringError(ErrConnString, "an option name is not valid percent-encoding")
		}
		lower := strings.ToLower(key)
		spec, known := uriOptions[lower]
		if !known {
			unknown = append(unknown, key)
			continue
		}
		value, err := url.QueryUnescape(v)
		if err != nil {
			return po, connStringError(ErrConnString, "the value of option %q is not valid percent-encoding: write %% as %%25", key)
		}
		if spec.use == useRefused {
			return po, connStringError(ErrConnString, "option %s is not supported: %s", key, spec.why)
		}
		canon := lower
		if spec.alias != "" {
			canon = spec.alias
		}
		secret := slices.Contains(secretOptions, lower) || slices.Contains(secretOptions, canon)
		clean, problem := checkOptionValue(spec, value)
		if problem != "" && spec.strict {
			return po, connStringError(ErrConnString, "%s=%q: %s", key, truncateOpt(value), problem)
		}
		if problem != "" {
			shown := fmt.Sprintf("%s=%q", key, truncateOpt(value))
			if secret {
				shown = key
			}
			po.warnings = append(po.warnings, fmt.Sprintf("%s ignored: %s", shown, problem))
			continue
		}
		if spec.use == useUnapplied && !isInert(spec, clean) {
			return po, connStringError(ErrConnString, "option %s=%s is not supported: %s", key, truncateOpt(clean), spec.why)
		}
		if spec.kind == kindTags {
			po.tags = append(po.tags, parseTags(clean))
			po.tagsSet = true
			continue
		}
		if prev, dup := seen[canon]; dup {
			prevAlias := uriOptions[strings.ToLower(prev)].alias != ""
			switch {
			case canon == "tls" && po.values[canon] != clean:
				// Keeping the last of two disagreeing values could
				// turn TLS off behind a warning.
				return po, connStringError(ErrConnString, "%s=%s and %s=%s disagree; give one of them", prev, po.values[canon], key, clean)
			case canon == "tls" && !strings.EqualFold(prev, key):
				// tls and ssl are one option under two names: both may
				// be given when they agree.
			case spec.alias != "" && !prevAlias:
				po.warnings = append(po.warnings, fmt.Sprintf("deprecated option %s ignored: %s is given as well", key, prev))
				continue
			case spec.alias == "" && prevAlias:
				po.warnings = append(po.warnings, fmt.Sprintf("deprecated option %s ignored: %s is given as well", prev, key))
			default:
				po.warnings = append(po.warnings, fmt.Sprintf("option %s is given more than once; the last value is used", key))
			}
		} else if spec.alias != "" && canon != "tls" {
			po.warnings = append(po.warnings, fmt.Sprintf("option %s is deprecated: write %s", key, uriOptions[canon].name))
		}
		seen[canon] = key
		po.values[canon] = clean
	}
	if len(unknown) > 0 {
		msg := fmt.Sprintf("unknown option %q", unknown[0])
		if s := suggest(unknown[0], knownOptions); s != "" {
			msg += fmt.Sprintf("; did you mean %q?", s)
		}
		if len(unknown) > 1 {
			msg += fmt.Sprintf(" (and %d more unknown options)", len(unknown)-1)
		}
		return po, connStringError(ErrConnString, "%s", msg)
	}
	return po, nil
}

// checkOptionValue checks a value against its option's type. It returns
// the value to keep (an enum in the spec's spelling) or why it is ignored.
func checkOptionValue(spec optSpec, v string) (string, string) {
	switch spec.kind {
	case kindBool:
		switch v {
		case "true", "false":
			return v, ""
		case "":
			return "", "empty value"
		}
		return "", "must be true or false"
	case kindInt, kindMillis:
		if v == "" {
			return "", "empty value"
		}
		n, err := strconv.ParseInt(v, 10, 64)
		lo, hi := spec.min, spec.max
		if spec.kind == kindMillis {
			lo, hi = 0, int64(maxDuration/time.Millisecond)
		}
		if err != nil || n < lo || n > hi {
			if hi == maxInt64 || spec.kind == kindMillis {
				return "", fmt.Sprintf("must be a whole number, %d or more", lo)
			}
			return "", fmt.Sprintf("must be a whole number from %d to %d", lo, hi)
		}
		return strconv.FormatInt(n, 10), ""
	case kindEnum:
		for _, e := range spec.enum {
			if strings.EqualFold(e, v) {
				return e, ""
			}
		}
		return "", "must be one of " + strings.Join(spec.enum, ", ")
	case kindTags:
		if v == "" {
			return "", "" // an empty tag set matches any server
		}
		if !validPairs(v) {
			return "", "must be comma-separated key:value pairs, as in dc:east,rack:1"
		}
	case kindKeyPairs:
		if !validPairs(v) {
			return "", "must be comma-separated KEY:value pairs (a value cannot contain a comma)"
		}
	}
	return v, ""
}

// validPairs reports whether v is comma-separated key:value pairs with
// non-empty keys. The value is everything after the first colon, so it may
// contain colons itself (TOKEN_RESOURCE:mongodb://host).
func validPairs(v string) bool {
	for item := range strings.SplitSeq(v, ",") {
		k, _, ok := strings.Cut(item, ":")
		if !ok || k == "" {
			return false
		}
	}
	return true
}

// parseTags turns a checked readPreferenceTags value into a tag set.
func parseTags(v string) map[string]string {
	tags := map[string]string{}
	if v == "" {
		return tags
	}
	for item := range strings.SplitSeq(v, ",") {
		k, val, _ := strings.Cut(item, ":")
		tags[k] = val
	}
	return tags
}

// truncateOpt shortens an option name or value quoted in a message.
func truncateOpt(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// tlsConflicts checks the pairs of TLS options the URI-options spec forbids
// together, whatever their values: tlsInsecure already means both
// tlsAllowInvalid* options, and revocation options make no sense next to
// an option that skips the certificate checks they belong to. (The Go
// driver's parser checks the pairs with tlsInsecure but knows nothing of
// tlsAllowInvalid*.)
func tlsConflicts(v map[string]string) error {
	pairs := [][2]string{
		{"tlsInsecure", "tlsAllowInvalidCertificates"},
		{"tlsInsecure", "tlsAllowInvalidHostnames"},
		{"tlsAllowInvalidCertificates", "tlsDisableOCSPEndpointCheck"},
		{"tlsAllowInvalidCertificates", "tlsDisableCertificateRevocationCheck"},
	}
	for _, p := range pairs {
		_, a := v[strings.ToLower(p[0])]
		_, b := v[strings.ToLower(p[1])]
		if a && b {
			return connStringError(ErrConnString, "%s and %s cannot be given together; keep one", p[0], p[1])
		}
	}
	return nil
}
