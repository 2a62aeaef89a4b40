package auth

// Who is logging in from where: the client connection's addresses, carried
// in the context of a login (WithPeer), which the lookup cache bounds
// lookups by and a user's authenticationRestrictions are checked against;
// and the Observer that counts logins and lookups.

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// Peer is a client connection's addresses as net.Addr.String gives them:
// Remote the client's, Local the address it connected to.
type Peer struct {
	Remote, Local string
}

type peerCtxKey struct{}

// WithPeer returns ctx carrying p, for Authenticator.Start and Cache.Get.
func WithPeer(ctx context.Context, p Peer) context.Context {
	return context.WithValue(ctx, peerCtxKey{}, p)
}

// PeerFrom returns the Peer WithPeer put in ctx.
func PeerFrom(ctx context.Context) (Peer, bool) {
	p, ok := ctx.Value(peerCtxKey{}).(Peer)
	return p, ok
}

// Observer is told of failed logins and of user lookups, e.g. to count
// them (internal/metrics). Its methods are called on login paths and must
// not block.
type Observer interface {
	// AuthFailed is one failed login, by reason (the Fail* constants).
	AuthFailed(reason string)
	// AuthLookup is one lookup asked of the cache's Lookup, or refused
	// a slot, by result (the Lookup* constants).
	AuthLookup(result string)
}

// The reasons of failed logins an Observer is told.
const (
	FailBadProof     = "bad_proof"     // a known user, a wrong password
	FailUnknownUser  = "unknown_user"  // no such user (or not with this mechanism)
	FailRestricted   = "restricted"    // refused by authenticationRestrictions
	FailLookupFailed = "lookup_failed" // the auth_user lookup could not answer
	FailMalformed    = "malformed"     // a malformed SCRAM message
)

// restriction is one authenticationRestrictions document of a user: the
// client's address must be in one of clientSource's ranges and the
// address it connected to in one of serverAddress's, for the fields
// present.
type restriction struct {
	clientSource, serverAddress []netip.Prefix
}

// restrictions are a user's authenticationRestrictions: as mongod, a login
// is allowed when it meets any one document (none: no restriction).
type restrictions []restriction

// allows reports whether a login from p meets rs. An address that is not
// an IP (a Unix socket) meets no range.
func (rs restrictions) allows(p Peer, known bool) bool {
	if len(rs) == 0 {
		return true
	}
	if !known {
		return false
	}
	client, cok := addrIP(p.Remote)
	server, sok := addrIP(p.Local)
	for _, r := range rs {
		if (r.clientSource == nil || cok && inAny(r.clientSource, client)) &&
			(r.serverAddress == nil || sok && inAny(r.serverAddress, server)) {
			return true
		}
	}
	return false
}

// addrIP reads the IP of a "host:port" address, IPv4-mapped IPv6 made
// IPv4 so that it matches IPv4 ranges.
func addrIP(s string) (netip.Addr, bool) {
	host, _, err := net.SplitHostPort(s)
	if err != nil {
		host = s
	}
	if i := strings.IndexByte(host, '%'); i >= 0 {
		host = host[:i] // a zone does not take part in a range
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

func inAny(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// parseRange reads one clientSource or serverAddress entry: a CIDR range
// or a bare IP address (one address).
func parseRange(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%q is not a CIDR range", s)
		}
		bits := p.Bits() - unmapBits(p.Addr())
		if bits < 0 {
			return netip.Prefix{}, fmt.Errorf("%q is not a CIDR range of IPv4 addresses", s)
		}
		return netip.PrefixFrom(p.Addr().Unmap(), bits).Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not an IP address", s)
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// unmapBits is what Unmap takes off a prefix length: 96 for an
// IPv4-mapped IPv6 address.
func unmapBits(a netip.Addr) int {
	if a.Is4In6() {
		return 96
	}
	return 0
}
