package e2e

import (
	"crypto/x509/pkix"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongobouncer/mongobouncer/internal/testutil/certs"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// tlsFiles are the PEM files of a TLS test: the CA, mongobouncer's
// certificate and key (for 127.0.0.1 and localhost), and a client's
// certificate and key in one file (as drivers take it).
type tlsFiles struct {
	dir                      string
	ca, cert, key, clientPEM string
	issuer                   *certs.Cert // the CA, to issue more certificates
}

func newTLSFiles(t *testing.T, dir, prefix string) tlsFiles {
	t.Helper()
	ca := certs.NewCA(t, prefix+" CA")
	srv := ca.Server(t, "127.0.0.1", "localhost")
	cl := ca.Client(t, pkix.Name{CommonName: "app", Organization: []string{"Example"}})
	return tlsFiles{
		dir:       dir,
		issuer:    ca,
		ca:        certs.Write(t, dir, prefix+"-ca.pem", ca.CertPEM()),
		cert:      certs.Write(t, dir, prefix+"-cert.pem", srv.CertPEM()),
		key:       certs.Write(t, dir, prefix+"-key.pem", srv.KeyPEM(t)),
		clientPEM: certs.Write(t, dir, prefix+"-client.pem", cl.CertPEM(), cl.KeyPEM(t)),
	}
}

// tlsTOML is the [mongobouncer] lines serving clients with TLS.
func (f tlsFiles) tlsTOML(mode string, clientCerts bool) string {
	s := fmt.Sprintf("tls_mode = %q\ntls_cert_file = %q\ntls_key_file = %q\n", mode, f.cert, f.key)
	if clientCerts {
		s += fmt.Sprintf("tls_ca_file = %q\n", f.ca)
	}
	return s
}

// tryDriver connects the Go driver with a short server selection timeout
// and pings; it returns the ping's error.
func tryDriver(t *testing.T, addr, extra string) (*mongo.Client, error) {
	t.Helper()
	c, err := mongo.Connect(options.Client().ApplyURI(fmt.Sprintf("mongodb://%s/?serverSelectionTimeoutMS=2000&connectTimeoutMS=2000%s", addr, extra)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Disconnect(ctxT(t, 5*time.Second)) })
	return c, c.Ping(ctxT(t, 5*time.Second), nil)
}

// The Go driver over TLS with a client certificate, on every I/O model;
// without a certificate, or without TLS, it is refused.
func TestDriverOverTLS(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		f := newTLSFiles(t, t.TempDir(), "a")
		a, addr, _ := fileBouncer(t, baseTOML(up.URI(), f.tlsTOML("require", true)))
		waitUsable(t, a, 1)

		c := driver(t, addr, "&tls=true&tlsCAFile="+f.ca+"&tlsCertificateKeyFile="+f.clientPEM)
		coll := c.Database("test").Collection("tls")
		for i := range 20 {
			if _, err := coll.InsertOne(ctxT(t, 10*time.Second), bson.D{{Key: "i", Value: i}}); err != nil {
				t.Fatal(err)
			}
		}
		if n := len(up.Collection("test", "tls")); n != 20 {
			t.Fatalf("upstream holds %d documents, want 20", n)
		}

		if _, err := tryDriver(t, addr, "&tls=true&tlsCAFile="+f.ca); err == nil {
			t.Fatal("a client without a certificate was served although tls_ca_file is set")
		}
		_, err := tryDriver(t, addr, "")
		if err == nil || !strings.Contains(err.Error(), "requires TLS") {
			t.Fatalf("plain client: %v, want the TLS-required error", err)
		}
		if plain, hs := a.Server().TLSRefusals(); plain == 0 || hs == 0 {
			t.Fatalf("refusals counted: plain %d, handshake %d", plain, hs)
		}
	})
}

// allow: a plain and a TLS driver on the same port.
func TestTLSAllowPlainAndTLSOnOnePort(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		f := newTLSFiles(t, t.TempDir(), "a")
		a, addr, _ := fileBouncer(t, baseTOML(up.URI(), f.tlsTOML("allow", false)))
		waitUsable(t, a, 1)
		for _, extra := range []string{"", "&tls=true&tlsCAFile=" + f.ca} {
			if _, err := tryDriver(t, addr, extra); err != nil {
				t.Fatalf("driver %q: %v", extra, err)
			}
		}
	})
}

// A reload reads the certificate files again: after they are replaced by
// a certificate from another CA, new clients must trust that CA, and
// connected clients keep their connections.
func TestTLSReloadNewCertificate(t *testing.T) {
	oneIO(t) // TLS clients only, which the event loop never serves
	up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
	dir := t.TempDir()
	f := newTLSFiles(t, dir, "a")
	a, addr, _ := fileBouncer(t, baseTOML(up.URI(), f.tlsTOML("require", false)))
	waitUsable(t, a, 1)
	old, err := tryDriver(t, addr, "&tls=true&tlsCAFile="+f.ca)
	if err != nil {
		t.Fatal(err)
	}

	g := newTLSFiles(t, dir, "b")
	// Same paths, new contents.
	certs.Write(t, dir, "a-cert.pem", mustRead(t, g.cert))
	certs.Write(t, dir, "a-key.pem", mustRead(t, g.key))
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, err := tryDriver(t, addr, "&tls=true&tlsCAFile="+g.ca); err != nil {
		t.Fatalf("a new client trusting the new CA: %v", err)
	}
	if _, err := tryDriver(t, addr, "&tls=true&tlsCAFile="+f.ca); err == nil {
		t.Fatal("a new client trusting only the old CA was served the old certificate after the reload")
	}
	if err := old.Ping(ctxT(t, 5*time.Second), nil); err != nil {
		t.Fatalf("a client connected before the reload: %v", err)
	}

	// A key file that no longer parses fails the reload; the running
	// certificate stays.
	certs.Write(t, dir, "a-key.pem", []byte("not a key"))
	if err := a.Reload(); err == nil || !strings.Contains(err.Error(), "tls_key_file") {
		t.Fatalf("reload with a broken key: %v", err)
	}
	if _, err := tryDriver(t, addr, "&tls=true&tlsCAFile="+g.ca); err != nil {
		t.Fatalf("after the failed reload: %v", err)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
