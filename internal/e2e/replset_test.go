// mongobouncer in front of a replica set, end to end: the route names one
// member (a secondary) and replicaSet, mongobouncer discovers the rest, and
// the Go driver, connected to mongobouncer as to a mongos, reads and writes
// by read preference. The scripted set counts every member's requests, so
// each test checks where the work went, not only that it succeeded.

package e2e

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
	"go.mongodb.org/mongo-driver/v2/tag"

	"github.com/mongobouncer/mongobouncer/internal/app"
	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// rsBouncer starts mongobouncer with its "*" route seeded by member 1 of rs
// alone (a secondary, so the primary must be discovered) and waits until it
// sees every member usable.
//
// Its latency window is wide (local_threshold 1s): on a loaded machine one
// member's loopback round-trip time can spike past the default 15ms and
// leave the window for a while, as the spec says it should; these tests
// check where read preferences send reads, not the window (the selection
// spec suites and the topology tests do).
func rsBouncer(t *testing.T, rs *fakemongo.ReplicaSet, tweak func(*config.Config)) (*app.App, string) {
	t.Helper()
	wide := func(c *config.Config) {
		c.Global.LocalThreshold = time.Second
		if tweak != nil {
			tweak(c)
		}
	}
	a, addr := bouncer(t, rs.SeedURI(1), wide)
	waitUsable(t, a, len(rs.Members()))
	return a, addr
}

// opContext bounds one operation by cancelling it after d. It has no
// deadline on purpose: given a context with a deadline, the Go driver
// treats it as a client-side operation timeout and retries a retryable
// error as often as the deadline allows, which would hide from this test
// every error mongobouncer returns. Without one the driver retries once, as
// most drivers do.
func opContext(d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	stop := time.AfterFunc(d, cancel)
	return ctx, func() {
		stop.Stop()
		cancel()
	}
}

// cancelCtx is opContext for a whole test: cancelled after d or when the
// test ends.
func cancelCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := opContext(d)
	t.Cleanup(cancel)
	return ctx
}

// counts returns each member's count of cmd, by member index.
func counts(rs *fakemongo.ReplicaSet, cmd string) []int64 {
	ms := rs.Members()
	out := make([]int64, len(ms))
	for i, m := range ms {
		out[i] = m.Requests(cmd)
	}
	return out
}

// since returns now - before, element by element.
func since(before, now []int64) []int64 {
	out := make([]int64, len(now))
	for i := range now {
		out[i] = now[i] - before[i]
	}
	return out
}

func sum(v []int64) int64 {
	var n int64
	for _, x := range v {
		n += x
	}
	return n
}

// Discovery from one secondary seed, and every read preference mode: writes
// on the primary, reads where their mode (and tags) allow, spread over the
// members a mode allows.
func TestReplicaSetReadPreferenceThroughBouncer(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		rs := fakemongo.StartReplicaSet(t, fakemongo.ReplicaSetOptions{
			Tags: map[int]map[string]string{1: {"dc": "east"}, 2: {"dc": "west"}},
		})
		_, addr := rsBouncer(t, rs, nil)
		c := driver(t, addr, "")
		ctx := cancelCtx(t, 60*time.Second)

		ins := counts(rs, "insert")
		coll := c.Database("db").Collection("c")
		for i := range 10 {
			if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: i}}); err != nil {
				t.Fatal(err)
			}
		}
		if got := since(ins, counts(rs, "insert")); got[0] != 10 || got[1]+got[2] != 0 {
			t.Fatalf("inserts by member %v, want all 10 on the primary (member 0)", got)
		}

		west := readpref.Secondary(readpref.WithTagSets(tag.Set{{Name: "dc", Value: "west"}}))
		for _, tc := range []struct {
			name string
			rp   *readpref.ReadPref
			// allowed members, and how many of them at least must
			// serve some of the reads (selection spreads them; nearest
			// only over those within the latency window, which a
			// loaded machine's RTT samples may narrow).
			allowed []int
			used    int
		}{
			{"primary", readpref.Primary(), []int{0}, 1},
			{"primaryPreferred", readpref.PrimaryPreferred(), []int{0}, 1},
			{"secondary", readpref.Secondary(), []int{1, 2}, 2},
			{"secondaryPreferred", readpref.SecondaryPreferred(), []int{1, 2}, 2},
			{"nearest", readpref.Nearest(), []int{0, 1, 2}, 2},
			{"secondary dc:west", west, []int{2}, 1},
		} {
			const n = 100
			rc := c.Database("db").Collection("c", options.Collection().SetReadPreference(tc.rp))
			before := counts(rs, "find")
			for range n {
				var d bson.D
				if err := rc.FindOne(ctx, bson.D{}).Decode(&d); err != nil {
					t.Fatalf("%s: find: %v", tc.name, err)
				}
			}
			got := since(before, counts(rs, "find"))
			var onAllowed int64
			used := 0
			for _, i := range tc.allowed {
				onAllowed += got[i]
				if got[i] > 0 {
					used++
				}
			}
			if used < tc.used {
				t.Errorf("%s: finds by member %v: %d of members %v served some, want at least %d", tc.name, got, used, tc.allowed, tc.used)
			}
			if onAllowed != n || sum(got) != n {
				t.Errorf("%s: finds by member %v, want all %d on members %v", tc.name, got, n, tc.allowed)
			}
			t.Logf("%s: finds by member %v", tc.name, got)
		}
	})
}

