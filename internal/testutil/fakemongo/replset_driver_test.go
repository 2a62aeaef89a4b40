package fakemongo

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver"
)

// connectURI connects the Go driver to uri and disconnects it when the
// test ends (before the fixture closes: cleanups run last-in first-out).
func connectURI(t *testing.T, uri string, tweak func(*options.ClientOptions)) *mongo.Client {
	t.Helper()
	o := options.Client().ApplyURI(uri).
		SetServerSelectionTimeout(15 * time.Second).
		SetConnectTimeout(5 * time.Second)
	if tweak != nil {
		tweak(o)
	}
	c, err := mongo.Connect(o)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Disconnect(ctx); err != nil {
			t.Errorf("disconnect: %v", err)
		}
	})
	return c
}

// topologyWatcher keeps the driver's latest topology description.
type topologyWatcher struct {
	mu   sync.Mutex
	last event.TopologyDescription
}

func (w *topologyWatcher) monitor() *event.ServerMonitor {
	return &event.ServerMonitor{TopologyDescriptionChanged: func(e *event.TopologyDescriptionChangedEvent) {
		w.mu.Lock()
		w.last = e.NewDescription
		w.mu.Unlock()
	}}
}

// kinds returns the topology kind and each server's kind by address.
func (w *topologyWatcher) kinds() (string, map[string]string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := map[string]string{}
	for _, s := range w.last.Servers {
		m[s.Addr.String()] = s.Kind
	}
	return w.last.Kind, m
}

// waitTopology waits up to limit for the driver to see primary (an index,
// -1 for none) and the other members of rs as secondaries.
func (w *topologyWatcher) waitTopology(t *testing.T, rs *ReplicaSet, primary int, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		kind, servers := w.kinds()
		ok := len(servers) == len(rs.Members())
		for i, m := range rs.Members() {
			want := "RSSecondary"
			if i == primary {
				want = "RSPrimary"
			}
			ok = ok && servers[m.Addr()] == want
		}
		if wantKind := map[bool]string{true: "ReplicaSetWithPrimary", false: "ReplicaSetNoPrimary"}[primary >= 0]; ok && kind == wantKind {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v the driver sees %s %v, want member %d primary", limit, kind, servers, primary)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestReplicaSetDriverDiscoveryAndStreaming(t *testing.T) {
	rs := StartReplicaSet(t, ReplicaSetOptions{})
	var w topologyWatcher
	// A heartbeat far above the 2 s bounds below, so that only the
	// streamed awaitable hello can tell the driver of a change in time;
	// not longer, because the Go driver's Disconnect sometimes waits for an
	// awaitable hello in flight to end (maxAwaitTimeMS = the heartbeat).
	c := connectURI(t, rs.SeedURI(0), func(o *options.ClientOptions) {
		o.SetServerMonitor(w.monitor()).SetHeartbeatInterval(10 * time.Second).
			SetServerMonitoringMode(options.ServerMonitoringModeStream)
	})
	if err := c.Ping(testCtx(t), readpref.Primary()); err != nil {
		t.Fatal(err)
	}
	w.waitTopology(t, rs, 0, 10*time.Second)
	for i := 1; i < 3; i++ {
		m := rs.Member(i)
		if m.Requests("hello")+m.Requests("isMaster")+m.Requests("ismaster") == 0 {
			t.Fatalf("the driver never asked member %d", i)
		}
	}

	if err := rs.StepDown(0); err != nil {
		t.Fatal(err)
	}
	w.waitTopology(t, rs, -1, 2*time.Second)
	if err := rs.Elect(2); err != nil {
		t.Fatal(err)
	}
	w.waitTopology(t, rs, 2, 2*time.Second)
	if err := c.Ping(testCtx(t), readpref.Primary()); err != nil {
		t.Fatal(err)
	}
}

func TestReplicaSetDriverReadsFromSecondaries(t *testing.T) {
	rs := StartReplicaSet(t, ReplicaSetOptions{})
	var mu sync.Mutex
	servedBy := map[string]int{}
	mon := &event.CommandMonitor{Succeeded: func(_ context.Context, e *event.CommandSucceededEvent) {
		if e.CommandName == "find" {
			addr, _ := e.Reply.Lookup(ServedByField).StringValueOK()
			mu.Lock()
			servedBy[addr]++
			mu.Unlock()
		}
	}}
	c := connectURI(t, rs.SeedURI(0)+"&readPreference=secondary", func(o *options.ClientOptions) { o.SetMonitor(mon) })
	ctx := testCtx(t)
	coll := c.Database("db").Collection("c")
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}}); err != nil {
		t.Fatalf("insert with readPreference=secondary: %v", err)
	}
	const finds = 20
	for range finds {
		var got bson.D
		if err := coll.FindOne(ctx, bson.D{}).Decode(&got); err != nil {
			t.Fatalf("find: %v", err)
		}
	}
	m := rs.Members()
	if n := m[0].Requests("find"); n != 0 {
		t.Fatalf("the primary served %d finds", n)
	}
	if n := m[1].Requests("find") + m[2].Requests("find"); n != finds {
		t.Fatalf("the secondaries served %d finds, want %d", n, finds)
	}
	if m[0].Requests("insert") != 1 || m[1].Requests("insert")+m[2].Requests("insert") != 0 {
		t.Fatal("the insert did not go to the primary alone")
	}
	mu.Lock()
	defer mu.Unlock()
	if servedBy[m[1].Addr()]+servedBy[m[2].Addr()] != finds {
		t.Fatalf("find replies name %v", servedBy)
	}
}

