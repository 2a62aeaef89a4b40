package e2e

// mongobouncer logging in to its upstreams as the route's service user
// (the credentials of the route's connection string): against fakemongo's
// SCRAM server, whose counters show who logged in on which connection, and
// against FerretDB's own command, a real server with SCRAM.

import (
	"context"
	"crypto/tls"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongobouncer/mongobouncer/internal/app"
	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/certs"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/ferretdb"
	"github.com/mongobouncer/mongobouncer/internal/testutil/logbuf"
)

const (
	svcUser     = "svc"
	svcPassword = "S3rvice-pass!"
	// wrongPassword must never appear in a log line or an error.
	wrongPassword = "Wr0ng-pass-XYZ"
)

// bouncerLogging is bouncer with its log (from warn up) kept in logs.
func bouncerLogging(t *testing.T, upstreamURI string, logs *logbuf.Buffer) string {
	t.Helper()
	a := newBouncerWithLogger(t, upstreamURI, slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})))
	return a.Addrs()[0].String()
}

// newBouncerWithLogger is newBouncer (the same configuration) logging to
// log.
func newBouncerWithLogger(t *testing.T, upstreamURI string, log *slog.Logger) *app.App {
	t.Helper()
	cfg := config.Default()
	cfg.Global.Listen = "127.0.0.1:0"
	cfg.Global.HeartbeatInterval = 500 * time.Millisecond
	cfg.Global.ServerSelectionTimeout = 5 * time.Second
	cfg.Global.WaitQueueTimeout = 10 * time.Second
	cfg.Databases = map[string]config.Route{"*": {ConnectionString: config.URI(upstreamURI)}}
	ioModelOf(t).apply(&cfg)
	a, err := app.New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	a.Start()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := a.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return a
}

// serviceUserOf returns "db.user" as the upstream's connectionStatus,
// asked through mongobouncer, reports it.
func serviceUserOf(t *testing.T, c *mongo.Client) string {
	t.Helper()
	var st struct {
		AuthInfo struct {
			AuthenticatedUsers []struct{ User, DB string }
		}
	}
	if err := c.Database("admin").RunCommand(ctxT(t, 10*time.Second), bson.D{{Key: "connectionStatus", Value: 1}}).Decode(&st); err != nil {
		t.Fatalf("connectionStatus: %v", err)
	}
	if u := st.AuthInfo.AuthenticatedUsers; len(u) == 1 {
		return u[0].DB + "." + u[0].User
	}
	return fmt.Sprint(st.AuthInfo.AuthenticatedUsers)
}

func insertFind(t *testing.T, c *mongo.Client, db string) {
	t.Helper()
	ctx := ctxT(t, 30*time.Second)
	coll := c.Database(db).Collection("orders")
	for i := range 5 {
		if _, err := coll.InsertOne(ctx, bson.D{{Key: "n", Value: i}}); err != nil {
			t.Fatalf("insert: %v", err)
		}
	}
	cur, err := coll.Find(ctx, bson.D{})
	if err != nil {
		t.Fatalf("find: %v", err)
	}
	var docs []bson.M
	if err := cur.All(ctx, &docs); err != nil {
		t.Fatalf("find: %v", err)
	}
	if len(docs) < 5 {
		t.Fatalf("%d documents, want at least 5", len(docs))
	}
}

// TestUpstreamLoginThroughBouncer: the route's pooled connections log in
// as its service user, its monitors never (no saslSupportedMechs, no
// speculativeAuthenticate, no saslStart on them), and clients, who give no
// credentials to mongobouncer, work as that user.
func TestUpstreamLoginThroughBouncer(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true, Users: []fakemongo.User{{Name: svcUser, DB: "app", Password: svcPassword}}})
		var mu sync.Mutex
		askedAuth := map[int64]bool{} // connectionId → a hello carried authentication
		up.Handle("hello", func(req *fakemongo.Request) fakemongo.Reply {
			if req.Lookup("saslSupportedMechs").Type != 0 || req.Lookup("speculativeAuthenticate").Type != 0 {
				mu.Lock()
				askedAuth[req.ConnID] = true
				mu.Unlock()
			}
			return up.Builtin(req)
		})
		_, addr := bouncer(t, "mongodb://"+svcUser+":"+svcPassword+"@"+up.Addr()+"/?directConnection=true&authSource=app", nil)
		c := driver(t, addr, "")
		insertFind(t, c, "shop")
		if u := serviceUserOf(t, c); u != "app."+svcUser {
			t.Fatalf("upstream says the connection is logged in as %s", u)
		}
		pooled, monitors := 0, 0
		mu.Lock()
		defer mu.Unlock()
		for id, user := range up.AuthenticatedUsers() {
			switch {
			case user == "app."+svcUser:
				pooled++
			case user == "" && !askedAuth[id]:
				monitors++
			default:
				t.Errorf("connection %d: user %q, asked for authentication %v", id, user, askedAuth[id])
			}
		}
		if pooled == 0 || monitors == 0 {
			t.Fatalf("%d pooled connections logged in, %d monitoring connections without login; want both", pooled, monitors)
		}
		if f := up.AuthFailures(); f != 0 {
			t.Fatalf("%d failed logins", f)
		}
	})
}

