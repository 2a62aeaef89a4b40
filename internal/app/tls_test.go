package app

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/certs"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/wait"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// tlsUpstream starts a fake server that speaks TLS with a certificate for
// hosts, signed by ca; clientCAs, when set, makes it require client
// certificates signed by them.
func tlsUpstream(t *testing.T, ca *certs.Cert, clientCAs *x509.CertPool, hosts ...string) *fakemongo.Server {
	t.Helper()
	cfg := &tls.Config{Certificates: []tls.Certificate{ca.Server(t, hosts...).TLS()}, MinVersion: tls.VersionTLS12}
	if clientCAs != nil {
		cfg.ClientCAs, cfg.ClientAuth = clientCAs, tls.RequireAndVerifyClientCert
	}
	return fakemongo.Start(t, fakemongo.Options{TLSConfig: cfg})
}

// dialUpstream builds the TLS configuration of uri as a route would and
// connects to the fake with it (hello included).
func dialUpstream(t *testing.T, uri, addr string) error {
	t.Helper()
	cs, err := config.ParseConnString(uri)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := tlsConfig(cs)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := upstream.NewDialer(upstream.Options{TLSConfig: cfg, ConnectTimeout: 5 * time.Second}).Dial(ctx, addr, 1)
	if err != nil {
		return err
	}
	c.Close()
	return nil
}

func TestUpstreamTLSVerification(t *testing.T) {
	dir := t.TempDir()
	ca := certs.NewCA(t, "test CA")
	caFile := certs.Write(t, dir, "ca.pem", ca.CertPEM())
	other := certs.NewCA(t, "another CA")
	otherFile := certs.Write(t, dir, "other.pem", other.CertPEM())

	good := tlsUpstream(t, ca, nil, "127.0.0.1", "localhost")
	// A certificate for another name: the chain is fine, the host is not.
	misnamed := tlsUpstream(t, ca, nil, "db.example.com")

	cases := []struct {
		name, addr, opts string
		want             string // "" for success, else part of the error
	}{
		{"CA file", good.Addr(), "tlsCAFile=" + caFile, ""},
		{"system roots only", good.Addr(), "", "certificate signed by unknown authority"},
		{"wrong CA", good.Addr(), "tlsCAFile=" + otherFile, "certificate signed by unknown authority"},
		{"other name refused", misnamed.Addr(), "tlsCAFile=" + caFile, "cannot validate certificate for 127.0.0.1 because it doesn't contain any IP SANs"},
		{"other name with tlsAllowInvalidHostnames", misnamed.Addr(), "tlsCAFile=" + caFile + "&tlsAllowInvalidHostnames=true", ""},
		{"tlsAllowInvalidHostnames still checks the chain", misnamed.Addr(), "tlsCAFile=" + otherFile + "&tlsAllowInvalidHostnames=true", "certificate signed by unknown authority"},
		{"tlsAllowInvalidCertificates skips the chain", good.Addr(), "tlsCAFile=" + otherFile + "&tlsAllowInvalidCertificates=true", ""},
		{"tlsAllowInvalidCertificates still checks the name", misnamed.Addr(), "tlsCAFile=" + otherFile + "&tlsAllowInvalidCertificates=true", "cannot validate certificate for 127.0.0.1"},
		{"both allow everything", misnamed.Addr(), "tlsAllowInvalidCertificates=true&tlsAllowInvalidHostnames=true", ""},
		{"tlsInsecure", misnamed.Addr(), "tlsInsecure=true", ""},
		// By DNS name: the name is sent as SNI and checked.
		{"by name", "localhost:" + port(good.Addr()), "tlsCAFile=" + caFile, ""},
		{"by name, other name refused", "localhost:" + port(misnamed.Addr()), "tlsCAFile=" + caFile, "certificate is valid for db.example.com, not localhost"},
		{"by name, tlsAllowInvalidHostnames", "localhost:" + port(misnamed.Addr()), "tlsCAFile=" + caFile + "&tlsAllowInvalidHostnames=true", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := dialUpstream(t, "mongodb://"+c.addr+"/?tls=true&"+c.opts, c.addr)
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("connect: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("connect: %v, want an error with %q", err, c.want)
			}
		})
	}
}

