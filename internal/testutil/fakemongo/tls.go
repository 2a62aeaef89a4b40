package fakemongo

// A TLS listener, for tests of TLS clients and of MONGODB-X509 (whose
// authenticate reads the peer certificate). Kept to the listener: the
// certificates and whether to ask for a client's are the test's
// tls.Config.

import (
	"crypto/tls"
	"net"
)

// listenTLS listens on addr, with TLS when cfg is set.
func listenTLS(addr string, cfg *tls.Config) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil || cfg == nil {
		return ln, err
	}
	return tls.NewListener(ln, cfg), nil
}
