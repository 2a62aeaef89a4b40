package app

// TLS configuration from files: towards upstreams (a route's connection
// string: tlsCAFile, tlsCertificateKeyFile and its password, tlsInsecure,
// tlsAllowInvalidCertificates, tlsAllowInvalidHostnames) and for clients
// (the tls_* keys of [mongobouncer]). Files are read when a route or the
// server is built, and again at every reload (see tlsFilesDigest and
// clientTLS), so replaced certificates apply to new connections.

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/youmark/pkcs8"

	"github.com/mongobouncer/mongobouncer/internal/clienttls"
	"github.com/mongobouncer/mongobouncer/internal/config"
)

// maxTLSFileSize bounds a certificate, key or CA file: real ones are a few
// kilobytes (a CA bundle a few hundred); the bound keeps a wrong path (a
// log, a device) from being read into memory.
const maxTLSFileSize = 4 << 20

// ErrKeyPassword is returned (wrapped) when an encrypted private key cannot
// be decrypted with the password given, or is encrypted and no password
// was given. Its messages never quote the password.
var ErrKeyPassword = errors.New("the private key cannot be decrypted with the password given")

// readTLSFile reads one certificate or key file, bounded.
func readTLSFile(what, path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxTLSFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if len(b) > maxTLSFileSize {
		return nil, fmt.Errorf("%s %s: more than %d bytes: is this a certificate file?", what, path, maxTLSFileSize)
	}
	return b, nil
}

// tlsConfig builds the TLS configuration of an upstream connection string
// (cs.TLS set). Without tlsCAFile the system roots verify the servers. The
// dialer sets ServerName (the SNI, and the name checked) per host.
//
// Verification is done by verifyUpstream rather than by crypto/tls, so that
// tlsAllowInvalidHostnames can check the chain without the host name and
// tlsAllowInvalidCertificates the host name without the chain; with
// neither it checks exactly what crypto/tls would.
func tlsConfig(cs config.ConnString) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	var roots *x509.CertPool
	if cs.TLSCAFile != "" {
		var err error
		if roots, err = loadCAFile("tlsCAFile", cs.TLSCAFile); err != nil {
			return nil, err
		}
	}
	if cs.TLSCertificateKeyFile != "" {
		cert, err := loadCertKeyFile(cs.TLSCertificateKeyFile, cs.TLSCertificateKeyFilePassword)
		if err != nil {
			return nil, err
		}
		c.Certificates = []tls.Certificate{cert}
	}
	switch {
	case cs.TLSInsecure || cs.TLSAllowInvalidCertificates && cs.TLSAllowInvalidHostnames:
		c.InsecureSkipVerify = true
	case cs.TLSAllowInvalidCertificates || cs.TLSAllowInvalidHostnames:
		c.InsecureSkipVerify = true // verifyUpstream checks what is still asked for
		chain, host := !cs.TLSAllowInvalidCertificates, !cs.TLSAllowInvalidHostnames
		c.VerifyConnection = func(st tls.ConnectionState) error { return verifyUpstream(st, roots, chain, host) }
	default:
		c.RootCAs = roots // nil: the system roots
	}
	return c, nil
}

// verifyUpstream checks a server's certificate: its chain up to roots (nil:
// the system roots) when chain is set, and that it names st.ServerName when
// host is set. The errors are crypto/x509's, which name the problem.
func verifyUpstream(st tls.ConnectionState, roots *x509.CertPool, chain, host bool) error {
	if len(st.PeerCertificates) == 0 {
		return errors.New("tls: the server sent no certificate")
	}
	leaf := st.PeerCertificates[0]
	if !chain {
		return leaf.VerifyHostname(st.ServerName)
	}
	opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for _, c := range st.PeerCertificates[1:] {
		opts.Intermediates.AddCert(c)
	}
	if host {
		opts.DNSName = st.ServerName
	}
	_, err := leaf.Verify(opts)
	return err
}

// loadCAFile reads a PEM file of CA certificates into a pool.
func loadCAFile(what, path string) (*x509.CertPool, error) {
	b, err := readTLSFile(what, path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s %s: no PEM certificate found", what, path)
	}
	return pool, nil
}

// loadCertKeyFile reads tlsCertificateKeyFile: the certificate (chain) and
// its private key in one PEM file, the key possibly encrypted with
// password.
func loadCertKeyFile(path, password string) (tls.Certificate, error) {
	b, err := readTLSFile("tlsCertificateKeyFile", path)
	if err != nil {
		return tls.Certificate{}, err
	}
	cert, err := certKeyPair(b, b, password)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("tlsCertificateKeyFile %s: %w", path, err)
	}
	return cert, nil
}

