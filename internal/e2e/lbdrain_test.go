package e2e

// A drain behind a balancer: two mongobouncers behind HAProxy in TCP mode
// (as a Kubernetes Service puts them), a Go driver reading and writing
// through the balancer, one instance drained. With a plain URI the driver
// sees one server, the balancer, and the first ShutdownInProgress clears
// its whole pool, connections to the healthy instance included. With
// loadBalanced=true each connection knows its instance's serviceId, and
// only the draining instance's connections are cleared.

import (
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongobouncer/mongobouncer/internal/app"
	"github.com/mongobouncer/mongobouncer/internal/loadgen"
	"github.com/mongobouncer/mongobouncer/internal/testutil/devmongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// lbDrainApp is the appName the workload's driver sends, to tell its
// connections from HAProxy's health checks in the instances' client lists.
const lbDrainApp = "lbdrain"

// poolLog counts a driver's pool events.
type poolLog struct {
	mu sync.Mutex
	// created, closed and cleared are guarded by mu: the driver calls the
	// monitor from its own goroutines.
	created, closed int
	cleared         []*bson.ObjectID // each PoolCleared's serviceId (nil: the whole pool)
}

func (p *poolLog) monitor() *event.PoolMonitor {
	return &event.PoolMonitor{Event: func(e *event.PoolEvent) {
		p.mu.Lock()
		defer p.mu.Unlock()
		switch e.Type {
		case event.ConnectionCreated:
			p.created++
		case event.ConnectionClosed:
			p.closed++
		case event.ConnectionPoolCleared:
			var sid *bson.ObjectID
			if e.ServiceID != nil {
				v := *e.ServiceID
				sid = &v
			}
			p.cleared = append(p.cleared, sid)
		}
	}}
}

func (p *poolLog) snapshot() (created, closed int, cleared []*bson.ObjectID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.created, p.closed, slices.Clone(p.cleared)
}

// drainResult is what one drain behind the balancer cost the driver.
type drainResult struct {
	// atDrainA and atDrainB are the driver's connections to each instance
	// when the drain began (the instances' client lists).
	atDrainA, atDrainB int
	// closed is the driver's ConnectionClosed events from the drain's start
	// to the end of the window; created its ConnectionCreated.
	closed, created int
	// lostB is how many of B's (the healthy instance's) connections at the
	// drain's start the driver closed.
	lostB int
	// cleared are the PoolCleared events' serviceIds ("" for the whole pool).
	cleared []string
	// ops counts the successful operations, readErrs and writeErrs the
	// application-visible errors.
	ops                 int64
	readErrs, writeErrs []error
}

// appClients returns the IDs of inst's clients that are the workload's
// driver connections.
func appClients(inst *app.App) map[int64]bool {
	ids := map[int64]bool{}
	for _, c := range inst.Server().Clients() {
		if c.AppName == lbDrainApp {
			ids[c.ID] = true
		}
	}
	return ids
}

// runBalancedDrain starts two mongobouncers over upURI behind HAProxy, runs a
// driver (URI options extra) doing inserts and reads through HAProxy,
// drains the first instance and counts what the driver closed.
func runBalancedDrain(t *testing.T, upURI string, extra string) drainResult {
	a := newBouncer(t, upURI, mode("transaction", 10), slog.LevelError)
	t.Cleanup(func() { _ = a.Close(ctxT(t, 10*time.Second)) })
	b, addrB := bouncer(t, upURI, mode("transaction", 10))
	addrA := a.Addrs()[0].String()
	sidA, sidB := serviceIDOf(t, addrA), serviceIDOf(t, addrB)
	h, err := loadgen.StartHAProxy(ctxT(t, 15*time.Second), loadgen.HAProxyOptions{
		Balance: []string{addrA, addrB}, Threads: 1, MaxConn: 1000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Stop)

	var pools poolLog
	c := driverWith(t, h.Addr(), "&maxPoolSize=16&appName="+lbDrainApp+extra, func(o *options.ClientOptions) {
		o.SetPoolMonitor(pools.monitor())
	})
	// A collection per run: a real server keeps the previous run's ids.
	coll := c.Database("lbdrain").Collection(fmt.Sprintf("items_%d", time.Now().UnixNano()))

	// The workload: 8 clients, each inserting a document and reading it
	// back, bounded in count and time.
	const workers, perWorker = 8, 20000
	stop := make(chan struct{})
	var res drainResult
	var ops atomic.Int64
	var errMu sync.Mutex
	var wg sync.WaitGroup
	ctx := ctxT(t, 60*time.Second)
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("%d-%d", w, i)
				if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: id}}); err != nil {
					errMu.Lock()
					res.writeErrs = append(res.writeErrs, err)
					errMu.Unlock()
					continue
				}
				ops.Add(1)
				if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Err(); err != nil {
					errMu.Lock()
					res.readErrs = append(res.readErrs, err)
					errMu.Unlock()
					continue
				}
				ops.Add(1)
			}
		})
	}
	stopped := false
	stopWork := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	t.Cleanup(stopWork)

	// Both instances carry part of the driver's pool before the drain.
	waitFor(t, "driver connections on both instances", func() bool {
		return len(appClients(a)) >= 2 && len(appClients(b)) >= 2
	})
	time.Sleep(300 * time.Millisecond)
	onA, onB := appClients(a), appClients(b)
	res.atDrainA, res.atDrainB = len(onA), len(onB)
	created0, closed0, cleared0 := pools.snapshot()

	drained := make(chan error, 1)
	go func() { drained <- a.GracefulClose(ctxT(t, 10*time.Second)) }()
	select {
	case err := <-drained:
		if err != nil {
			t.Errorf("drain: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the drain did not end in 15 s")
	}
	// The workload goes on through the healthy instance for a while.
	time.Sleep(time.Second)
	stopWork()

	created1, closed1, cleared1 := pools.snapshot()
	res.created, res.closed = created1-created0, closed1-closed0
	for _, sid := range cleared1[len(cleared0):] {
		switch {
		case sid == nil:
			res.cleared = append(res.cleared, "")
		case *sid == sidA:
			res.cleared = append(res.cleared, "A")
		case *sid == sidB:
			res.cleared = append(res.cleared, "B")
		default:
			res.cleared = append(res.cleared, sid.Hex())
		}
	}
	still := appClients(b)
	for id := range onB {
		if !still[id] {
			res.lostB++
		}
	}
	res.ops = ops.Load()
	t.Logf("connections at the drain: %d on A, %d on B; during it the driver closed %d (%d of B's) and opened %d; pool cleared %q; %d operations, %d read and %d write errors",
		res.atDrainA, res.atDrainB, res.closed, res.lostB, res.created, res.cleared, res.ops, len(res.readErrs), len(res.writeErrs))
	return res
}

