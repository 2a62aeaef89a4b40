// Package srv is the DNS side of mongodb+srv:// connection strings: the
// initial seedlist discovery (SRV and TXT lookups, validation of what they
// return, srvMaxHosts) of initial-dns-seedlist-discovery.md, and the periodic
// rescan of a mongos list of polling-srv-records-for-mongos-discovery.md.
//
// It imports nothing internal: the caller hands it the SRV host name and the
// srvServiceName and srvMaxHosts options it parsed, and gets back
// "host:port" strings and the TXT record's options to merge under its own.
// All DNS goes through the Resolver seam, which *net.Resolver satisfies, so
// tests point a resolver at a loopback DNS server.
package srv

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
)

// Resolver is the DNS the package needs; *net.Resolver satisfies it.
// LookupTXT must return one string per TXT record, the record's character
// strings concatenated, as net.Resolver does.
type Resolver interface {
	LookupSRV(ctx context.Context, service, proto, name string) (cname string, addrs []*net.SRV, err error)
	LookupTXT(ctx context.Context, name string) ([]string, error)
}

// DefaultServiceName is srvServiceName's default.
const DefaultServiceName = "mongodb"

// Errors, one per kind of failure, for errors.Is. Every error the package
// returns wraps exactly one of them (ErrLookup also wraps the resolver's
// error, so a *net.DNSError stays reachable with errors.As).
var (
	// ErrInvalidHost marks an SRV host name or srvServiceName that cannot be
	// queried; it is reported before any DNS traffic.
	ErrInvalidHost = errors.New("srv: invalid host name")
	// ErrLookup marks a DNS failure (timeout, SERVFAIL, refused, ...). A
	// name with no records is ErrNoRecords for SRV and no options for TXT.
	ErrLookup = errors.New("srv: DNS lookup failed")
	// ErrNoRecords marks an SRV query that returned no records.
	ErrNoRecords = errors.New("srv: no SRV records found")
	// ErrInvalidTarget marks an SRV record whose target is not under the
	// host's parent domain (or is not a usable host:port); the spec forbids
	// connecting to any host of such an answer.
	ErrInvalidTarget = errors.New("srv: SRV target not allowed")
	// ErrMultipleTXT marks a host name with more than one TXT record.
	ErrMultipleTXT = errors.New("srv: more than one TXT record")
	// ErrTXTOption marks a TXT record with an option other than authSource,
	// replicaSet and loadBalanced, or one that is malformed.
	ErrTXTOption = errors.New("srv: invalid TXT record option")
	// ErrOptionConflict marks options that cannot go together once the DNS
	// answer is known: srvMaxHosts with replicaSet or loadBalanced=true, or
	// loadBalanced=true with more than one host.
	ErrOptionConflict = errors.New("srv: conflicting options")
)

// Options are the connection string options that shape the lookup.
type Options struct {
	// ServiceName is srvServiceName; "" means DefaultServiceName.
	ServiceName string
	// MaxHosts is srvMaxHosts: 0 keeps every host, n > 0 a random n of
	// them. Negative values are an error.
	MaxHosts int
}

// Result is what the DNS said about an SRV host name.
type Result struct {
	// Hosts are the seedlist, "host:port" with the host lower-cased and
	// without its trailing dot, sorted, at most MaxHosts of them.
	Hosts []string
	// TXT are the default options of the host's TXT record; the caller's
	// own connection string options override them.
	TXT TXTOptions
}