// TestUpstreamLoginX509: a route whose connection string logs in with
// MONGODB-X509 (tls=true, the CA and the client certificate as files)
// serves its clients, and the upstream saw each pooled connection log in
// as the certificate's subject, its monitors never.
func TestUpstreamLoginX509(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		dir := t.TempDir()
		ca := certs.NewCA(t, "upstream CA")
		srv := ca.Server(t, "127.0.0.1")
		subject := pkix.Name{CommonName: "mongobouncer", OrganizationalUnit: []string{"poolers"}, Organization: []string{"Example"}}
		cl := ca.Client(t, subject)
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true,
			TLSConfig: &tls.Config{Certificates: []tls.Certificate{srv.TLS()}, ClientCAs: ca.Pool(),
				ClientAuth: tls.VerifyClientCertIfGiven, MinVersion: tls.VersionTLS12},
			Users: []fakemongo.User{{Name: subject.String(), DB: "$external", Mechanisms: []string{fakemongo.MechX509}}},
		})
		uri := fmt.Sprintf("mongodb://%s/?directConnection=true&authMechanism=MONGODB-X509&tls=true&tlsCAFile=%s&tlsCertificateKeyFile=%s",
			up.Addr(), certs.Write(t, dir, "ca.pem", ca.CertPEM()), certs.Write(t, dir, "client.pem", cl.CertPEM(), cl.KeyPEM(t)))
		_, addr := bouncer(t, uri, nil)
		c := driver(t, addr, "")
		insertFind(t, c, "shop")
		want := "$external." + subject.String()
		if u := serviceUserOf(t, c); u != want {
			t.Fatalf("upstream says the connection is logged in as %s, want %s", u, want)
		}
		pooled, monitors := 0, 0
		for id, user := range up.AuthenticatedUsers() {
			switch user {
			case want:
				pooled++
			case "":
				monitors++
			default:
				t.Errorf("connection %d: user %q", id, user)
			}
		}
		if pooled == 0 || monitors == 0 {
			t.Fatalf("%d pooled connections logged in with X.509, %d monitoring connections without login; want both", pooled, monitors)
		}
		if f := up.AuthFailures(); f != 0 {
			t.Fatalf("%d failed logins", f)
		}
	})
}

