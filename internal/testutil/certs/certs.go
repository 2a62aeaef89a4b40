// Package certs makes throwaway certificates for tests: a CA, server
// certificates for the loopback names, client certificates, and PEM files
// of them (private keys plain, PKCS#8-encrypted or legacy-encrypted) in a
// test's temporary directory.
package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/youmark/pkcs8"
)

// Cert is a certificate with its key.
type Cert struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	DER  []byte
}

// CertPEM is the certificate in PEM.
func (c *Cert) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.DER})
}

// KeyPEM is the private key in unencrypted PKCS#8 PEM.
func (c *Cert) KeyPEM(t testing.TB) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(c.Key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// EncryptedKeyPEM is the private key in PKCS#8 PEM encrypted with password
// (PBES2, AES-256-CBC).
func (c *Cert) EncryptedKeyPEM(t testing.TB, password string) []byte {
	t.Helper()
	der, err := pkcs8.MarshalPrivateKey(c.Key, []byte(password), nil)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "ENCRYPTED PRIVATE KEY", Bytes: der})
}

// LegacyEncryptedKeyPEM is the private key as an RFC 1423 encrypted "EC
// PRIVATE KEY" block (what openssl wrote before PKCS#8 became its default).
func (c *Cert) LegacyEncryptedKeyPEM(t testing.TB, password string) []byte {
	t.Helper()
	der, err := x509.MarshalECPrivateKey(c.Key)
	if err != nil {
		t.Fatal(err)
	}
	b, err := x509.EncryptPEMBlock(rand.Reader, "EC PRIVATE KEY", der, []byte(password), x509.PEMCipherAES256)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(b)
}

// TLS is the certificate as crypto/tls uses it.
func (c *Cert) TLS() tls.Certificate {
	return tls.Certificate{Certificate: [][]byte{c.DER}, PrivateKey: c.Key, Leaf: c.Cert}
}

// NewCA makes a self-signed CA.
func NewCA(t testing.TB, name string) *Cert {
	t.Helper()
	return issue(t, nil, &x509.Certificate{
		Subject:               pkix.Name{CommonName: name, Organization: []string{"mongobouncer tests"}},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	})
}

// Server issues a server certificate for hosts (DNS names or IP
// addresses).
func (ca *Cert) Server(t testing.TB, hosts ...string) *Cert {
	t.Helper()
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: hosts[0]},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return issue(t, ca, tmpl)
}

// Client issues a client certificate with subject.
func (ca *Cert) Client(t testing.TB, subject pkix.Name) *Cert {
	t.Helper()
	return issue(t, ca, &x509.Certificate{
		Subject:     subject,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

// Pool is a pool holding the CA.
func (ca *Cert) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

func issue(t testing.TB, parent *Cert, tmpl *x509.Certificate) *Cert {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	signer, signerKey := tmpl, key
	if parent != nil {
		signer, signerKey = parent.Cert, parent.Key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &Cert{Cert: cert, Key: key, DER: der}
}

// Write writes data to name in dir and returns the path.
func Write(t testing.TB, dir, name string, data ...[]byte) string {
	t.Helper()
	var all []byte
	for _, d := range data {
		all = append(all, d...)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, all, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
