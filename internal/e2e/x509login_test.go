package e2e

import (
	"crypto/x509/pkix"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/testutil/certs"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// auth_type = "x509": a client logs in by its verified certificate (the
// driver's MONGODB-X509 authenticate), runs commands, and without logging
// in is refused with Unauthorized (13).
func TestX509ClientLogin(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		f := newTLSFiles(t, t.TempDir(), "a")
		a, addr, _ := fileBouncer(t, baseTOML(up.URI(), f.tlsTOML("require", true)+"auth_type = \"x509\"\n"))
		waitUsable(t, a, 1)

		c := driver(t, addr, "&tls=true&tlsCAFile="+f.ca+"&tlsCertificateKeyFile="+f.clientPEM+
			"&authMechanism=MONGODB-X509")
		coll := c.Database("test").Collection("x509")
		if _, err := coll.InsertOne(ctxT(t, 10*time.Second), bson.D{{Key: "i", Value: 1}}); err != nil {
			t.Fatalf("insert after an X.509 login: %v", err)
		}
		if n := len(up.Collection("test", "x509")); n != 1 {
			t.Fatalf("upstream holds %d documents, want 1", n)
		}
		var users []string
		for _, ci := range a.Clients() {
			users = append(users, ci.User)
		}
		if !strings.Contains(strings.Join(users, ","), "CN=app,O=Example") {
			t.Errorf("SHOW CLIENTS users %v, want the certificate's subject", users)
		}

		// A certificate with an empty subject (its holder named in
		// subjectAltName only, if at all) is nobody, as for mongod.
		empty := f.issuer.Client(t, pkix.Name{})
		emptyPEM := certs.Write(t, f.dir, "empty-client.pem", empty.CertPEM(), empty.KeyPEM(t))
		_, err := tryDriver(t, addr, "&tls=true&tlsCAFile="+f.ca+"&tlsCertificateKeyFile="+emptyPEM+
			"&authMechanism=MONGODB-X509")
		if err == nil || !strings.Contains(err.Error(), "AuthenticationFailed") {
			t.Fatalf("X.509 login with an empty subject: %v, want AuthenticationFailed", err)
		}

		// The same certificate, without logging in.
		anon := driver(t, addr, "&tls=true&tlsCAFile="+f.ca+"&tlsCertificateKeyFile="+f.clientPEM)
		_, err = anon.Database("test").Collection("x509").InsertOne(ctxT(t, 10*time.Second), bson.D{{Key: "i", Value: 2}})
		if err == nil || !strings.Contains(err.Error(), "Unauthorized") {
			t.Fatalf("insert without logging in: %v, want Unauthorized", err)
		}
	})
}