// TestUpstreamWrongPasswordBacksOff: with a wrong password, clients get
// code 18 naming the route; the failure is logged at warn without the
// password, at most once per failed attempt (once per pool generation);
// and busy clients do not make mongobouncer storm the upstream with
// logins: a failed login marks the server Unknown and pauses its pool
// until the next successful check (heartbeats are 500 ms here), so the
// attempts follow the checks, not the clients.
func TestUpstreamWrongPasswordBacksOff(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true, Users: []fakemongo.User{{Name: svcUser, Password: svcPassword}}})
		// Every pooled connection's hello carries speculativeAuthenticate
		// (monitors' never do): one per login attempt.
		var logins atomic.Int64
		up.Handle("hello", func(req *fakemongo.Request) fakemongo.Reply {
			if req.Lookup("speculativeAuthenticate").Type != 0 {
				logins.Add(1)
			}
			return up.Builtin(req)
		})
		var logs logbuf.Buffer
		a := newBouncerWithLogger(t, "mongodb://"+svcUser+":"+wrongPassword+"@"+up.Addr()+"/?directConnection=true",
			slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})))
		c := driver(t, a.Addrs()[0].String(), "&retryReads=false&retryWrites=false")

		const clients, window = 32, 1200 * time.Millisecond
		start := logins.Load()
		var requests, refused atomic.Int64
		var other sync.Map
		ctx, cancel := context.WithTimeout(context.Background(), window)
		defer cancel()
		var wg sync.WaitGroup
		for i := range clients {
			wg.Go(func() {
				for ctx.Err() == nil {
					rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
					err := c.Database("db").Collection("c").FindOne(rctx, bson.D{{Key: "i", Value: i}}).Err()
					rcancel()
					requests.Add(1)
					var se mongo.ServerError
					switch {
					case errors.As(err, &se) && se.HasErrorCode(18):
						refused.Add(1)
						if msg := err.Error(); !strings.Contains(msg, `route "*"`) || !strings.Contains(msg, "authentication") {
							other.Store("message: "+msg, true)
						}
					default:
						other.Store(fmt.Sprint(err), true)
					}
				}
			})
		}
		wg.Wait()
		attempts := logins.Load() - start
		t.Logf("%d requests, %d refused with code 18; %d login attempts upstream in %v", requests.Load(), refused.Load(), attempts, window)
		other.Range(func(k, _ any) bool {
			t.Errorf("a client got something else than code 18 naming the route: %v", k)
			return true
		})
		if refused.Load() == 0 {
			t.Fatal("no client was refused")
		}
		// A check (every 500 ms at most) re-opens the pool; the
		// establishments under way when the first failure pauses it again
		// fail too (about maxConnecting + 1, whatever the number of
		// clients): 3 or 4 checks of about 4 in the window, not one per
		// request (measured: 15 for 100 requests of 32 clients, 22 for 128
		// on a loaded CI machine). A pool that did not back off would try
		// once per request.
		if attempts > 40 || 2*attempts > requests.Load() {
			t.Fatalf("%d login attempts for %d requests in %v: the pool does not back off", attempts, requests.Load(), window)
		}
		// Exactly one warning per pool generation: every failure clears
		// the pool (nothing else clears it here), and the failures of the
		// attempts under way then are stale. Once the last failure's
		// warning is out, generations 0 .. current-1 have one each.
		var log string
		var gens []uint64
		var current uint64
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			log, gens, current = logs.String(), nil, a.Pools()[0].Generation
			for line := range strings.Lines(log) {
				if strings.Contains(line, "authentication to the upstream failed") {
					_, rest, _ := strings.Cut(strings.TrimSpace(line), " generation=")
					num, _, _ := strings.Cut(rest, " ")
					g, err := strconv.ParseUint(num, 10, 64)
					if err != nil {
						t.Fatalf("a warning without its generation: %s", line)
					}
					gens = append(gens, g)
				}
			}
			if uint64(len(gens)) == current || time.Now().After(deadline) {
				break
			}
		}
		slices.Sort(gens)
		for i, g := range gens {
			if g != uint64(i) {
				t.Fatalf("warnings for generations %v, want one for each of 0..%d; log:\n%s", gens, current-1, log)
			}
		}
		if len(gens) == 0 || uint64(len(gens)) != current || int64(len(gens)) > up.AuthFailures() {
			t.Fatalf("%d warnings for %d pool generations and %d failed logins; log:\n%s", len(gens), current, up.AuthFailures(), log)
		}
		if strings.Contains(log, wrongPassword) {
			t.Fatalf("the log shows the password:\n%s", log)
		}
	})
}

// TestUpstreamLoginWithFerretDB runs the Go driver through mongobouncer
// to FerretDB with authentication on: the route's service user logs in
// (negotiating SCRAM-SHA-256, without speculativeAuthenticate, in the long
// conversation, as FerretDB has them), inserts and finds work, and the
// upstream reports the service user; a route with a wrong password gives
// its clients code 18 naming it.
func TestUpstreamLoginWithFerretDB(t *testing.T) {
	fdb := ferretdb.Start(t, ferretdb.Options{Database: "app", Username: svcUser, Password: svcPassword})
	eachIO(t, func(t *testing.T) {
		_, addr := bouncer(t, "mongodb://"+svcUser+":"+svcPassword+"@"+fdb.Addr()+"/?authSource=app", nil)
		c := driver(t, addr, "")
		insertFind(t, c, "app")
		if u := serviceUserOf(t, c); u != "app."+svcUser {
			t.Fatalf("FerretDB says the connection is logged in as %s", u)
		}

		var logs logbuf.Buffer
		bad := bouncerLogging(t, "mongodb://"+svcUser+":"+wrongPassword+"@"+fdb.Addr()+"/?authSource=app", &logs)
		bc := driver(t, bad, "&retryReads=false")
		err := bc.Database("app").Collection("orders").FindOne(ctxT(t, 20*time.Second), bson.D{}).Err()
		var se mongo.ServerError
		if !errors.As(err, &se) || !se.HasErrorCode(18) || !strings.Contains(err.Error(), `route "*"`) {
			t.Fatalf("wrong password: %v, want code 18 naming the route", err)
		}
		if strings.Contains(logs.String(), wrongPassword) {
			t.Fatalf("the log shows the password:\n%s", logs.String())
		}
	})
}
