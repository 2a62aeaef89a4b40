package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/xdg-go/scram"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/auth"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// TestLoginCost measures issue 19's "a SCRAM login through mongobouncer
// costs at most 1.2x a direct login": each login is a new TCP connection,
// hello, saslStart and saslContinue (SCRAM-SHA-256, skipEmptyExchange),
// straight to a fakemongo with the user, or to a mongobouncer
// (auth_type = "scram", the user's plain password in auth_file, a route
// logged in upstream as a service user) in front of it. Both sides use
// mongod's default 15000 iterations, so the client's PBKDF2 work is the
// same. Rounds alternate the two targets; the figure is the ratio of the
// medians. "fresh" derives the client's keys for every login (a new
// process per login), "cached" reuses them as a driver does for its pool.
// It runs on demand only (MONGOBOUNCER_LOGIN_COST=1): it is a
// measurement, and the shared machine makes its timing noisy.
// MONGOBOUNCER_LOGIN_COST_VARIANT picks one variant ("hello" measures the
// handshake without a login).
func TestLoginCost(t *testing.T) {
	if os.Getenv("MONGOBOUNCER_LOGIN_COST") == "" {
		t.Skip("a measurement: set MONGOBOUNCER_LOGIN_COST=1")
	}
	// MONGOBOUNCER_LOGIN_COST_IO=goroutine measures without the event loop.
	if os.Getenv("MONGOBOUNCER_LOGIN_COST_IO") == "goroutine" {
		setIOModel(t, ioGoroutine)
	} else {
		oneIO(t)
	}
	const pw = "login-cost-pw"
	up := fakemongo.Start(t, fakemongo.Options{InMemory: true, Users: []fakemongo.User{
		{Name: "svc", Password: "svc-pw"},
		{Name: "app", Password: pw, Iterations: auth.DefaultIterationsSHA256, Mechanisms: []string{fakemongo.MechSCRAMSHA256}},
	}})
	users := filepath.Join(t.TempDir(), "users.txt")
	if err := os.WriteFile(users, []byte(fmt.Sprintf("%q %q\n", "app@admin", pw)), 0o600); err != nil {
		t.Fatal(err)
	}
	uri := fmt.Sprintf("mongodb://svc:svc-pw@%s/?directConnection=true", up.Addr())
	_, mb, _ := fileBouncer(t, baseTOML(uri, fmt.Sprintf("auth_type = \"scram\"\nauth_file = %q\n", users)))

	const rounds, perRound = 9, 30
	for _, variant := range loginVariants() {
		clients := map[string]*scram.Client{}
		login := func(addr string) {
			cl := clients[addr]
			if cl == nil || variant == "fresh" {
				var err error
				if cl, err = scram.SHA256.NewClient("app", pw, ""); err != nil {
					t.Fatal(err)
				}
				clients[addr] = cl
			}
			r := dialRaw(t, addr)
			defer r.c.Close()
			// A driver's handshake on a connection it logs in on asks
			// the user's mechanisms.
			r.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "helloOk", Value: true},
				{Key: "saslSupportedMechs", Value: "admin.app"}, {Key: "$db", Value: "admin"}})
			if variant == "hello" {
				return
			}
			if rep := scramLogin(t, r, cl); okOf(rep) != 1 {
				t.Fatalf("login to %s: %v", addr, rep)
			}
		}
		login(up.Addr()) // warm both
		login(mb)
		var direct, through []time.Duration
		for i := range rounds {
			order := []string{up.Addr(), mb}
			if i%2 == 1 {
				order = []string{mb, up.Addr()}
			}
			for _, addr := range order {
				start := time.Now()
				for range perRound {
					login(addr)
				}
				d := time.Since(start) / perRound
				if addr == mb {
					through = append(through, d)
				} else {
					direct = append(direct, d)
				}
			}
		}
		slices.Sort(direct)
		slices.Sort(through)
		md, mt := direct[rounds/2], through[rounds/2]
		ratio := float64(mt) / float64(md)
		t.Logf("%s keys: direct median %v/login, through mongobouncer %v/login: %.2fx (direct %v, through %v)", variant, md, mt, ratio, direct, through)
		// The target is 1.2x; single runs on the shared machine
		// scatter by +-0.2 around their median (docs/performance.md), so
		// the test fails only on a clear regression, such as the event
		// loop hand-offs between SCRAM steps that made it 2x.
		if ratio > 1.5 {
			t.Errorf("%s keys: a login through mongobouncer costs %.2fx a direct one (target 1.2x)", variant, ratio)
		}
	}
}

// scramLogin runs SCRAM-SHA-256 with skipEmptyExchange on r as cl's user
// on admin, and returns the last reply.
func scramLogin(t testing.TB, r *rawClient, cl *scram.Client) bson.Raw {
	t.Helper()
	conv := cl.NewConversation()
	c1, _ := conv.Step("")
	rep := r.cmd(bson.D{{Key: "saslStart", Value: 1}, {Key: "mechanism", Value: "SCRAM-SHA-256"},
		{Key: "payload", Value: bson.Binary{Data: []byte(c1)}},
		{Key: "options", Value: bson.D{{Key: "skipEmptyExchange", Value: true}}}, {Key: "$db", Value: "admin"}})
	for range 3 {
		if okOf(rep) != 1 {
			return rep
		}
		if done, _ := rep.Lookup("done").BooleanOK(); done {
			if _, in, _ := rep.Lookup("payload").BinaryOK(); !conv.Done() {
				_, _ = conv.Step(string(in)) // the server-final message: its proof
			}
			if !conv.Valid() {
				t.Fatal("the server's proof did not verify")
			}
			return rep
		}
		_, in, _ := rep.Lookup("payload").BinaryOK()
		out, err := conv.Step(string(in))
		if err != nil {
			t.Fatalf("client step: %v", err)
		}
		rep = r.cmd(bson.D{{Key: "saslContinue", Value: 1}, {Key: "conversationId", Value: rep.Lookup("conversationId")},
			{Key: "payload", Value: bson.Binary{Data: []byte(out)}}, {Key: "$db", Value: "admin"}})
	}
	t.Fatal("the conversation did not end")
	return nil
}

// loginVariants are TestLoginCost's variants, MONGOBOUNCER_LOGIN_COST_VARIANT
// picking one.
func loginVariants() []string {
	if v := os.Getenv("MONGOBOUNCER_LOGIN_COST_VARIANT"); v != "" {
		return []string{v}
	}
	return []string{"fresh", "cached"}
}