// The client certificate, its key plain, PKCS#8-encrypted or encrypted the
// legacy way; a wrong or missing password is a clear error that never
// shows the password.
func TestUpstreamClientCertificate(t *testing.T) {
	dir := t.TempDir()
	ca := certs.NewCA(t, "test CA")
	caFile := certs.Write(t, dir, "ca.pem", ca.CertPEM())
	clientCA := certs.NewCA(t, "client CA")
	up := tlsUpstream(t, ca, clientCA.Pool(), "127.0.0.1")
	cl := clientCA.Client(t, certsName("mongobouncer"))
	const password = "s3cret-Pa55"
	files := map[string]string{
		"plain":     certs.Write(t, dir, "plain.pem", cl.CertPEM(), cl.KeyPEM(t)),
		"pkcs8":     certs.Write(t, dir, "pkcs8.pem", cl.CertPEM(), cl.EncryptedKeyPEM(t, password)),
		"legacy":    certs.Write(t, dir, "legacy.pem", cl.CertPEM(), cl.LegacyEncryptedKeyPEM(t, password)),
		"wrong key": certs.Write(t, dir, "wrong.pem", cl.CertPEM(), clientCA.KeyPEM(t)),
	}
	uri := func(file, pw string) string {
		u := "mongodb://" + up.Addr() + "/?tls=true&tlsCAFile=" + caFile + "&tlsCertificateKeyFile=" + file
		if pw != "" {
			u += "&tlsCertificateKeyFilePassword=" + pw
		}
		return u
	}
	for _, ok := range []struct{ file, pw string }{{"plain", ""}, {"pkcs8", password}, {"legacy", password}} {
		if err := dialUpstream(t, uri(files[ok.file], ok.pw), up.Addr()); err != nil {
			t.Errorf("%s key: %v", ok.file, err)
		}
	}
	if err := dialUpstream(t, "mongodb://"+up.Addr()+"/?tls=true&tlsCAFile="+caFile, up.Addr()); err == nil {
		t.Error("connected without a client certificate to a server that requires one")
	}
	for _, bad := range []struct{ file, pw, want string }{
		{"pkcs8", "wrong-password", "cannot be decrypted with the password given"},
		{"legacy", "wrong-password", "cannot be decrypted with the password given"},
		{"pkcs8", "", "the key is encrypted; give tlsCertificateKeyFilePassword"},
		{"wrong key", "", "private key does not match public key"},
	} {
		err := dialUpstream(t, uri(files[bad.file], bad.pw), up.Addr())
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s key, password %q: %v, want %q", bad.file, bad.pw, err, bad.want)
			continue
		}
		if bad.pw != "" && (!errors.Is(err, ErrKeyPassword) || strings.Contains(err.Error(), bad.pw)) {
			t.Errorf("%s: %v: want ErrKeyPassword and no password in the message", bad.file, err)
		}
	}
	// A missing file names the option and the path.
	err := dialUpstream(t, uri(filepath.Join(dir, "missing.pem"), ""), up.Addr())
	if err == nil || !strings.Contains(err.Error(), "tlsCertificateKeyFile") || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

