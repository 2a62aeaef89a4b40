// The TXT record's option string: the one parser of the package.

package srv

import (
	"fmt"
	"net/url"
	"strings"
)

// TXTOptions are the default connection string options a host's TXT record
// may carry. The spec allows these three only; the caller's own options
// override them.
type TXTOptions struct {
	// AuthSource is authSource; "" when the record does not set it.
	AuthSource string
	// ReplicaSet is replicaSet; "" when the record does not set it. When set,
	// the deployment is a replica set and the caller must not poll SRV.
	ReplicaSet string
	// LoadBalanced is loadBalanced; nil when the record does not set it.
	LoadBalanced *bool
}

// ParseTXT parses a TXT record's text, which has the form of a connection
// string's options ("authSource=admin&replicaSet=rs0"): pairs separated by
// '&', keys case-insensitive, keys and values percent-decoded. An empty
// record sets nothing. Any other option (ssl and tls included: TLS can only
// be turned off in the connection string itself), a pair without '=', an
// empty or undecodable value, a repeated option or a loadBalanced other
// than true or false is an ErrTXTOption error.
func ParseTXT(s string) (TXTOptions, error) {
	var o TXTOptions
	if s == "" {
		return o, nil
	}
	seen := make(map[string]bool, 3)
	for pair := range strings.SplitSeq(s, "&") {
		k, v, ok := strings.Cut(pair, "=")
		if !ok {
			return TXTOptions{}, fmt.Errorf("%w: %q is not key=value", ErrTXTOption, pair)
		}
		key, err := url.QueryUnescape(k)
		if err != nil {
			return TXTOptions{}, fmt.Errorf("%w: key %q: %w", ErrTXTOption, k, err)
		}
		val, err := url.QueryUnescape(v)
		if err != nil {
			return TXTOptions{}, fmt.Errorf("%w: value of %s: %w", ErrTXTOption, key, err)
		}
		lower := strings.ToLower(key)
		if seen[lower] {
			return TXTOptions{}, fmt.Errorf("%w: %s appears twice", ErrTXTOption, key)
		}
		if val == "" {
			return TXTOptions{}, fmt.Errorf("%w: %s has an empty value", ErrTXTOption, key)
		}
		switch lower {
		case "authsource":
			o.AuthSource = val
		case "replicaset":
			o.ReplicaSet = val
		case "loadbalanced":
			var b bool
			switch val {
			case "true":
				b = true
			case "false":
			default:
				return TXTOptions{}, fmt.Errorf("%w: loadBalanced must be true or false, got %q", ErrTXTOption, val)
			}
			o.LoadBalanced = &b
		default:
			return TXTOptions{}, fmt.Errorf("%w: %q; a TXT record may set only authSource, replicaSet and loadBalanced",
				ErrTXTOption, key)
		}
		seen[lower] = true
	}
	return o, nil
}
