package loadgen

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongobouncer/mongobouncer/internal/testutil/devmongo"
)

func TestDriverURI(t *testing.T) {
	if got := driverURI("127.0.0.1:27017"); got != "mongodb://127.0.0.1:27017/?directConnection=true" {
		t.Fatalf("host:port gave %q", got)
	}
	for _, u := range []string{"mongodb://a:1,b:2/?replicaSet=rs", "mongodb+srv://x.example"} {
		if got := driverURI(u); got != u {
			t.Fatalf("%q gave %q", u, got)
		}
	}
}

// TestRunDriver runs the driver workload against a real MongoDB-compatible
// server (FerretDB through devmongo).
func TestRunDriver(t *testing.T) {
	s := devmongo.Start(t)
	cfg := Config{Workload: WorkloadDriver, Clients: 3, Duration: 20 * time.Second, Warmup: 0, MaxOps: 300, MaxPoolSize: 2}
	res, err := Run(context.Background(), s.Addr(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d ops in %v, %.0f ops/s, latency %+v", res.Ops, res.Elapsed, res.OpsPerSec, res.Latency)
	if res.Errors != 0 {
		t.Fatalf("%d errors: %q", res.Errors, res.ErrorSamples)
	}
	if res.Ops != 300 {
		t.Fatalf("ops %d, want the 300-op budget", res.Ops)
	}
	checkLatency(t, res.Latency)

	// The throw-away collection is dropped after the run.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	client, err := mongo.Connect(options.Client().ApplyURI(s.URI()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = client.Disconnect(context.Background()) }()
	names, err := client.Database(DefaultDatabase).ListCollectionNames(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if strings.HasPrefix(n, "run_") {
			t.Fatalf("collection %s left behind", n)
		}
	}
}

// TestRunDriverUnreachable: driver errors are counted, not fatal, and the
// run still ends on time.
func TestRunDriverUnreachable(t *testing.T) {
	start := time.Now()
	res, err := Run(context.Background(), deadAddr(t), Config{Workload: WorkloadDriver, Clients: 2,
		Duration: 1500 * time.Millisecond, OpTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 15*time.Second {
		t.Fatalf("run took %v", took)
	}
	if res.Ops != 0 || res.Errors == 0 || !strings.Contains(res.ErrorSamples[0], "insertOne") {
		t.Fatalf("ops %d errors %d samples %q", res.Ops, res.Errors, res.ErrorSamples)
	}
}

// TestRunFindInsert runs the demo's workload against FerretDB: every find
// of a seeded document by _id finds it (a miss or a wrong document is an
// error), the budget is spent, and the collection is dropped afterwards.
func TestRunFindInsert(t *testing.T) {
	s := devmongo.Start(t)
	// The budget is small and the duration long, but on a loaded machine
	// FerretDB may still not finish it: any number of operations will do,
	// as long as none failed.
	cfg := Config{Workload: WorkloadFindInsert, Clients: 3, Duration: 20 * time.Second, MaxOps: 200, MaxPoolSize: 3, Database: "fi"}
	res, err := Run(context.Background(), s.Addr(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors != 0 || res.Ops == 0 || res.Ops > 200 {
		t.Fatalf("ops %d errors %d: %q", res.Ops, res.Errors, res.ErrorSamples)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	client, err := mongo.Connect(options.Client().ApplyURI(s.URI()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = client.Disconnect(context.Background()) }()
	names, err := client.Database("fi").ListCollectionNames(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 0 {
		t.Fatalf("collections left behind: %v", names)
	}
}

func TestCutByRunEnd(t *testing.T) {
	now := time.Now()
	r := &run{cfg: Config{OpTimeout: time.Second}, deadline: now.Add(10 * time.Second)}
	ctx := context.Background()
	late := now.Add(9500 * time.Millisecond) // its op deadline is the run's end
	for _, c := range []struct {
		name       string
		start, end time.Time
		err        error
		want       bool
	}{
		{"a failure mid-run", now, now.Add(time.Millisecond), errors.New("boom"), false},
		{"a timeout mid-run", now, now.Add(time.Second), context.DeadlineExceeded, false},
		{"a timeout at the run's end", late, late.Add(10 * time.Millisecond), fmt.Errorf("not sent: %w", context.DeadlineExceeded), true},
		{"another failure near the end", late, late.Add(10 * time.Millisecond), errors.New("boom"), false},
		{"anything after the end", now, now.Add(11 * time.Second), errors.New("boom"), true},
	} {
		if got := cutByRunEnd(ctx, r, c.start, c.end, c.err); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if !cutByRunEnd(cctx, r, now, now, errors.New("boom")) {
		t.Error("a cancelled run's failure counted")
	}
}
