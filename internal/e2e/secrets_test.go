package e2e

import (
	"bytes"
	"crypto/tls"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/auth"
	"github.com/mongobouncer/mongobouncer/internal/testutil/certs"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/logbuf"
)

// TestSecretsNeverShown (issue 19 item 6): every secret of the
// configuration (client passwords and stored SCRAM keys in auth_file,
// auth_user's password, a route's upstream password, a wrong one, and
// tlsCertificateKeyFilePassword) is absent from the debug log, the admin
// commands over the wire (showConfig, showClients, showServers, showPools,
// showStats), every /admin JSON endpoint, /metrics and /readyz, and the
// error replies clients get (wrong password to mongobouncer, a route whose
// upstream refuses its password, an unknown user, an unauthenticated
// command, a pass-through login whose salt the upstream does not have).
func TestSecretsNeverShown(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		dir := t.TempDir()
		const (
			svcPW      = "svc-Upstream/Pa55:word" // needs percent-encoding in a URI
			badPW      = "not-the-Upstream-pa55"
			keyPW      = "key-File-Pa55phrase"
			mbauthPW   = "mbauth-Lookup-pa55"
			upuserPW   = "upuser-Only-Upstream-pa55"
			clientPWs  = "app-pässword"
			hashedUser = "bob's secret"
		)
		ca := certs.NewCA(t, "secrets CA")
		caFile := certs.Write(t, dir, "ca.pem", ca.CertPEM())
		clientCA := certs.NewCA(t, "secrets client CA")
		cl := clientCA.Client(t, pkix.Name{CommonName: "mongobouncer"})
		keyFile := certs.Write(t, dir, "client.pem", cl.CertPEM(), cl.EncryptedKeyPEM(t, keyPW))
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true,
			TLSConfig: &tls.Config{Certificates: []tls.Certificate{ca.Server(t, "127.0.0.1").TLS()}, MinVersion: tls.VersionTLS12,
				ClientCAs: clientCA.Pool(), ClientAuth: tls.RequireAndVerifyClientCert},
			Users: []fakemongo.User{
				{Name: "svc", Password: svcPW},
				{Name: "mbauth", Password: mbauthPW},
				{Name: "upuser", Password: upuserPW},
				{Name: "app", Password: clientPWs},
				{Name: "bob", Password: hashedUser},
			}})

		users := filepath.Join(dir, "users.txt")
		var file strings.Builder
		fmt.Fprintf(&file, "%q %q\n%q %q\n", "app@admin", clientPWs, "mbauth@admin", mbauthPW)
		for u, pw := range map[string]string{"bob": hashedUser, "ops": "ops pass"} {
			line, err := auth.HashPassword(u, "admin", pw)
			if err != nil {
				t.Fatal(err)
			}
			file.WriteString(line + "\n")
		}
		if err := os.WriteFile(users, []byte(file.String()), 0o600); err != nil {
			t.Fatal(err)
		}
		tlsq := "tls=true&tlsCAFile=" + url.QueryEscape(caFile) + "&tlsCertificateKeyFile=" + url.QueryEscape(keyFile) +
			"&tlsCertificateKeyFilePassword=" + url.QueryEscape(keyPW) + "&directConnection=true"
		good := "mongodb://svc:" + url.QueryEscape(svcPW) + "@" + up.Addr() + "/?" + tlsq
		bad := "mongodb://svc:" + url.QueryEscape(badPW) + "@" + up.Addr() + "/?" + tlsq
		extra := fmt.Sprintf("auth_type = \"scram\"\nauth_file = %q\nauth_user = \"mbauth@admin\"\nauth_user_service_routes = true\nadmin_users = [\"ops@admin\"]\n", users)
		// pt has no credentials: SCRAM pass-through, as each client's user.
		pt := "mongodb://" + up.Addr() + "/?" + tlsq
		toml := baseTOML(good, extra) + fmt.Sprintf("[databases.badroute]\nconnection_string = %q\n[databases.pt]\nconnection_string = %q\n", bad, pt)
		var logs logbuf.Buffer
		a, addr, _ := fileBouncerLevel(t, toml, &logs, slog.LevelDebug)
		ctx := ctxT(t, 60*time.Second)

		var seen bytes.Buffer
		note := func(err error) {
			if err != nil {
				seen.WriteString(err.Error() + "\n")
			}
		}
		// Logins right and wrong, an upstream-only user, an unknown one.
		for _, c := range [][2]string{{"app", clientPWs}, {"app", "wrong"}, {"bob", hashedUser}, {"bob", "wrong"},
			{"upuser", upuserPW}, {"upuser", "wrong"}, {"ghost", upuserPW}} {
			note(authDriver(t, addr, "", c[0], c[1]).Ping(ctx, nil))
		}
		app := authDriver(t, addr, "", "app", clientPWs)
		if _, err := app.Database("shop").Collection("o").InsertOne(ctx, bson.D{{Key: "i", Value: 1}}); err != nil {
			t.Fatalf("through the TLS service-user route: %v", err)
		}
		// The route whose upstream refuses its password.
		err := app.Database("badroute").Collection("o").FindOne(ctx, bson.D{}).Err()
		if err == nil || !strings.Contains(err.Error(), "badroute") {
			t.Fatalf("wrong upstream password: %v, want an error naming the route", err)
		}
		note(err)
		// Pass-through: with a plain password, with a looked-up secret, and
		// with a hash-password secret whose salt the upstream does not have.
		for _, c := range [][2]string{{"app", clientPWs}, {"upuser", upuserPW}, {"bob", hashedUser}} {
			_, err := authDriver(t, addr, "", c[0], c[1]).Database("pt").Collection("o").InsertOne(ctx, bson.D{{Key: "u", Value: c[0]}})
			if (err != nil) != (c[0] == "bob") {
				t.Fatalf("pass-through as %s: %v", c[0], err)
			}
			note(err)
		}
		// An unauthenticated command.
		note(driver(t, addr, "").Database("shop").Collection("o").FindOne(ctx, bson.D{}).Err())

		ops := authDriver(t, addr, "", "ops", "ops pass")
		for _, cmd := range []string{"showConfig", "showClients", "showServers", "showPools", "showStats"} {
			raw, err := ops.Database("mongobouncer").RunCommand(ctx, bson.D{{Key: cmd, Value: 1}}).Raw()
			if err != nil {
				t.Fatalf("%s: %v", cmd, err)
			}
			seen.WriteString(raw.String())
		}
		for _, p := range []string{"/admin/config", "/admin/clients", "/admin/servers", "/admin/pools", "/admin/stats",
			"/admin/nonsense", "/readyz", "/metrics", "/status/data", "POST /admin/reconnect?route=badroute", "POST /admin/reload"} {
			method := http.MethodGet
			if m, rest, ok := strings.Cut(p, " "); ok {
				method, p = m, rest
			}
			req, _ := http.NewRequestWithContext(ctx, method, "http://"+a.AdminAddr().String()+p, nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			seen.Write(b)
		}
		if err := a.Reload(); err != nil {
			t.Fatal(err)
		}
		out := seen.String() + logs.String()
		// The scan must have something to scan.
		for _, want := range []string{"users.txt", "badroute", "client.pem", "level=DEBUG", "client logged in", "reconnect", "Authentication failed", `"svc"`,
			"pass-through login to the upstream failed", "differs from mongobouncer's stored secret"} {
			if !strings.Contains(out, want) {
				t.Fatalf("nothing shows %q: the scan would prove little", want)
			}
		}

		secrets := []string{svcPW, badPW, keyPW, mbauthPW, upuserPW, clientPWs, hashedUser, "ops pass"}
		for _, s := range secrets[:] {
			secrets = append(secrets, url.QueryEscape(s), url.PathEscape(s))
		}
		for _, f := range strings.FieldsFunc(file.String(), func(r rune) bool { return strings.ContainsRune(" \"\n$:", r) }) {
			if len(f) >= 16 { // salts and keys
				secrets = append(secrets, f)
			}
		}
		for _, s := range secrets {
			if strings.Contains(out, s) {
				i := strings.Index(out, s)
				t.Errorf("secret %q shown: ...%s...", s, out[max(0, i-80):min(len(out), i+len(s)+20)])
			}
		}
	})
}
