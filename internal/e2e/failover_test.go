// A replica-set failover under write load, measured through mongobouncer:
// what a driver sees (errors, closed connections, the longest pause between
// two acknowledged writes) while the primary steps down or dies, the set
// has no primary for an election delay, another member is elected, and then
// a secondary dies and comes back. docs/operations.md ("Failover") quotes the
// figures this test logs.

package e2e

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// driverEvents counts what the Go driver saw of its connections to
// mongobouncer: pool connections closed (for any reason but the client's
// own Disconnect), heartbeat failures, and command attempts that failed
// (and were retried, or returned).
type driverEvents struct {
	closed, created, heartbeatFailed, attemptsFailed atomic.Int64
	mu                                               sync.Mutex
	notes                                            []string
}

func (d *driverEvents) note(format string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.notes) < 20 {
		d.notes = append(d.notes, fmt.Sprintf(format, args...))
	}
}

func (d *driverEvents) options(o *options.ClientOptions) *options.ClientOptions {
	return o.SetPoolMonitor(&event.PoolMonitor{Event: func(e *event.PoolEvent) {
		switch e.Type {
		case event.ConnectionCreated:
			d.created.Add(1)
		case event.ConnectionClosed:
			d.closed.Add(1)
			d.note("connection %d closed: %s (%v)", e.ConnectionID, e.Reason, e.Error)
		}
	}}).SetServerMonitor(&event.ServerMonitor{ServerHeartbeatFailed: func(e *event.ServerHeartbeatFailedEvent) {
		d.heartbeatFailed.Add(1)
		d.note("heartbeat failed: %v", e.Failure)
	}}).SetMonitor(&event.CommandMonitor{Failed: func(_ context.Context, e *event.CommandFailedEvent) {
		d.attemptsFailed.Add(1)
		d.note("%s attempt failed after %v: %v", e.CommandName, e.Duration, e.Failure)
	}})
}

// ack is one acknowledged insert.
type ack struct {
	id int64
	at time.Time
}

// longestGap returns the longest time between two consecutive
// acknowledgements and when it began.
func longestGap(acks []ack) (time.Duration, time.Time) {
	slices.SortFunc(acks, func(a, b ack) int { return a.at.Compare(b.at) })
	var gap time.Duration
	var from time.Time
	for i := 1; i < len(acks); i++ {
		if g := acks[i].at.Sub(acks[i-1].at); g > gap {
			gap, from = g, acks[i-1].at
		}
	}
	return gap, from
}

// failoverScenario is how the primary goes: it fails over to another
// member and returns that member's index once it is elected.
type failoverScenario struct {
	name string
	fail func(rs *fakemongo.ReplicaSet, electionDelay time.Duration) (int, error)
}

var failoverScenarios = []failoverScenario{
	// A stepdown: the primary answers the writes it was running with a
	// state-change error and stays up as a secondary.
	{"stepdown", func(rs *fakemongo.ReplicaSet, _ time.Duration) (int, error) { return rs.Failover() }},
	// The primary dies: its connections close without replies, new ones
	// are refused, and after the election delay another member wins.
	{"primary dies", func(rs *fakemongo.ReplicaSet, electionDelay time.Duration) (int, error) {
		p := rs.Primary()
		if p == nil {
			return -1, errors.New("no primary to kill")
		}
		if err := rs.Kill(p.Index()); err != nil {
			return -1, err
		}
		time.Sleep(electionDelay)
		next := (p.Index() + 1) % len(rs.Members())
		return next, rs.Elect(next)
	}},
}

// Eight writers insert through mongobouncer while the primary fails over
// (stepdown, or the primary dies; ElectionDelay without a primary, a new
// primary) and then a secondary is killed and revived. No acknowledged
// write is lost, the driver gets no error and loses no connection, and
// writes pause no longer than the election plus one second: mongobouncer
// holds each write until the new primary is known
// (server_selection_timeout) rather than failing it, and the attempts the
// failover interrupts carry RetryableWriteError (a stepdown's state-change
// error, or the network error mongobouncer answers for a primary that
// died), which the driver retries once.
func TestReplicaSetFailoverUnderLoad(t *testing.T) {
	for _, sc := range failoverScenarios {
		t.Run(sc.name, func(t *testing.T) { eachIO(t, func(t *testing.T) { failoverUnderLoad(t, sc) }) })
	}
}