// Resolve performs the initial seedlist discovery for host, the host name
// of a mongodb+srv:// connection string (without port). It queries the SRV
// records of _{ServiceName}._tcp.{host} and the TXT record of {host}, both
// as absolute names so the resolver's search list never changes which
// domain is asked, and validates the answers as the spec requires. Its only
// deadline is ctx's.
//
// TTLs: *net.Resolver does not expose them, so Result carries none and the
// Poller rescans at a fixed interval (the spec's 60 seconds when TTLs are
// unknown).
func Resolve(ctx context.Context, r Resolver, host string, o Options) (Result, error) {
	q, err := newQuery(host, o)
	if err != nil {
		return Result{}, err
	}
	hosts, rejected, err := q.lookupSRV(ctx, r)
	if err != nil {
		return Result{}, err
	}
	if len(rejected) > 0 {
		return Result{}, errors.Join(rejected...)
	}
	txt, err := q.lookupTXT(ctx, r)
	if err != nil {
		return Result{}, err
	}
	if o.MaxHosts > 0 && txt.ReplicaSet != "" {
		return Result{}, fmt.Errorf("%w: srvMaxHosts=%d with replicaSet=%q from the TXT record of %s",
			ErrOptionConflict, o.MaxHosts, txt.ReplicaSet, q.host)
	}
	if txt.LoadBalanced != nil && *txt.LoadBalanced {
		if o.MaxHosts > 0 {
			return Result{}, fmt.Errorf("%w: srvMaxHosts=%d with loadBalanced=true from the TXT record of %s",
				ErrOptionConflict, o.MaxHosts, q.host)
		}
		if len(hosts) > 1 {
			return Result{}, fmt.Errorf("%w: loadBalanced=true from the TXT record of %s, but its SRV records name %d hosts",
				ErrOptionConflict, q.host, len(hosts))
		}
	}
	return Result{Hosts: pick(hosts, o.MaxHosts), TXT: txt}, nil
}

// query is a validated host name with the names derived from it.
type query struct {
	host    string // lower-case, no trailing dot
	service string
	suffix  string // "." + the parent domain every target must end with
}

// newQuery checks what can be checked before asking DNS.
func newQuery(host string, o Options) (query, error) {
	if o.MaxHosts < 0 {
		return query{}, fmt.Errorf("%w: srvMaxHosts must not be negative, got %d", ErrOptionConflict, o.MaxHosts)
	}
	service := o.ServiceName
	if service == "" {
		service = DefaultServiceName
	}
	if err := checkServiceName(service); err != nil {
		return query{}, err
	}
	h := strings.ToLower(strings.TrimSuffix(host, "."))
	if err := checkHostName(h); err != nil {
		return query{}, err
	}
	// Three or more labels: the parent domain is all but the first label.
	// One or two: the parent domain is the host name itself, and the suffix
	// rule then also demands one more level than the host name has.
	domain := h
	if strings.Count(h, ".") >= 2 {
		domain = h[strings.IndexByte(h, '.')+1:]
	}
	return query{host: h, service: service, suffix: "." + domain}, nil
}

// checkHostName accepts DNS host names: 1-63 byte labels of letters,
// digits, '-' and '_' (SRV names in the wild use '_'), 253 bytes at most.
// Anything else (a port, a second host, a path) is a caller's parse error
// that must not reach DNS.
func checkHostName(h string) error {
	if h == "" {
		return fmt.Errorf("%w: empty", ErrInvalidHost)
	}
	if len(h) > 253 {
		return fmt.Errorf("%w: %d bytes, more than DNS's 253", ErrInvalidHost, len(h))
	}
	for label := range strings.SplitSeq(h, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("%w: %q has an empty label or one longer than 63 bytes", ErrInvalidHost, h)
		}
		for i := 0; i < len(label); i++ {
			if !isHostByte(label[i]) {
				return fmt.Errorf("%w: %q contains %q; give one host name without port", ErrInvalidHost, h, label[i])
			}
		}
	}
	return nil
}

func isHostByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

// checkServiceName applies RFC 6335's service name syntax (letters, digits
// and single inner hyphens, at least one letter) with the spec's exception
// for the length: up to 62 bytes, so that "_" + name fits a DNS label.
func checkServiceName(s string) error {
	bad := func(why string) error {
		return fmt.Errorf("%w: srvServiceName %q %s", ErrInvalidHost, s, why)
	}
	if s == "" || len(s) > 62 {
		return bad("must have 1 to 62 bytes")
	}
	if s[0] == '-' || s[len(s)-1] == '-' || strings.Contains(s, "--") {
		return bad("must not begin or end with '-' or contain \"--\"")
	}
	letter := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			letter = true
		case c >= '0' && c <= '9' || c == '-':
		default:
			return bad("may hold only letters, digits and '-'")
		}
	}
	if !letter {
		return bad("needs at least one letter")
	}
	return nil
}