// Draining one of two mongobouncers behind a TCP balancer: with
// loadBalanced=true the driver closes only the draining instance's
// connections (PoolCleared names its serviceId) and none of the healthy
// one's; with the plain URI it clears its whole pool, the healthy
// instance's connections too. Both URIs in one test, so the difference is
// measured on the same machine at the same time.
func TestDrainBehindABalancerLoadBalancedAgainstPlainURI(t *testing.T) {
	oneIO(t)
	if _, err := loadgen.FindHAProxy(""); err != nil {
		t.Skipf("haproxy not installed (make haproxy): %v", err)
	}
	up := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos, InMemory: true})
	compareBalancedDrains(t, up.URI())
}

// The same against FerretDB (MONGOBOUNCER_DEVMONGO), a real server's
// latencies.
func TestDrainBehindABalancerDevmongo(t *testing.T) {
	oneIO(t)
	if _, err := loadgen.FindHAProxy(""); err != nil {
		t.Skipf("haproxy not installed (make haproxy): %v", err)
	}
	compareBalancedDrains(t, devmongo.Start(t).URI())
}

// compareBalancedDrains runs the drain of runBalancedDrain with the plain
// URI, then with loadBalanced=true, and checks the difference.
func compareBalancedDrains(t *testing.T, upURI string) {
	var plain, lb drainResult
	t.Run("plain", func(t *testing.T) { plain = runBalancedDrain(t, upURI, "") })
	t.Run("loadBalanced", func(t *testing.T) { lb = runBalancedDrain(t, upURI, lbURI) })
	if t.Failed() {
		return
	}

	// loadBalanced=true: only A's connections are cleared.
	if len(lb.cleared) == 0 {
		t.Errorf("loadBalanced: no PoolCleared during the drain, want A's serviceId cleared")
	}
	for _, c := range lb.cleared {
		if c != "A" {
			t.Errorf("loadBalanced: PoolCleared %q, want only the draining instance's serviceId (A)", lb.cleared)
			break
		}
	}
	if lb.lostB != 0 {
		t.Errorf("loadBalanced: the driver closed %d of its %d connections to the healthy instance, want 0", lb.lostB, lb.atDrainB)
	}
	if lb.closed > lb.atDrainA {
		t.Errorf("loadBalanced: the driver closed %d connections, more than the %d it had to the draining instance", lb.closed, lb.atDrainA)
	}
	// The plain URI: the whole pool, the healthy instance's share with it.
	if !slices.Contains(plain.cleared, "") {
		t.Errorf("plain URI: PoolCleared %q, want the whole pool cleared", plain.cleared)
	}
	if plain.lostB == 0 {
		t.Errorf("plain URI: none of the %d connections to the healthy instance closed: the test does not show the difference", plain.atDrainB)
	}
	// Fewer closed with loadBalanced=true, as a share of the connections
	// the driver had at the drain (the pools may differ a little in size
	// from run to run).
	lbShare := float64(lb.closed) / float64(lb.atDrainA+lb.atDrainB)
	plainShare := float64(plain.closed) / float64(plain.atDrainA+plain.atDrainB)
	if lbShare >= plainShare {
		t.Errorf("the driver closed %d of %d connections with loadBalanced=true and %d of %d with the plain URI, want a smaller share with loadBalanced=true",
			lb.closed, lb.atDrainA+lb.atDrainB, plain.closed, plain.atDrainA+plain.atDrainB)
	}

	for _, r := range []struct {
		name string
		res  drainResult
	}{{"plain", plain}, {"loadBalanced", lb}} {
		// Reads are retried (a 91 is a retryable error for reads).
		if len(r.res.readErrs) != 0 {
			t.Errorf("%s: application-visible read errors: %v", r.name, r.res.readErrs)
		}
		// The drain's 91 to a write carries RetryableWriteError, so the
		// driver retries the write rather than surfacing it.
		if len(r.res.writeErrs) != 0 {
			t.Errorf("%s: application-visible write errors: %v", r.name, r.res.writeErrs)
		}
		if r.res.ops == 0 {
			t.Errorf("%s: no successful operation", r.name)
		}
	}
}