// certKeyPair builds a certificate from PEM certificate blocks in certPEM
// and the first private key block in keyPEM. An encrypted key (PKCS#8
// "ENCRYPTED PRIVATE KEY", or legacy RFC 1423 "Proc-Type: 4,ENCRYPTED"
// headers) is decrypted with password first; a plain key with a password
// given is accepted as it is.
func certKeyPair(certPEM, keyPEM []byte, password string) (tls.Certificate, error) {
	var certs []byte
	var key *pem.Block
	for rest := certPEM; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		if b.Type == "CERTIFICATE" {
			certs = append(certs, pem.EncodeToMemory(b)...)
		}
	}
	for rest := keyPEM; key == nil; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		if b.Type == "ENCRYPTED PRIVATE KEY" || b.Type == "PRIVATE KEY" || b.Type == "RSA PRIVATE KEY" || b.Type == "EC PRIVATE KEY" {
			key = b
		}
	}
	if len(certs) == 0 {
		return tls.Certificate{}, errors.New("no PEM certificate found")
	}
	if key == nil {
		return tls.Certificate{}, errors.New("no PEM private key found")
	}
	plain, err := decryptKey(key, password)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.X509KeyPair(certs, plain)
}

// decryptKey returns the PEM encoding of an unencrypted private key.
func decryptKey(b *pem.Block, password string) ([]byte, error) {
	switch {
	case b.Type == "ENCRYPTED PRIVATE KEY":
		if password == "" {
			return nil, fmt.Errorf("%w: the key is encrypted; give tlsCertificateKeyFilePassword", ErrKeyPassword)
		}
		k, _, err := pkcs8.ParsePrivateKey(b.Bytes, []byte(password))
		if err != nil {
			// pkcs8's errors say "incorrect password" or name an
			// unsupported cipher; neither quotes the password.
			return nil, fmt.Errorf("%w (%v)", ErrKeyPassword, err)
		}
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			return nil, err
		}
		return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
	case x509.IsEncryptedPEMBlock(b):
		// Legacy RFC 1423 encryption is deprecated as weak, but some
		// tools still write it; refusing it would only send users to
		// openssl to convert the key.
		if password == "" {
			return nil, fmt.Errorf("%w: the key is encrypted; give tlsCertificateKeyFilePassword", ErrKeyPassword)
		}
		der, err := x509.DecryptPEMBlock(b, []byte(password))
		if err != nil {
			return nil, fmt.Errorf("%w (legacy PEM encryption: %v)", ErrKeyPassword, err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: b.Type, Bytes: der}), nil
	}
	return pem.EncodeToMemory(b), nil
}

// tlsFilesDigest is a digest of the contents of the TLS files a connection
// string names (none: ""). A reload compares it with the running route's,
// so that a certificate replaced under the same path gives the route new
// connections with the new certificate (sameTopology compares only the
// strings). A file that cannot be read gives an error, and the reload then
// fails with it when it builds the route.
func tlsFilesDigest(cs config.ConnString) string {
	if !cs.TLS {
		return ""
	}
	h := sha256.New()
	for _, p := range []string{cs.TLSCAFile, cs.TLSCertificateKeyFile} {
		if p == "" {
			h.Write([]byte{0})
			continue
		}
		b, err := readTLSFile("", p)
		if err != nil {
			return "unreadable: " + err.Error()
		}
		sum := sha256.Sum256(b)
		h.Write(sum[:])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// clientTLS builds the proxy's client TLS settings from the tls_* keys of
// [mongobouncer], reading the files. tls_mode = "disable" gives the zero
// settings (no TLS).
func clientTLS(g config.Global) (clienttls.Settings, error) {
	if !g.TLSMode.Serves() {
		return clienttls.Settings{}, nil
	}
	certPEM, err := readTLSFile("tls_cert_file", g.TLSCertFile)
	if err != nil {
		return clienttls.Settings{}, err
	}
	keyPEM, err := readTLSFile("tls_key_file", g.TLSKeyFile)
	if err != nil {
		return clienttls.Settings{}, err
	}
	cert, err := certKeyPair(certPEM, keyPEM, "")
	if err != nil {
		return clienttls.Settings{}, fmt.Errorf("tls_cert_file %s, tls_key_file %s: %w", g.TLSCertFile, g.TLSKeyFile, err)
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	if g.TLSCAFile != "" {
		if c.ClientCAs, err = loadCAFile("tls_ca_file", g.TLSCAFile); err != nil {
			return clienttls.Settings{}, err
		}
		c.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return clienttls.Settings{Mode: g.TLSMode, Config: c, HandshakeTimeout: g.TLSHandshakeTimeout}, nil
}