// insertThrough runs retryable inserts through a driver connected to rs,
// starts disrupt (which returns the new primary) after 50 of them, and
// goes on until 50 more have run after disrupt returned. It fails the test
// if any insert fails, if a document is missing or stored twice, or if the
// new primary took no insert.
func insertThrough(t *testing.T, rs *ReplicaSet, disrupt func() (int, error)) {
	t.Helper()
	var retried atomic.Int64
	mon := &event.CommandMonitor{Failed: func(_ context.Context, e *event.CommandFailedEvent) {
		retried.Add(1)
		t.Logf("attempt failed: %s on %s: %v", e.CommandName, e.ConnectionID, e.Failure)
	}}
	// The pool's and the monitors' events are logged too: a test that
	// fails here on a loaded machine must say which step of the driver's
	// retry failed, since the driver returns only the first attempt's error.
	start := time.Now()
	since := func() time.Duration { return time.Since(start).Round(time.Millisecond) }
	pm := &event.PoolMonitor{Event: func(e *event.PoolEvent) {
		switch e.Type {
		case event.ConnectionCheckOutFailed, event.ConnectionPoolCleared, event.ConnectionPoolReady, event.ConnectionClosed:
			t.Logf("%v pool %s %s: %s %v", since(), e.Address, e.Type, e.Reason, e.Error)
		}
	}}
	sm := &event.ServerMonitor{ServerDescriptionChanged: func(e *event.ServerDescriptionChangedEvent) {
		t.Logf("%v server %s: %s -> %s", since(), e.Address, e.PreviousDescription.Kind, e.NewDescription.Kind)
	}}
	c := connectURI(t, rs.URI(), func(o *options.ClientOptions) { o.SetMonitor(mon).SetPoolMonitor(pm).SetServerMonitor(sm) })
	ctx := testCtx(t)
	coll := c.Database("db").Collection("c")

	var done atomic.Bool
	newPrimary := make(chan int, 1)
	const before, after, maxInserts = 50, 50, 5000
	var errs []error
	n := 0
	deadline := time.Now().Add(15 * time.Second)
	for afterDone := 0; afterDone < after && n < maxInserts && time.Now().Before(deadline); n++ {
		if n == before {
			go func() {
				t.Logf("%v disruption starts", since())
				p, err := disrupt()
				t.Logf("%v disruption done", since())
				if err != nil {
					t.Errorf("disruption: %v", err)
				}
				newPrimary <- p
				done.Store(true)
			}()
		}
		_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: n}})
		if pausedPoolNotRetried(err) {
			t.Logf("%v insert %d: the driver did not retry a PoolClearedError, run again: %v", since(), n, err)
			_, err = coll.InsertOne(ctx, bson.D{{Key: "_id", Value: n}})
		}
		if err != nil {
			t.Logf("%v insert %d failed: %v", since(), n, err)
			errs = append(errs, err)
		}
		if done.Load() {
			afterDone++
		}
	}
	t.Logf("%d inserts, %d attempts failed and were retried", n, retried.Load())
	if len(errs) > 0 {
		t.Fatalf("%d of %d inserts failed, first: %v", len(errs), n, errs[0])
	}
	if !done.Load() {
		t.Fatalf("the disruption did not finish during %d inserts", n)
	}
	p := <-newPrimary
	if p <= 0 || rs.Member(p).Requests("insert") == 0 {
		t.Fatalf("new primary %d took no insert", p)
	}
	docs := rs.Collection("db", "c")
	ids := make([]int, 0, len(docs))
	for _, d := range docs {
		id, _ := d.Lookup("_id").AsInt64OK()
		ids = append(ids, int(id))
	}
	slices.Sort(ids)
	if len(ids) != n || len(ids) > 0 && (ids[0] != 0 || ids[len(ids)-1] != n-1) || len(slices.Compact(ids)) != n {
		t.Fatalf("%d acknowledged inserts, %d documents stored", n, len(docs))
	}
}