// A cursor opened on a secondary is read to its end on that secondary: each
// getMore goes to the member that ran its find.
func TestReplicaSetGetMoreFollowsCursorThroughBouncer(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		rs := fakemongo.StartReplicaSet(t, fakemongo.ReplicaSetOptions{})
		_, addr := rsBouncer(t, rs, nil)
		c := driver(t, addr, "")
		ctx := cancelCtx(t, 60*time.Second)
		docs := make([]any, 10)
		for i := range docs {
			docs[i] = bson.D{{Key: "_id", Value: i}}
		}
		if _, err := c.Database("db").Collection("c").InsertMany(ctx, docs); err != nil {
			t.Fatal(err)
		}
		rc := c.Database("db").Collection("c", options.Collection().SetReadPreference(readpref.Secondary()))
		opened := make([]int, 3)
		for k := range 12 {
			f0, g0 := counts(rs, "find"), counts(rs, "getMore")
			cur, err := rc.Find(ctx, bson.D{}, options.Find().SetBatchSize(2))
			if err != nil {
				t.Fatal(err)
			}
			var got []bson.D
			if err := cur.All(ctx, &got); err != nil {
				t.Fatalf("cursor %d: %v", k, err)
			}
			if len(got) != 10 {
				t.Fatalf("cursor %d read %d documents, want 10", k, len(got))
			}
			f, g := since(f0, counts(rs, "find")), since(g0, counts(rs, "getMore"))
			on := -1
			for i := range f {
				if f[i] == 1 {
					on = i
				}
			}
			if sum(f) != 1 || on == 0 {
				t.Fatalf("cursor %d: finds by member %v, want one on a secondary", k, f)
			}
			if g[on] < 4 || sum(g) != g[on] {
				t.Fatalf("cursor %d opened on member %d: getMores by member %v, want every one (at least 4) there", k, on, g)
			}
			opened[on]++
		}
		if opened[1] == 0 || opened[2] == 0 {
			t.Errorf("cursors opened by member %v: selection never used one secondary", opened)
		}
	})
}

// A transaction runs on the primary even from a collection whose read
// preference is secondary: the driver sends the transaction's (primary)
// read preference, and mongobouncer keeps every command of a transaction on
// the primary, which the members' counters and transaction log show.
func TestReplicaSetTransactionOnPrimaryThroughBouncer(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		rs := fakemongo.StartReplicaSet(t, fakemongo.ReplicaSetOptions{})
		_, addr := rsBouncer(t, rs, nil)
		c := driver(t, addr, "")
		ctx := cancelCtx(t, 60*time.Second)
		rc := c.Database("db").Collection("c", options.Collection().SetReadPreference(readpref.Secondary()))
		if _, err := c.Database("db").Collection("c").InsertOne(ctx, bson.D{{Key: "_id", Value: "seed"}}); err != nil {
			t.Fatal(err)
		}
		f0, i0, c0 := counts(rs, "find"), counts(rs, "insert"), counts(rs, "commitTransaction")
		sess, err := c.StartSession()
		if err != nil {
			t.Fatal(err)
		}
		defer sess.EndSession(context.Background())
		_, err = sess.WithTransaction(ctx, func(ctx context.Context) (any, error) {
			if _, err := rc.InsertOne(ctx, bson.D{{Key: "_id", Value: "txn"}}); err != nil {
				return nil, err
			}
			var d bson.D
			return nil, rc.FindOne(ctx, bson.D{{Key: "_id", Value: "seed"}}).Decode(&d)
		})
		if err != nil {
			t.Fatalf("transaction: %v", err)
		}
		for _, x := range []struct {
			cmd  string
			diff []int64
		}{
			{"find", since(f0, counts(rs, "find"))},
			{"insert", since(i0, counts(rs, "insert"))},
			{"commitTransaction", since(c0, counts(rs, "commitTransaction"))},
		} {
			if x.diff[0] != 1 || x.diff[1]+x.diff[2] != 0 {
				t.Errorf("%s by member %v, want one, on the primary (member 0)", x.cmd, x.diff)
			}
		}
		var committed int
		for _, tx := range rs.Transactions() {
			if tx.State == fakemongo.TxnCommitted {
				committed++
			}
		}
		if committed != 1 {
			t.Fatalf("the set committed %d transactions, want 1: %+v", committed, rs.Transactions())
		}
	})
}