// lookupSRV asks for the SRV records and splits them into valid targets
// (deduplicated "host:port") and one ErrInvalidTarget error per rejected
// record. A failed query or one without records is an error.
func (q query) lookupSRV(ctx context.Context, r Resolver) (hosts []string, rejected []error, err error) {
	_, addrs, err := r.LookupSRV(ctx, q.service, "tcp", q.host+".")
	name := "_" + q.service + "._tcp." + q.host
	if err != nil {
		if dnsErr, ok := errors.AsType[*net.DNSError](err); ok && dnsErr.IsNotFound {
			return nil, nil, fmt.Errorf("%w for %s: %w", ErrNoRecords, name, err)
		}
		return nil, nil, fmt.Errorf("%w: SRV %s: %w", ErrLookup, name, err)
	}
	if len(addrs) == 0 {
		return nil, nil, fmt.Errorf("%w for %s", ErrNoRecords, name)
	}
	for _, a := range addrs {
		if a == nil {
			continue
		}
		hp, err := q.target(a)
		if err != nil {
			rejected = append(rejected, err)
			continue
		}
		if !slices.Contains(hosts, hp) {
			hosts = append(hosts, hp)
		}
	}
	if len(hosts) == 0 && len(rejected) == 0 {
		return nil, nil, fmt.Errorf("%w for %s", ErrNoRecords, name)
	}
	slices.Sort(hosts)
	return hosts, rejected, nil
}

// target validates one SRV record against the parent domain rule and
// returns it as "host:port". Priority and weight are ignored, as the spec
// says.
func (q query) target(a *net.SRV) (string, error) {
	t := strings.ToLower(strings.TrimSuffix(a.Target, "."))
	if !strings.HasSuffix(t, q.suffix) || len(t) == len(q.suffix) {
		return "", fmt.Errorf("%w: %s is not in %s's parent domain %s", ErrInvalidTarget, t, q.host, q.suffix[1:])
	}
	if err := checkHostName(t); err != nil {
		return "", fmt.Errorf("%w: %v", ErrInvalidTarget, err) // not %w: a target is not the caller's host
	}
	if a.Port == 0 {
		return "", fmt.Errorf("%w: %s has port 0", ErrInvalidTarget, t)
	}
	return net.JoinHostPort(t, strconv.Itoa(int(a.Port))), nil
}

// lookupTXT reads the host's TXT record, if it has one.
func (q query) lookupTXT(ctx context.Context, r Resolver) (TXTOptions, error) {
	recs, err := r.LookupTXT(ctx, q.host+".")
	if err != nil {
		if dnsErr, ok := errors.AsType[*net.DNSError](err); ok && dnsErr.IsNotFound {
			return TXTOptions{}, nil
		}
		return TXTOptions{}, fmt.Errorf("%w: TXT %s: %w", ErrLookup, q.host, err)
	}
	switch len(recs) {
	case 0:
		return TXTOptions{}, nil
	case 1:
		o, err := ParseTXT(recs[0])
		if err != nil {
			return TXTOptions{}, fmt.Errorf("%w (TXT record of %s)", err, q.host)
		}
		return o, nil
	default:
		return TXTOptions{}, fmt.Errorf("%w: %s has %d; put all options in one record", ErrMultipleTXT, q.host, len(recs))
	}
}

// pick returns limit hosts chosen at random (all of them when limit is 0 or at
// least len(hosts)), sorted. The spec asks for a Fisher-Yates shuffle, which
// is what rand.Shuffle is.
func pick(hosts []string, limit int) []string {
	if limit == 0 || limit >= len(hosts) {
		return hosts
	}
	c := slices.Clone(hosts)
	rand.Shuffle(len(c), func(i, j int) { c[i], c[j] = c[j], c[i] })
	c = c[:limit]
	slices.Sort(c)
	return c
}