// pausedPoolNotRetried reports whether err is the Go driver's
// PoolClearedError from a checkout that found the pool already paused. The
// driver (v2.9.3, pool.go) wraps that one in a driver.Error to add the
// TransientTransactionError label, and its retry loop then fails to
// recognise it as a RetryablePoolError, so the write is not retried,
// against the retryable-writes spec. The server was selected just before
// its monitor cleared the pool: a window of microseconds that a loaded
// machine widens. No connection was made, so the write was not performed,
// and running it again is what the driver should have done.
func pausedPoolNotRetried(err error) bool {
	var de driver.Error
	return errors.As(err, &de) && de.HasErrorLabel(driver.TransientTransactionError) &&
		strings.Contains(de.Message, "was cleared because another operation failed")
}

func TestReplicaSetDriverFailoverLosesNoRetryableWrite(t *testing.T) {
	rs := StartReplicaSet(t, ReplicaSetOptions{ElectionDelay: 300 * time.Millisecond})
	insertThrough(t, rs, rs.Failover)
}

func TestReplicaSetDriverPrimaryKilledLosesNoRetryableWrite(t *testing.T) {
	rs := StartReplicaSet(t, ReplicaSetOptions{})
	insertThrough(t, rs, func() (int, error) {
		if err := rs.Kill(0); err != nil {
			return -1, err
		}
		time.Sleep(300 * time.Millisecond) // the election timeout, scaled down
		return 1, rs.Elect(1)
	})
}

func TestReplicaSetDriverKillReviveSecondary(t *testing.T) {
	rs := StartReplicaSet(t, ReplicaSetOptions{})
	var w topologyWatcher
	c := connectURI(t, rs.URI()+"&readPreference=secondary", func(o *options.ClientOptions) {
		o.SetServerMonitor(w.monitor()).SetHeartbeatInterval(500 * time.Millisecond)
	})
	ctx := testCtx(t)
	coll := c.Database("db").Collection("c")
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}}); err != nil {
		t.Fatal(err)
	}
	w.waitTopology(t, rs, 0, 10*time.Second)
	find := func(phase string) {
		t.Helper()
		var got bson.D
		if err := coll.FindOne(ctx, bson.D{}).Decode(&got); err != nil {
			t.Fatalf("%s: find: %v", phase, err)
		}
	}

	if err := rs.Kill(1); err != nil {
		t.Fatal(err)
	}
	// The monitor's streaming connection closes with the member, so the
	// driver notices at once. (A read already routed to the dead member
	// may fail even after its one retry, as with a real set: the driver
	// can retry on the same server before it is marked Unknown.)
	deadline := time.Now().Add(5 * time.Second)
	for _, k := w.kinds(); k[rs.Member(1).Addr()] != "Unknown"; _, k = w.kinds() {
		if time.Now().After(deadline) {
			t.Fatalf("the driver still sees the killed member as %v", k)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Reads keep working on the other secondary.
	for range 20 {
		find("member 1 down")
	}
	first := rs.Member(1).Server()
	if err := rs.Revive(1); err != nil {
		t.Fatal(err)
	}
	if rs.Member(1).Server() == first {
		t.Fatal("Revive kept the old server")
	}
	// The driver rediscovers the revived member and reads from it again.
	deadline = time.Now().Add(15 * time.Second)
	for rs.Member(1).Server().Requests("find") == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no find reached the revived member; the driver sees %v", func() map[string]string { _, k := w.kinds(); return k }())
		}
		find("member 1 revived")
		time.Sleep(5 * time.Millisecond)
	}
	if rs.Member(0).Requests("find") != 0 {
		t.Fatal("a find went to the primary")
	}
}