func failoverUnderLoad(t *testing.T, how failoverScenario) {
	const (
		electionDelay = time.Second
		writers       = 8
		readers       = 2
		runFor        = 4 * time.Second
		maxInserts    = 50_000
	)
	rs := fakemongo.StartReplicaSet(t, fakemongo.ReplicaSetOptions{ElectionDelay: electionDelay})
	// The shipped heartbeat_interval (10s), not the harness's 500ms:
	// the stepdown and the election must be learned from the streamed
	// hello and selection's immediate checks, not from a quick poll.
	a, addr := rsBouncer(t, rs, func(c *config.Config) {
		c.Global.HeartbeatInterval = config.Default().Global.HeartbeatInterval
	})

	var ev driverEvents
	c := driverWith(t, addr, "", func(o *options.ClientOptions) { ev.options(o) })
	coll := c.Database("db").Collection("c")
	if err := c.Ping(ctxT(t, 10*time.Second), nil); err != nil {
		t.Fatal(err)
	}
	// The driver streams its monitoring (mongobouncer's hello is
	// awaitable), and then opens its round-trip connection: both are
	// counted before the run, besides the pool's.
	waitFor(t, "the driver's streaming monitor and its RTT connection", func() bool {
		return a.Server().HellosWaiting() >= 1 && a.Server().ClientCount() >= int(ev.created.Load())+2
	})
	// mongobouncer's own count of client connections: one it closed
	// would be replaced by the driver, and accepted anew.
	clientsBefore, createdBefore := a.Server().TotalClients(), ev.created.Load()

	var (
		nextID  atomic.Int64
		mu      sync.Mutex
		acks    []ack
		errs    []error
		wg      sync.WaitGroup
		started = time.Now()
	)
	for range writers {
		wg.Go(func() {
			var mine []ack
			defer func() {
				mu.Lock()
				acks = append(acks, mine...)
				mu.Unlock()
			}()
			for time.Since(started) < runFor {
				id := nextID.Add(1)
				if id > maxInserts {
					return
				}
				ctx, cancel := opContext(15 * time.Second)
				_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: id}})
				cancel()
				if err != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("insert %d at %v: %w", id, time.Since(started).Round(time.Millisecond), err))
					mu.Unlock()
					continue
				}
				mine = append(mine, ack{id, time.Now()})
			}
		})
	}

	// Two readers with readPreference secondary run beside the
	// writers: the stepdown must not disturb them, and the secondary's
	// death costs at most one failed attempt each, which the driver
	// retries (retryReads) on the other secondary.
	var reads atomic.Int64
	sc := c.Database("db").Collection("c", options.Collection().SetReadPreference(readpref.Secondary()))
	for range readers {
		wg.Go(func() {
			for time.Since(started) < runFor && reads.Load() < maxInserts {
				ctx, cancel := opContext(15 * time.Second)
				err := sc.FindOne(ctx, bson.D{}).Err()
				cancel()
				if err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
					mu.Lock()
					errs = append(errs, fmt.Errorf("find at %v: %w", time.Since(started).Round(time.Millisecond), err))
					mu.Unlock()
					continue
				}
				reads.Add(1)
			}
		})
	}

	// The script, on this goroutine: a failover at 0.5s, then member
	// kill and revival of a secondary once the new primary is in.
	time.Sleep(500 * time.Millisecond)
	failStart := time.Now()
	p, err := how.fail(rs, electionDelay)
	if err != nil {
		t.Errorf("%s: %v", how.name, err)
	}
	elected := time.Now()
	time.Sleep(500 * time.Millisecond)
	victim := (p + 1) % len(rs.Members())
	if err := rs.Kill(victim); err != nil {
		t.Errorf("kill %d: %v", victim, err)
	}
	time.Sleep(300 * time.Millisecond)
	if err := rs.Revive(victim); err != nil {
		t.Errorf("revive %d: %v", victim, err)
	}
	wg.Wait()

	gap, gapFrom := longestGap(acks)
	var firstAfter time.Duration = -1
	for _, x := range acks {
		if x.at.After(elected) {
			firstAfter = x.at.Sub(elected)
			break
		}
	}
	t.Logf("%s, %s: %d inserts acknowledged in %v by %d writers; failover 0 -> %d at %v (election delay %v); "+
		"longest gap between acknowledgements %v from %v; first acknowledgement %v after the election; "+
		"%d attempts failed and were retried; member %d killed and revived; %d secondary reads",
		how.name, ioModelOf(t).name, len(acks), time.Since(started).Round(time.Millisecond), writers, p,
		failStart.Sub(started).Round(time.Millisecond), electionDelay, gap.Round(time.Millisecond),
		gapFrom.Sub(started).Round(time.Millisecond), firstAfter.Round(time.Millisecond),
		ev.attemptsFailed.Load(), victim, reads.Load())
	ev.mu.Lock()
	for _, n := range ev.notes {
		t.Log(n)
	}
	ev.mu.Unlock()

	if len(errs) > 0 {
		t.Errorf("%d operations returned an error to the driver; first: %v", len(errs), errs[0])
	}
	if n := ev.closed.Load(); n != 0 {
		t.Errorf("the driver lost %d connections to mongobouncer", n)
	}
	if n := ev.heartbeatFailed.Load(); n != 0 {
		t.Errorf("%d of the driver's heartbeats to mongobouncer failed", n)
	}
	if accepted, created := a.Server().TotalClients()-clientsBefore, ev.created.Load()-createdBefore; accepted != uint64(created) {
		t.Errorf("mongobouncer accepted %d connections during the run, the driver's pool opened %d: some were replaced", accepted, created)
	}
	if limit := electionDelay + time.Second; gap > limit {
		t.Errorf("writes paused for %v (from %v into the run), want at most %v", gap, gapFrom.Sub(started), limit)
	}
	if p < 0 || p == 0 || rs.Member(p).State() != fakemongo.StatePrimary {
		t.Errorf("member %d was elected", p)
	}
	if len(acks) == 0 || firstAfter < 0 {
		t.Fatalf("%d acknowledgements, none after the election", len(acks))
	}

	stored := map[int64]bool{}
	for _, d := range rs.Collection("db", "c") {
		id, _ := d.Lookup("_id").AsInt64OK()
		stored[id] = true
	}
	lost := 0
	for _, x := range acks {
		if !stored[x.id] {
			lost++
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d acknowledged inserts are not in the collection", lost, len(acks))
	}
}
