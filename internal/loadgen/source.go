// Source addresses: a TCP connection is named by its four-tuple, so one
// client address can hold at most one connection per ephemeral port to a
// given server address (about 28,000 with Linux's default
// ip_local_port_range). To open 100,000 connections to one loopback port
// the load tool spreads them over several source addresses: every address
// of 127.0.0.0/8 is local on Linux without configuration.

package loadgen

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// DefaultSourceAddrs is the load tool's default spread: eight loopback
// addresses, room for over 200,000 connections to one port.
const DefaultSourceAddrs = "127.0.0.1-127.0.0.8"

// maxSourceAddrs bounds a source range, so a typo cannot ask for millions.
const maxSourceAddrs = 256

// ParseSourceAddrs parses a list of source addresses: "" (none: the kernel
// picks), comma-separated addresses, or ranges FIRST-LAST of one family
// ("127.0.0.1-127.0.0.8"), or a mix. At most maxSourceAddrs in all.
func ParseSourceAddrs(s string) ([]netip.Addr, error) {
	var out []netip.Addr
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		first, last, isRange := strings.Cut(part, "-")
		a, err := netip.ParseAddr(strings.TrimSpace(first))
		if err != nil {
			return nil, fmt.Errorf("%w: source address %q: %v", ErrInvalidConfig, part, err)
		}
		b := a
		if isRange {
			if b, err = netip.ParseAddr(strings.TrimSpace(last)); err != nil {
				return nil, fmt.Errorf("%w: source address %q: %v", ErrInvalidConfig, part, err)
			}
			if a.BitLen() != b.BitLen() || b.Less(a) {
				return nil, fmt.Errorf("%w: source range %q: the last address must follow the first, in one family", ErrInvalidConfig, part)
			}
		}
		for x := a; ; x = x.Next() {
			if len(out) == maxSourceAddrs {
				return nil, fmt.Errorf("%w: more than %d source addresses in %q", ErrInvalidConfig, maxSourceAddrs, s)
			}
			out = append(out, x)
			if x == b {
				break
			}
		}
	}
	return out, nil
}

// sourceAddr is the local address for the i-th connection to target, or
// nil to let the kernel choose: source addresses apply only when the
// target is a loopback IP address and the source is loopback too (a
// loopback source cannot reach another host), and never across families.
func sourceAddr(srcs []netip.Addr, target string, i int) *net.TCPAddr {
	if len(srcs) == 0 {
		return nil
	}
	host, _, err := net.SplitHostPort(target)
	if err != nil {
		return nil
	}
	t, err := netip.ParseAddr(host)
	if err != nil || !t.IsLoopback() {
		return nil
	}
	s := srcs[i%len(srcs)]
	if !s.IsLoopback() || s.Unmap().Is4() != t.Unmap().Is4() {
		return nil
	}
	return net.TCPAddrFromAddrPort(netip.AddrPortFrom(s, 0))
}

// dialerFor is a net.Dialer with the i-th connection's source address.
func dialerFor(srcs []netip.Addr, target string, i int) *net.Dialer {
	d := &net.Dialer{}
	if a := sourceAddr(srcs, target, i); a != nil {
		d.LocalAddr = a
	}
	return d
}
