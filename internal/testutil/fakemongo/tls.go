package fakemongo

import (
	"crypto/tls"
	"net"
)

// withTLS wraps ln so that every accepted connection speaks TLS with cfg
// (Options.TLSConfig); a nil cfg leaves ln plain. The handshake happens at
// the connection's first read, on its own goroutine.
func withTLS(ln net.Listener, cfg *tls.Config) net.Listener {
	if cfg == nil {
		return ln
	}
	return tls.NewListener(ln, cfg)
}