func port(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

func certsName(cn string) pkix.Name {
	return pkix.Name{CommonName: cn, OrganizationalUnit: []string{"pooler"}, Organization: []string{"mongobouncer tests"}}
}

// A reload with the same connection string but a replaced tlsCAFile reads
// the file again: the route gets a new topology whose connections use it.
func TestReloadRereadsUpstreamTLSFiles(t *testing.T) {
	dir := t.TempDir()
	ca := certs.NewCA(t, "test CA")
	other := certs.NewCA(t, "another CA")
	caFile := certs.Write(t, dir, "ca.pem", other.CertPEM()) // the wrong CA first
	up := tlsUpstream(t, ca, nil, "127.0.0.1")
	path := filepath.Join(dir, "mongobouncer.toml")
	doc := "[mongobouncer]\nlisten = \"127.0.0.1:0\"\nheartbeat_interval = \"500ms\"\n" +
		"[databases.\"*\"]\nconnection_string = \"mongodb://" + up.Addr() + "/?directConnection=true&tls=true&tlsCAFile=" + caFile + "\"\n"
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeApp(a) })
	srv := a.Topologies()[0].Servers()[0]
	wait.Until(t, "the first check", 10*time.Second, 5*time.Millisecond, srv.Checked)
	if d := srv.Description(); d.LastError == nil || !strings.Contains(d.LastError.Error(), "unknown authority") {
		t.Fatalf("with the wrong CA: %+v", d)
	}
	old := a.Topologies()[0]
	if err := a.Reload(); err != nil { // nothing changed
		t.Fatal(err)
	}
	if a.Topologies()[0] != old {
		t.Fatal("a reload without changes rebuilt the route")
	}

	certs.Write(t, dir, "ca.pem", ca.CertPEM())
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	if a.Topologies()[0] == old {
		t.Fatal("the replaced tlsCAFile did not rebuild the route")
	}
	srv = a.Topologies()[0].Servers()[0]
	wait.Until(t, "a check with the new CA", 10*time.Second, 5*time.Millisecond, func() bool { return srv.Hello() != nil })

	// A file that became unreadable fails the reload and keeps the route.
	running := a.Topologies()[0]
	if err := os.Remove(caFile); err != nil {
		t.Fatal(err)
	}
	if err := a.Reload(); err == nil || !strings.Contains(err.Error(), "tlsCAFile") {
		t.Fatalf("reload with the CA file gone: %v", err)
	}
	if a.Topologies()[0] != running {
		t.Fatal("a failed reload replaced the route")
	}
}

// Client TLS files are read at New (and at every reload, through the same
// clientTLS): a missing or bad file fails New naming the key.
func TestClientTLSFiles(t *testing.T) {
	dir := t.TempDir()
	ca := certs.NewCA(t, "test CA")
	srv := ca.Server(t, "127.0.0.1")
	cert := certs.Write(t, dir, "cert.pem", srv.CertPEM())
	key := certs.Write(t, dir, "key.pem", srv.KeyPEM(t))
	other := certs.Write(t, dir, "other-key.pem", ca.KeyPEM(t))
	build := func(certFile, keyFile, caFile string) (*App, error) {
		cfg := config.Default()
		cfg.Global.Listen = "127.0.0.1:0"
		cfg.Global.TLSMode, cfg.Global.TLSCertFile, cfg.Global.TLSKeyFile, cfg.Global.TLSCAFile = config.TLSModeRequire, certFile, keyFile, caFile
		cfg.Databases = map[string]config.Route{"*": {ConnectionString: "mongodb://127.0.0.1:1/"}}
		return New(cfg, nil)
	}
	for _, bad := range []struct{ cert, key, ca, want string }{
		{filepath.Join(dir, "none.pem"), key, "", "tls_cert_file"},
		{cert, filepath.Join(dir, "none.pem"), "", "tls_key_file"},
		{cert, other, "", "private key does not match public key"},
		{cert, key, key, "tls_ca_file"},
	} {
		if a, err := build(bad.cert, bad.key, bad.ca); err == nil || !strings.Contains(err.Error(), bad.want) {
			if a != nil {
				closeApp(a)
			}
			t.Errorf("New with %+v: %v, want an error with %q", bad, err, bad.want)
		}
	}
	a, err := build(cert, key, "")
	if err != nil {
		t.Fatal(err)
	}
	closeApp(a)
}
