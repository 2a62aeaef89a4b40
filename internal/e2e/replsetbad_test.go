// Replica-set routes whose servers do not answer as the route says:
// a standalone seed of a route that names replicaSet, and a member that
// reports another set's name. SDAM removes such servers; mongobouncer must
// then never use them, fail requests with a clear, retryable error naming
// the route, and stay up.

package e2e

import (
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// A route naming replicaSet=rs0 whose seed is a standalone: the standalone
// is removed from the topology, so a command waits server_selection_timeout
// and fails with HostUnreachable naming the route, while mongobouncer keeps
// answering hello and the standalone serves nothing.
func TestReplicaSetStandaloneSeedRefused(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		const selTimeout = time.Second
		_, addr := bouncer(t, "mongodb://"+up.Addr()+"/?replicaSet=rs0", func(c *config.Config) {
			c.Global.ServerSelectionTimeout = selTimeout
		})
		r := dialRaw(t, addr)
		if h := r.hello(); okOf(h) != 1 {
			t.Fatalf("hello: %v", h)
		}
		waitFor(t, "the standalone checked", func() bool { return up.Requests("hello")+up.Requests("isMaster") > 0 })

		start := time.Now()
		rep := r.cmd(bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{bson.D{{Key: "_id", Value: 1}}}},
			{Key: "$db", Value: "db"}})
		took := time.Since(start)
		msg, _ := rep.Lookup("errmsg").StringValueOK()
		if okOf(rep) != 0 || codeOf(rep) != 6 || !strings.Contains(msg, `route "*"`) {
			t.Fatalf("insert through a route seeded by a standalone: %v; want HostUnreachable (6) naming route \"*\"", rep)
		}
		if labels, _ := rep.Lookup("errorLabels").ArrayOK(); !strings.Contains(labels.String(), `"RetryableWriteError"`) {
			t.Errorf("the insert's error has labels %v, want RetryableWriteError", labels)
		}
		if took < selTimeout/2 || took > selTimeout+5*time.Second {
			t.Errorf("the insert failed after %v, want about server_selection_timeout (%v)", took, selTimeout)
		}
		t.Logf("after %v: %s", took.Round(time.Millisecond), msg)
		if n := up.Requests("insert"); n != 0 {
			t.Fatalf("the standalone served %d inserts", n)
		}

		// Still up: the same client and a new one get their hello.
		if h := r.hello(); okOf(h) != 1 {
			t.Fatalf("hello after the failure: %v", h)
		}
		if h := dialRaw(t, addr).hello(); okOf(h) != 1 {
			t.Fatalf("a new client's hello: %v", h)
		}
	})
}

// otherSetName makes srv's hello say it belongs to set "other", without
// topologyVersion, so the monitor polls it rather than streaming (a
// handler's awaitable hello is answered at once).
func otherSetName(t *testing.T, srv *fakemongo.Server) {
	srv.Handle("hello", func(req *fakemongo.Request) fakemongo.Reply {
		r := srv.Builtin(req)
		var d bson.D
		if err := bson.Unmarshal(r.Docs[0], &d); err != nil {
			t.Errorf("hello: %v", err)
			return r
		}
		out := make(bson.D, 0, len(d))
		for _, e := range d {
			switch e.Key {
			case "topologyVersion":
				continue
			case "setName":
				e.Value = "other"
			}
			out = append(out, e)
		}
		return fakemongo.Docs(out)
	})
}

// A member that reports another set's name is removed (the primary's host
// list brings it back as unknown, and its next check removes it again):
// neither writes nor any read preference ever reach it.
func TestReplicaSetMemberOfAnotherSetNeverSelected(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		rs := fakemongo.StartReplicaSet(t, fakemongo.ReplicaSetOptions{})
		otherSetName(t, rs.Member(2).Server())
		a, addr := bouncer(t, rs.SeedURI(1), nil)
		waitUsable(t, a, 2)
		waitFor(t, "member 2 checked", func() bool { return rs.Member(2).Requests("hello") > 0 })
		c := driver(t, addr, "")
		ctx := cancelCtx(t, 60*time.Second)
		if _, err := c.Database("db").Collection("c").InsertOne(ctx, bson.D{{Key: "_id", Value: 1}}); err != nil {
			t.Fatal(err)
		}
		for _, rp := range []*readpref.ReadPref{readpref.Secondary(), readpref.SecondaryPreferred(), readpref.Nearest()} {
			rc := c.Database("db").Collection("c", options.Collection().SetReadPreference(rp))
			for range 50 {
				var d bson.D
				if err := rc.FindOne(ctx, bson.D{}).Decode(&d); err != nil {
					t.Fatalf("%v: find: %v", rp.Mode(), err)
				}
			}
		}
		f := counts(rs, "find")
		if f[2] != 0 || rs.Member(2).Requests("insert") != 0 {
			t.Fatalf("member 2 (setName \"other\") served %d finds and %d inserts; finds by member %v",
				f[2], rs.Member(2).Requests("insert"), f)
		}
		if f[1] == 0 {
			t.Fatalf("finds by member %v: the good secondary served none", f)
		}
		for _, tp := range a.Topologies() {
			for _, s := range tp.Servers() {
				t.Logf("server %s: %v %v", s.Address(), s.State(), s.Kind())
			}
		}
	})
}
