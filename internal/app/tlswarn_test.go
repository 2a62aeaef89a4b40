package app

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/certs"
	"github.com/mongobouncer/mongobouncer/internal/testutil/logbuf"
)

// tls_mode = "allow" with tls_ca_file starts, with a configuration warning
// at warn saying that plain clients skip the certificate rule.
func TestTLSAllowWithCAWarningLogged(t *testing.T) {
	dir := t.TempDir()
	ca := certs.NewCA(t, "warn CA")
	srv := ca.Server(t, "127.0.0.1")
	cfg := config.Default()
	cfg.Global.Listen = "127.0.0.1:0"
	cfg.Global.TLSMode = config.TLSModeAllow
	cfg.Global.TLSCertFile = certs.Write(t, dir, "cert.pem", srv.CertPEM())
	cfg.Global.TLSKeyFile = certs.Write(t, dir, "key.pem", srv.KeyPEM(t))
	cfg.Global.TLSCAFile = certs.Write(t, dir, "ca.pem", ca.CertPEM())
	cfg.Databases = map[string]config.Route{"*": {ConnectionString: "mongodb://127.0.0.1:1/"}}
	var logs logbuf.Buffer
	a, err := NewWithOptions(cfg, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		a.Close(ctx)
	}()
	l := logs.String()
	if !strings.Contains(l, `level=WARN msg="configuration warning"`) || !strings.Contains(l, `plain clients connect without any certificate`) {
		t.Fatalf("no warning about tls_mode = \"allow\" with tls_ca_file:\n%s", l)
	}
}