// mongobouncer's hello is a mongos's: it names no member, set or primary,
// so a driver never learns the members and never connects around it.
func TestReplicaSetHandshakeHidesMembers(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		rs := fakemongo.StartReplicaSet(t, fakemongo.ReplicaSetOptions{})
		a, addr := rsBouncer(t, rs, nil)
		c := driver(t, addr, "")
		ctx := ctxT(t, 30*time.Second)
		ours, _ := a.Server().TopologyVersion()
		for _, cmd := range []string{"hello", "isMaster"} {
			raw, err := c.Database("admin").RunCommand(ctx, bson.D{{Key: cmd, Value: 1}}).Raw()
			if err != nil {
				t.Fatalf("%s: %v", cmd, err)
			}
			if msg, _ := raw.Lookup("msg").StringValueOK(); msg != "isdbgrid" {
				t.Errorf("%s: msg %q, want isdbgrid: %v", cmd, msg, raw)
			}
			for _, f := range []string{"hosts", "passives", "arbiters", "setName", "setVersion", "primary", "secondary",
				"me", "electionId", "tags", "lastWrite"} {
				if _, err := raw.LookupErr(f); err == nil {
					t.Errorf("%s: the reply has %q: %v", cmd, f, raw)
				}
			}
			// A topologyVersion, mongobouncer's own, not a member's.
			if pid, ok := raw.Lookup("topologyVersion", "processId").ObjectIDOK(); !ok || pid != ours {
				t.Errorf("%s: topologyVersion %v, want mongobouncer's (processId %v)", cmd, raw.Lookup("topologyVersion"), ours)
			}
		}
	})
}

// mongosh through mongobouncer to a replica set, with each read preference
// mode: its finds reach the members the mode allows, by the members' counts
// (exact, so a read preference lost on the way shows as finds on the wrong
// member). One mongosh per mode, so each mode's counts are its own.
func TestReplicaSetMongoshReadPreference(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		sh := mongoshPath(t)
		rs := fakemongo.StartReplicaSet(t, fakemongo.ReplicaSetOptions{})
		_, addr := rsBouncer(t, rs, nil)
		const n = 20
		run := func(mode, eval string) string {
			t.Helper()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, sh, "mongodb://"+addr+"/test?serverSelectionTimeoutMS=10000&readPreference="+mode,
				"--quiet", "--norc", "--eval", eval)
			home := t.TempDir()
			cmd.Env = append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+home, "NO_COLOR=1")
			cmd.Dir = home
			cmd.WaitDelay = 5 * time.Second
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("mongosh (%s): %v (ctx %v); output:\n%s", mode, err, ctx.Err(), out)
			}
			return strings.TrimSpace(strings.ReplaceAll(string(out), "\r\n", "\n"))
		}
		i0 := counts(rs, "insert")
		if out := run("primary", `db.getSiblingDB("db").c.insertMany([{_id: 1}, {_id: 2}, {_id: 3}]); print("ok")`); out != "ok" {
			t.Fatalf("mongosh insert: %s", out)
		}
		if ins := since(i0, counts(rs, "insert")); ins[0] != 1 || ins[1]+ins[2] != 0 {
			t.Errorf("inserts by member %v, want the one on the primary (member 0)", ins)
		}
		for _, tc := range []struct {
			mode    string
			allowed []int
		}{
			{"primary", []int{0}},
			{"primaryPreferred", []int{0}},
			{"secondary", []int{1, 2}},
			{"secondaryPreferred", []int{1, 2}},
			{"nearest", []int{0, 1, 2}},
		} {
			// The URI's mode, and setReadPref for the same mode, as a
			// shell user would type it.
			eval := `db.getMongo().setReadPref("` + tc.mode + `");
const c = db.getSiblingDB("db").c;
let read = 0;
for (let i = 0; i < ` + strconv.Itoa(n) + `; i++) read += c.find().toArray().length;
print(read);`
			f0 := counts(rs, "find")
			if out := run(tc.mode, eval); out != strconv.Itoa(3*n) {
				t.Fatalf("%s: mongosh output %q, want %d", tc.mode, out, 3*n)
			}
			f := since(f0, counts(rs, "find"))
			var on int64
			for _, i := range tc.allowed {
				on += f[i]
			}
			t.Logf("%s: finds by member %v", tc.mode, f)
			if on != n || sum(f) != n {
				t.Errorf("%s: finds by member %v, want all %d on members %v", tc.mode, f, n, tc.allowed)
			}
		}
	})
}
