package e2e

// Caps that hold across pools (issue 30 item 3): max_db_connections over a
// pass-through route's user pools and its own, and max_user_client_conn
// over one user's client connections.

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/ferretdb"
	"github.com/mongobouncer/mongobouncer/internal/testutil/wait"
)

// TestPassThroughMaxDBConnections: three users, each allowed 2 upstream
// connections of their own, share max_db_connections = 2: the finds running
// upstream at once never exceed 2, every user's finds succeed within
// wait_queue_timeout (an idle user's connections make room for a waiting
// one), showPools and the configuration show the cap, and a reload changes
// it live.
func TestPassThroughMaxDBConnections(t *testing.T) {
	oneIO(t) // the cap is the pools' business, the same under every I/O model
	up, _ := passUp(t)
	var mu sync.Mutex
	running, peak := 0, 0
	seen := map[string]int{}
	up.Handle("find", func(req *fakemongo.Request) fakemongo.Reply {
		u := up.AuthenticatedUsers()[req.ConnID]
		mu.Lock()
		running++
		peak = max(peak, running)
		seen[u]++
		mu.Unlock()
		time.Sleep(5 * time.Millisecond)
		mu.Lock()
		running--
		mu.Unlock()
		return up.Builtin(req)
	})
	users := writeUsers(t, map[string]string{"alice@admin": "alice-pw", "bob@admin": "bob-pw", "carol@admin": "carol-pw"})
	extra := fmt.Sprintf("auth_type = \"scram\"\nauth_file = %q\nmax_user_connections = 2\nmax_db_connections = 2\nwait_queue_timeout = \"5s\"\nuser_pool_idle_timeout = \"1h\"\n", users)
	a, addr, path := fileBouncer(t, baseTOML(up.URI(), extra))
	ctx := ctxT(t, 60*time.Second)
	names := []string{"alice", "bob", "carol"}
	clients := map[string]*mongo.Client{}
	for _, u := range names {
		clients[u] = authDriver(t, addr, "", u, u+"-pw")
	}
	find := func(u string) error {
		err := clients[u].Database("shop").Collection("c").FindOne(ctx, bson.D{}).Err()
		if errors.Is(err, mongo.ErrNoDocuments) {
			err = nil
		}
		return err
	}

	// Alice alone fills the cap, then goes idle holding both connections.
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 5 {
				if err := find("alice"); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	// Bob is served by closing one of Alice's idle connections, at once.
	start := time.Now()
	if err := find("bob"); err != nil {
		t.Fatalf("bob starved while alice's connections sat idle: %v", err)
	}
	t.Logf("bob's first find took %v", time.Since(start))

	// A concurrent mix of the three users.
	errs := make(chan error, 16)
	for i := range 12 {
		wg.Go(func() {
			for range 10 {
				if err := find(names[i%3]); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a user starved: %v", err)
	}
	mu.Lock()
	if peak > 2 {
		t.Errorf("%d finds ran upstream at once, over max_db_connections = 2", peak)
	}
	for _, u := range names {
		if seen["admin."+u] == 0 {
			t.Errorf("no find of %s reached the upstream as %s: %v", u, u, seen)
		}
	}
	mu.Unlock()
	evictions := uint64(0)
	for _, p := range a.Pools() {
		if p.MaxDBConnections != 2 || p.DBConnections > 2 {
			t.Errorf("showPools row %s/%s: maxDbConnections %d, dbConnections %d", p.Server, p.User, p.MaxDBConnections, p.DBConnections)
		}
		evictions = p.DBEvictions
	}
	if evictions == 0 {
		t.Error("showPools counts no eviction")
	}
	if st := a.Stats(); st.DBEvictions == 0 || st.DBWaits == 0 {
		t.Errorf("showStats: dbWaits %d, dbEvictions %d", st.DBWaits, st.DBEvictions)
	}
	// Upstream, once closed sockets are gone: at most 2 logged-in connections.
	wait.Until(t, "the upstream's user connections within the cap", 5*time.Second, 10*time.Millisecond, func() bool {
		n := 0
		for _, u := range up.AuthenticatedUsers() {
			if u != "" {
				n++
			}
		}
		return n <= 2
	})

	// A reload changes the cap live, for showPools and SHOW CONFIG.
	toml, _ := os.ReadFile(path)
	if err := os.WriteFile(path, []byte(strings.Replace(string(toml), "max_db_connections = 2", "max_db_connections = 3", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	for _, p := range a.Pools() {
		if p.MaxDBConnections != 3 {
			t.Errorf("after the reload showPools says maxDbConnections %d, want 3", p.MaxDBConnections)
		}
	}
	routes, _ := a.Config()["databases"].(map[string]any)
	if r, _ := routes["*"].(map[string]any); r == nil || r["max_db_connections"] != 3 {
		t.Errorf("SHOW CONFIG route: %v", routes["*"])
	}
}

// TestMaxUserClientConn: the third login of a user over
// max_user_client_conn = 2 fails with HostUnreachable (6) and its
// connection is closed, while another user logs in; a disconnect frees the
// place (under every I/O model, whose loops end clients their own way).
func TestMaxUserClientConn(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		a, addr, _ := authSetupWith(t, up.URI(), nil, "max_user_client_conn = 2\n")
		login := func(user string) (*rawClient, bson.Raw) {
			r := dialRaw(t, addr)
			r.hello()
			return r, rawLogin(t, r, "SCRAM-SHA-256", user, authUsers[user], false)
		}
		b1, rep1 := login("bob")
		_, rep2 := login("bob")
		if okOf(rep1) != 1 || okOf(rep2) != 1 {
			t.Fatalf("bob's first two logins: %v, %v", rep1, rep2)
		}
		// Idle between requests: under the event loop the client is the
		// loop's now, and its disconnect is the loop's to count.
		if rep := b1.cmd(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}}); okOf(rep) != 1 {
			t.Fatalf("ping: %v", rep)
		}
		b3, rep3 := login("bob")
		if okOf(rep3) != 0 || codeOf(rep3) != 6 || !strings.Contains(rep3.String(), "max_user_client_conn = 2") {
			t.Fatalf("bob's third login: %v, want HostUnreachable naming max_user_client_conn", rep3)
		}
		if !b3.closed(5 * time.Second) {
			t.Fatal("the refused connection stays open")
		}
		if st := a.Stats(); st.UserClientRefused != 1 {
			t.Errorf("showStats userClientRefused %d, want 1", st.UserClientRefused)
		}
		if _, rep := login("app"); okOf(rep) != 1 {
			t.Fatalf("another user is refused too: %v", rep)
		}
		// A driver over the cap gets the error, not a credentials failure.
		err := authDriver(t, addr, "SCRAM-SHA-256", "bob", authUsers["bob"]).Ping(ctxT(t, 15*time.Second), nil)
		var ce mongo.CommandError
		if !errors.As(err, &ce) || ce.Code != 6 {
			t.Fatalf("a driver over the cap: %v, want code 6", err)
		}
		// A disconnect frees a place.
		b1.c.Close()
		wait.Until(t, "bob's disconnect counted", 5*time.Second, 10*time.Millisecond, func() bool {
			r := dialRaw(t, addr)
			r.hello()
			ok := okOf(rawLogin(t, r, "SCRAM-SHA-256", "bob", authUsers["bob"], false)) == 1
			r.c.Close()
			return ok
		})
	})
}

// TestPassThroughMaxDBConnectionsFerretDB: the same cap in front of
// FerretDB's own binary with SCRAM: three users log in upstream as
// themselves, each with 4 concurrent clients' worth of finds, over at most
// max_db_connections = 2 connections on the server, sampled all along in
// showPools; every find succeeds (no user starves) and idle connections
// were evicted for waiting users.
func TestPassThroughMaxDBConnectionsFerretDB(t *testing.T) {
	oneIO(t)
	s := ferretdb.Start(t, ferretdb.Options{Database: "app", Username: "owner", Password: "owner-pw"})
	ctx := ctxT(t, 120*time.Second)
	admin, err := mongo.Connect(options.Client().ApplyURI("mongodb://" + s.Addr() + "/?directConnection=true").
		SetAuth(options.Credential{Username: "owner", Password: "owner-pw", AuthSource: "app"}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = admin.Disconnect(ctxT(t, 5*time.Second)) })
	names := []string{"ann", "ben", "cid"}
	lines := map[string]string{}
	for _, u := range names {
		if err := admin.Database("app").RunCommand(ctx, bson.D{{Key: "createUser", Value: u},
			{Key: "pwd", Value: u + "-pw"}, {Key: "roles", Value: bson.A{}}}).Err(); err != nil {
			t.Fatalf("createUser %s: %v", u, err)
		}
		lines[u+"@app"] = u + "-pw"
	}
	users := writeUsers(t, lines)
	a, addr, _ := fileBouncer(t, baseTOML("mongodb://"+s.Addr()+"/?directConnection=true",
		fmt.Sprintf("auth_type = \"scram\"\nauth_file = %q\nmax_user_connections = 2\nmax_db_connections = 2\nwait_queue_timeout = \"20s\"\n", users)))
	clients := map[string]*mongo.Client{}
	for _, u := range names {
		c, err := mongo.Connect(options.Client().ApplyURI("mongodb://" + addr + "/?serverSelectionTimeoutMS=10000").SetAuth(
			options.Credential{AuthSource: "app", Username: u, Password: u + "-pw"}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Disconnect(ctxT(t, 5*time.Second)) })
		clients[u] = c
	}
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	var maxSeen, samples int
	sampler.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			for _, p := range a.Pools() {
				maxSeen = max(maxSeen, p.DBConnections)
			}
			samples++
		}
	})
	var wg sync.WaitGroup
	errs := make(chan error, 12)
	for i := range 12 {
		wg.Go(func() {
			u := names[i%3]
			for range 8 {
				err := clients[u].Database("app").Collection("caps").FindOne(ctx, bson.D{}).Err()
				if err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
					errs <- fmt.Errorf("%s: %w", u, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	sampler.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a user starved or failed: %v\nFerretDB log:\n%s", err, s.Log())
	}
	for _, u := range names {
		if got := connectionStatusUser(t, clients[u]); got != u+"@app" {
			t.Errorf("%s acts upstream as %q", u, got)
		}
	}
	var ev uint64
	for _, p := range a.Pools() {
		ev = max(ev, p.DBEvictions)
	}
	t.Logf("%d samples of showPools, at most %d connections counted; %d evictions", samples, maxSeen, ev)
	if maxSeen > 2 {
		t.Errorf("showPools counted %d connections on the server, over max_db_connections = 2", maxSeen)
	}
	if ev == 0 {
		t.Error("no idle connection was evicted for a waiting user")
	}
}
