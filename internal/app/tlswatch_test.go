package app

// Tests of the TLS file watch (tlswatch.go). TLS clients are always served
// by their own goroutine (the event loop cannot decrypt), so the handshake
// path is the same whatever event_loop says: one I/O model suffices.

import (
	"crypto/tls"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/certs"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/logbuf"
	"github.com/mongobouncer/mongobouncer/internal/testutil/wait"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// watchTick is tls_watch_interval in these tests.
const watchTick = 20 * time.Millisecond

// watchApp starts an App serving TLS clients (tls_mode = "require") with
// the given certificate and key files, in front of a fake upstream, with
// the watch every watchTick.
func watchApp(t *testing.T, certFile, keyFile, caFile string, logs *logbuf.Buffer) *App {
	t.Helper()
	up := fakemongo.Start(t, fakemongo.Options{})
	cfg := config.Default()
	cfg.Global.Listen = "127.0.0.1:0"
	cfg.Global.TLSMode = config.TLSModeRequire
	cfg.Global.TLSCertFile, cfg.Global.TLSKeyFile, cfg.Global.TLSCAFile = certFile, keyFile, caFile
	cfg.Global.TLSWatchInterval = watchTick
	cfg.Databases = map[string]config.Route{"*": {ConnectionString: config.URI(up.URI())}}
	a, err := NewWithOptions(cfg, Options{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeApp(a) })
	a.Start()
	return a
}

// dialTLS connects a TLS client trusting ca to a's main listener and
// returns the connection, handshake done.
func dialTLS(t *testing.T, a *App, ca *certs.Cert) *tls.Conn {
	t.Helper()
	d := &net.Dialer{Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", a.Addrs()[0].String(), &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// servedSerial is the serial number of the certificate a new TLS client
// gets from a.
func servedSerial(t *testing.T, a *App, ca *certs.Cert) *big.Int {
	t.Helper()
	c := dialTLS(t, a, ca)
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber
}

// waitChecks waits until the watch has run n more ticks, so that what the
// test changed has been seen, however loaded the machine.
func waitChecks(t *testing.T, a *App, n uint64) {
	t.Helper()
	until := a.tlsWatch.checks.Load() + n
	wait.Until(t, "the watch's ticks", 10*time.Second, watchTick/4, func() bool { return a.tlsWatch.checks.Load() >= until })
}

// replaceFile replaces dir/name with data atomically (a new file renamed
// over it), as an operator's tooling should: an in-place rewrite could be
// read half-written by the watch, which would then log that torn file too.
func replaceFile(t *testing.T, dir, name string, data []byte) {
	t.Helper()
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

// k8sSecretDir lays files out as a Kubernetes Secret volume does: the
// files in a timestamped directory, "..data" a symlink to it, and each
// file's name a symlink through "..data". It returns a function that
// rotates to new contents the way the kubelet does: a new directory, then
// "..data" swapped atomically by a rename.
func k8sSecretDir(t *testing.T, dir string, files map[string][]byte) (rotate func(map[string][]byte)) {
	t.Helper()
	gen := 0
	write := func(files map[string][]byte) {
		gen++
		ts := filepath.Join(dir, "..2026_11_28_09_00_0"+string(rune('0'+gen)))
		if err := os.Mkdir(ts, 0o700); err != nil {
			t.Fatal(err)
		}
		for name, b := range files {
			if err := os.WriteFile(filepath.Join(ts, name), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	write(files)
	for name := range files {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return write
}

// A certificate rotated in a Kubernetes Secret mount (the ..data symlink
// swap) is served to new TLS clients within a tick, without a reload; a
// client connected before keeps working on its connection.
func TestTLSWatchRotatesClientCertificate(t *testing.T) {
	dir := t.TempDir()
	ca := certs.NewCA(t, "rotation CA")
	first, second := ca.Server(t, "127.0.0.1"), ca.Server(t, "127.0.0.1")
	rotate := k8sSecretDir(t, dir, map[string][]byte{"tls.crt": first.CertPEM(), "tls.key": first.KeyPEM(t)})
	var logs logbuf.Buffer
	a := watchApp(t, filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), "", &logs)

	before := dialTLS(t, a, ca)
	defer before.Close()
	if got := before.ConnectionState().PeerCertificates[0].SerialNumber; got.Cmp(first.Cert.SerialNumber) != 0 {
		t.Fatalf("served serial %v, want the first certificate's %v", got, first.Cert.SerialNumber)
	}
	pingOn(t, before)

	rotate(map[string][]byte{"tls.crt": second.CertPEM(), "tls.key": second.KeyPEM(t)})
	wait.Until(t, "the rotated certificate served", 10*time.Second, watchTick, func() bool {
		return servedSerial(t, a, ca).Cmp(second.Cert.SerialNumber) == 0
	})
	pingOn(t, before) // the client connected before is not dropped
	if got := before.ConnectionState().PeerCertificates[0].SerialNumber; got.Cmp(first.Cert.SerialNumber) != 0 {
		t.Fatalf("the connected client's certificate changed to %v", got)
	}
	l := logs.String()
	if !strings.Contains(l, `msg="client TLS files changed: new clients get the new certificate"`) || !strings.Contains(l, "serial="+second.Cert.SerialNumber.String()) {
		t.Fatalf("no info log naming the new certificate:\n%s", l)
	}
}

// Files that do not load (a key that does not match the certificate, as
// when cert-manager's two files are caught mid-rotation; garbage) keep the
// certificate in use and log one warning per distinct failure, naming the
// file and the reason; once the files are right again they apply.
func TestTLSWatchKeepsCertificateOnBadFiles(t *testing.T) {
	dir := t.TempDir()
	ca := certs.NewCA(t, "rotation CA")
	first, second := ca.Server(t, "127.0.0.1"), ca.Server(t, "127.0.0.1")
	certFile := certs.Write(t, dir, "cert.pem", first.CertPEM())
	keyFile := certs.Write(t, dir, "key.pem", first.KeyPEM(t))
	var logs logbuf.Buffer
	a := watchApp(t, certFile, keyFile, "", &logs)
	before := dialTLS(t, a, ca)
	defer before.Close()

	const warning = `level=WARN msg="client TLS files changed but do not load; new clients still get the certificate in use"`
	stays := func(what, reason string, warnings int) {
		t.Helper()
		wait.Until(t, "a warning about "+what, 10*time.Second, watchTick, func() bool { return strings.Contains(logs.String(), reason) })
		waitChecks(t, a, 3) // more ticks: no more warnings
		l := logs.String()
		if n := strings.Count(l, warning); n != warnings {
			t.Fatalf("%s: %d warnings, want %d:\n%s", what, n, warnings, l)
		}
		if got := servedSerial(t, a, ca); got.Cmp(first.Cert.SerialNumber) != 0 {
			t.Fatalf("%s: served serial %v, want the first certificate's", what, got)
		}
		pingOn(t, before)
	}
	replaceFile(t, dir, "cert.pem", second.CertPEM()) // the key not yet
	stays("a mismatched key", "private key does not match public key", 1)
	if l := logs.String(); !strings.Contains(l, "tls_cert_file="+certFile) || !strings.Contains(l, "tls_key_file="+keyFile) {
		t.Fatalf("the warning does not name the files:\n%s", l)
	}
	replaceFile(t, dir, "cert.pem", []byte("-----BEGIN GARBAGE-----\nnot base64 at all\n"))
	stays("a garbage certificate", "no PEM certificate found", 2)

	replaceFile(t, dir, "cert.pem", second.CertPEM())
	replaceFile(t, dir, "key.pem", second.KeyPEM(t))
	wait.Until(t, "the good files served", 10*time.Second, watchTick, func() bool {
		return servedSerial(t, a, ca).Cmp(second.Cert.SerialNumber) == 0
	})
	pingOn(t, before)

	// After a success, and after the files in use are put back, the same
	// failure is news again. (Counted from here: the two renames above may
	// have been seen half done, a mismatch that is logged too.)
	third := ca.Server(t, "127.0.0.1")
	broken := func() {
		t.Helper()
		warnings := strings.Count(logs.String(), warning) + 1
		replaceFile(t, dir, "cert.pem", third.CertPEM())
		wait.Until(t, "one more warning", 10*time.Second, watchTick, func() bool { return strings.Count(logs.String(), warning) == warnings })
		waitChecks(t, a, 3)
		if n := strings.Count(logs.String(), warning); n != warnings {
			t.Fatalf("%d warnings, want %d:\n%s", n, warnings, logs.String())
		}
		if got := servedSerial(t, a, ca); got.Cmp(second.Cert.SerialNumber) != 0 {
			t.Fatalf("served serial %v, want the second certificate's", got)
		}
	}
	broken()
	replaceFile(t, dir, "cert.pem", second.CertPEM()) // the files in use again
	waitChecks(t, a, 2)
	broken()
}

// A rotated tls_ca_file applies to new handshakes: a client certificate
// from the new CA is accepted, one from the old CA refused; a client
// connected with the old one stays.
func TestTLSWatchRotatesClientCA(t *testing.T) {
	dir := t.TempDir()
	ca := certs.NewCA(t, "server CA")
	srv := ca.Server(t, "127.0.0.1")
	oldCA, newCA := certs.NewCA(t, "old client CA"), certs.NewCA(t, "new client CA")
	oldClient, newClient := oldCA.Client(t, certsName("old")).TLS(), newCA.Client(t, certsName("new")).TLS()
	certFile := certs.Write(t, dir, "cert.pem", srv.CertPEM())
	keyFile := certs.Write(t, dir, "key.pem", srv.KeyPEM(t))
	caFile := certs.Write(t, dir, "ca.pem", oldCA.CertPEM())
	var logs logbuf.Buffer
	a := watchApp(t, certFile, keyFile, caFile, &logs)
	dial := func(cert tls.Certificate) (*tls.Conn, error) {
		d := &net.Dialer{Timeout: 5 * time.Second}
		c, err := tls.DialWithDialer(d, "tcp", a.Addrs()[0].String(), &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1",
			Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
		if err != nil {
			return nil, err
		}
		// TLS 1.3: the server's verdict on the client certificate comes
		// with the first read; a ping shows it.
		if err := pingErr(c); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}
	before, err := dial(oldClient)
	if err != nil {
		t.Fatalf("client of the old CA before the rotation: %v", err)
	}
	defer before.Close()
	if c, err := dial(newClient); err == nil {
		c.Close()
		t.Fatal("a client of the new CA was accepted before the rotation")
	}

	replaceFile(t, dir, "ca.pem", newCA.CertPEM())
	wait.Until(t, "the new CA in force", 10*time.Second, watchTick, func() bool {
		c, err := dial(newClient)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	if c, err := dial(oldClient); err == nil {
		c.Close()
		t.Fatal("a client of the old CA was accepted after the rotation")
	}
	pingOn(t, before)
}

// pingErr runs one ping through c and returns what failed.
func pingErr(c net.Conn) error {
	body, err := bson.Marshal(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "test"}})
	if err != nil {
		return err
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(wire.AppendMsg(nil, 1, 0, 0, body)); err != nil {
		return err
	}
	_, err = wire.ReadMessage(c, nil, wire.DefaultMaxMessageSize)
	return err
}

// The watch follows tls_watch_interval on reload: "0s" reads nothing, and
// a reload that sets an interval starts reading.
func TestTLSWatchIntervalReloads(t *testing.T) {
	dir := t.TempDir()
	ca := certs.NewCA(t, "rotation CA")
	first, second := ca.Server(t, "127.0.0.1"), ca.Server(t, "127.0.0.1")
	certFile := certs.Write(t, dir, "cert.pem", first.CertPEM())
	keyFile := certs.Write(t, dir, "key.pem", first.KeyPEM(t))
	up := fakemongo.Start(t, fakemongo.Options{})
	path := filepath.Join(dir, "mongobouncer.toml")
	write := func(interval string) {
		t.Helper()
		doc := "[mongobouncer]\nlisten = \"127.0.0.1:0\"\ntls_mode = \"require\"\ntls_cert_file = \"" + certFile + "\"\ntls_key_file = \"" + keyFile +
			"\"\ntls_watch_interval = \"" + interval + "\"\n[databases.\"*\"]\nconnection_string = \"" + up.URI() + "\"\n"
		if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("0s")
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeApp(a) })
	a.Start()

	replaceFile(t, dir, "cert.pem", second.CertPEM())
	replaceFile(t, dir, "key.pem", second.KeyPEM(t))
	time.Sleep(10 * watchTick)
	if got := servedSerial(t, a, ca); got.Cmp(first.Cert.SerialNumber) != 0 {
		t.Fatalf("tls_watch_interval = \"0s\" read the rotated files (serial %v)", got)
	}
	if n := a.tlsWatch.checks.Load(); n != 0 {
		t.Fatalf("tls_watch_interval = \"0s\": %d ticks", n)
	}
	write(watchTick.String())
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	// The reload itself reads the files: rotate once more for the watch.
	third := ca.Server(t, "127.0.0.1")
	replaceFile(t, dir, "cert.pem", third.CertPEM())
	replaceFile(t, dir, "key.pem", third.KeyPEM(t))
	wait.Until(t, "the watch turned on by reload", 10*time.Second, watchTick, func() bool {
		return servedSerial(t, a, ca).Cmp(third.Cert.SerialNumber) == 0
	})
}

// A route's tlsCAFile rotated on disk rebuilds the route as a reload does
// (new pools with the new file, the old ones drain), without a reload; a
// file that does not load keeps the route and warns once.
func TestTLSWatchRebuildsUpstreamRoute(t *testing.T) {
	dir := t.TempDir()
	ca := certs.NewCA(t, "test CA")
	other := certs.NewCA(t, "another CA")
	caFile := certs.Write(t, dir, "ca.pem", other.CertPEM()) // the wrong CA first
	up := tlsUpstream(t, ca, nil, "127.0.0.1")
	cfg := config.Default()
	cfg.Global.Listen = "127.0.0.1:0"
	cfg.Global.HeartbeatInterval = 500 * time.Millisecond
	cfg.Global.TLSWatchInterval = watchTick
	cfg.Databases = map[string]config.Route{"*": {ConnectionString: config.URI("mongodb://" + up.Addr() + "/?directConnection=true&tls=true&tlsCAFile=" + caFile)}}
	var logs logbuf.Buffer
	a, err := NewWithOptions(cfg, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeApp(a) })
	a.Start()
	old := a.Topologies()[0]
	srv := old.Servers()[0]
	wait.Until(t, "the first check", 10*time.Second, 5*time.Millisecond, srv.Checked)
	if d := srv.Description(); d.LastError == nil || !strings.Contains(d.LastError.Error(), "unknown authority") {
		t.Fatalf("with the wrong CA: %+v", d)
	}
	waitChecks(t, a, 3)
	if a.Topologies()[0] != old {
		t.Fatal("the watch rebuilt a route whose files did not change")
	}

	replaceFile(t, dir, "ca.pem", ca.CertPEM())
	wait.Until(t, "the route rebuilt", 10*time.Second, watchTick, func() bool { return a.Topologies()[0] != old })
	srv = a.Topologies()[0].Servers()[0]
	wait.Until(t, "a check with the new CA", 10*time.Second, 5*time.Millisecond, func() bool { return srv.Hello() != nil })
	wait.Until(t, "the old route drained", 10*time.Second, watchTick, func() bool {
		return strings.Contains(logs.String(), `msg="route drained and closed" route=*`)
	})
	ping(t, a, "test")

	running := a.Topologies()[0]
	replaceFile(t, dir, "ca.pem", []byte("garbage"))
	const warning = `level=WARN msg="upstream TLS files changed but do not load; the route keeps its pools" route=*`
	wait.Until(t, "a warning", 10*time.Second, watchTick, func() bool { return strings.Contains(logs.String(), warning) })
	waitChecks(t, a, 3)
	if n := strings.Count(logs.String(), warning); n != 1 || !strings.Contains(logs.String(), "tlsCAFile "+caFile) {
		t.Fatalf("%d warnings, want 1 naming the file:\n%s", n, logs.String())
	}
	if a.Topologies()[0] != running {
		t.Fatal("a bad file replaced the route")
	}
	ping(t, a, "test")
}
