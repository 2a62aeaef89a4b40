package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// cleanupTimeout bounds dropping the throw-away collection and
// disconnecting, which happen after the run's own deadline.
const cleanupTimeout = 5 * time.Second

// driverURI turns addr into a connection string: a host:port connects
// directly (a mongos-like proxy and a standalone server both accept that);
// a full mongodb:// or mongodb+srv:// URI is used as given.
func driverURI(addr string) string {
	if strings.HasPrefix(addr, "mongodb://") || strings.HasPrefix(addr, "mongodb+srv://") {
		return addr
	}
	return "mongodb://" + addr + "/?directConnection=true"
}

// poolFillTimeout bounds the wait for the find-insert workload's driver
// pool to open all its connections before the run; short, so that the
// demo stays bounded on a loaded machine.
const poolFillTimeout = 5 * time.Second

// seedDocs is how many documents the find-insert workload inserts before
// its run, for its finds to look up by _id.
const seedDocs = 1000

// driverPrep is a driver workload's client and collection, set up before
// the run's clock starts (connecting and seeding are not operations).
type driverPrep struct {
	client *mongo.Client
	coll   *mongo.Collection
	name   string
	// opTimeout is the run's operation timeout, the drop's too.
	opTimeout time.Duration
	// err is a set-up failure, reported as the run's first error.
	err error
}

// prepareDriver connects a driver client to addr and, for the find-insert
// workload, seeds a collection created for this run.
func prepareDriver(ctx context.Context, addr string, cfg Config) *driverPrep {
	opts := options.Client().ApplyURI(driverURI(addr)).
		SetAppName("mongobouncer-bench").
		SetMaxPoolSize(cfg.MaxPoolSize).
		SetConnectTimeout(cfg.DialTimeout).
		SetServerSelectionTimeout(cfg.OpTimeout)
	var ready atomic.Int64
	if cfg.Workload == WorkloadFindInsert {
		// Open the whole pool before the clock starts: the driver opens
		// two connections at a time (maxConnecting), so against a slow
		// server a short run would otherwise measure the ramp, and a
		// target that answers the handshake itself (a pooler) would look
		// better for it.
		opts.SetMinPoolSize(cfg.MaxPoolSize).SetPoolMonitor(&event.PoolMonitor{Event: func(e *event.PoolEvent) {
			switch e.Type {
			case event.ConnectionReady:
				ready.Add(1)
			case event.ConnectionClosed:
				ready.Add(-1)
			}
		}})
	}
	client, err := mongo.Connect(opts)
	if err != nil {
		return &driverPrep{err: fmt.Errorf("connect: %w", err)}
	}
	p := &driverPrep{client: client, name: fmt.Sprintf("run_%d_%08x", time.Now().UnixNano(), rand.Uint32()), opTimeout: cfg.OpTimeout}
	p.coll = client.Database(cfg.Database).Collection(p.name)
	if cfg.Workload == WorkloadFindInsert {
		docs := make([]any, seedDocs)
		for i := range docs {
			docs[i] = bson.D{{Key: "_id", Value: int64(i)}, {Key: "g", Value: int64(-1)}, {Key: "n", Value: int64(i)}}
		}
		sctx, cancel := context.WithTimeout(ctx, cleanupTimeout+cfg.OpTimeout)
		defer cancel()
		if _, err := p.coll.InsertMany(sctx, docs); err != nil {
			p.err = fmt.Errorf("seeding %d documents: %w", seedDocs, err)
			return p
		}
		wctx, cancel := context.WithTimeout(ctx, poolFillTimeout)
		defer cancel()
		waitPool(wctx, &ready, int64(cfg.MaxPoolSize))
	}
	return p
}

// waitPool waits, polling, until ready reaches want or ctx ends; a pool
// that does not fill in time is measured as it is.
func waitPool(ctx context.Context, ready *atomic.Int64, want int64) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for ready.Load() < want {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// close drops the run's collection and disconnects.
func (p *driverPrep) close(ctx context.Context, log func(msg string, args ...any)) {
	if p.client == nil {
		return
	}
	// The drop may queue behind operations the run's end cut short, which
	// a pooler in front of a slow server still has to serve (1,000 clients
	// at FerretDB's ~100 a second: ten seconds, where the drop timed out
	// at 5 s and left every run's collection behind): it gets as long as
	// an operation.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(cleanupTimeout, p.opTimeout))
	defer cancel()
	if err := p.coll.Drop(cctx); err != nil {
		log("loadgen: dropping the driver workload collection failed", "collection", p.name, "err", err)
	}
	if err := p.client.Disconnect(cctx); err != nil {
		log("loadgen: driver disconnect failed", "err", err)
	}
}

// runDriver runs a driver workload: cfg.Clients goroutines share p's
// client. WorkloadDriver cycles insertOne, findOne (of the document just
// inserted) and updateOne (of the same document); WorkloadFindInsert does
// 80 % findOne of a seeded document by _id and 20 % insertOne.
func runDriver(ctx context.Context, p *driverPrep, r *run) []*stats {
	cfg := r.cfg
	all := make([]*stats, cfg.Clients)
	for i := range all {
		all[i] = newStats()
	}
	if p.err != nil {
		all[0].failure(r, p.err)
		return all
	}
	var wg sync.WaitGroup
	for g := range all {
		st := all[g]
		if cfg.Workload == WorkloadFindInsert {
			wg.Go(func() { findInsertLoop(ctx, r, p.coll, int64(g), st) })
			continue
		}
		wg.Go(func() { driverLoop(ctx, r, p.coll, int64(g), st) })
	}
	wg.Wait()
	return all
}

// findInsertLoop is one client of WorkloadFindInsert: the shape of a web
// application's traffic, mostly reads of one document by key.
func findInsertLoop(ctx context.Context, r *run, coll *mongo.Collection, g int64, st *stats) {
	rng := rand.New(rand.NewPCG(uint64(g), uint64(time.Now().UnixNano())))
	var seq int64
	for ctx.Err() == nil && r.take() {
		start := time.Now()
		opCtx, cancel := context.WithDeadline(ctx, r.opDeadline(start))
		var err error
		op := "findOne"
		if rng.IntN(5) == 0 {
			op = "insertOne"
			seq++
			_, err = coll.InsertOne(opCtx, bson.D{{Key: "_id", Value: (g+1)<<40 | seq}, {Key: "g", Value: g}, {Key: "n", Value: seq}})
		} else {
			id := rng.Int64N(seedDocs)
			var doc bson.Raw
			doc, err = coll.FindOne(opCtx, bson.D{{Key: "_id", Value: id}}).Raw()
			if err == nil {
				if got, ok := doc.Lookup("n").AsInt64OK(); !ok || got != id {
					err = fmt.Errorf("findOne _id %d returned n %v", id, doc.Lookup("n"))
				}
			}
		}
		end := time.Now()
		cancel()
		if st.done(ctx, r, start, end, op, err) {
			return
		}
	}
}

// done records operation op, which ran from start to end with err: a
// success, or a failure unless the run's end cut it (cutByRunEnd), in
// which case it reports true and the loop stops.
func (st *stats) done(ctx context.Context, r *run, start, end time.Time, op string, err error) bool {
	if err == nil {
		st.success(r, start, end)
		return false
	}
	if cutByRunEnd(ctx, r, start, end, err) {
		return true
	}
	st.failure(r, fmt.Errorf("%s: %w", op, err))
	return false
}

// cutByRunEnd reports whether an operation that ran from start to end
// failed because the run ended, which is not the server's fault: the run
// was cancelled or is over, or the operation's deadline was the run's end
// and it expired (the driver also refuses, before sending, an operation
// whose remaining time is below its measured round-trip time).
func cutByRunEnd(ctx context.Context, r *run, start, end time.Time, err error) bool {
	return ctx.Err() != nil || !end.Before(r.deadline) ||
		errors.Is(err, context.DeadlineExceeded) && r.opDeadline(start).Equal(r.deadline)
}

func driverLoop(ctx context.Context, r *run, coll *mongo.Collection, g int64, st *stats) {
	var seq, id int64
	for step := 0; ctx.Err() == nil && r.take(); step = (step + 1) % 3 {
		start := time.Now()
		opCtx, cancel := context.WithDeadline(ctx, r.opDeadline(start))
		var err error
		switch step {
		case 0:
			seq++
			id = g<<40 | seq
			_, err = coll.InsertOne(opCtx, bson.D{{Key: "_id", Value: id}, {Key: "g", Value: g}, {Key: "n", Value: int64(0)}})
		case 1:
			var doc bson.Raw
			doc, err = coll.FindOne(opCtx, bson.D{{Key: "_id", Value: id}}).Raw()
			if err == nil {
				if got, ok := doc.Lookup("g").AsInt64OK(); !ok || got != g {
					err = errors.New("findOne returned a document with the wrong g field")
				}
			}
		case 2:
			var res *mongo.UpdateResult
			res, err = coll.UpdateOne(opCtx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "n", Value: int64(1)}}}})
			if err == nil && res.MatchedCount != 1 {
				err = fmt.Errorf("updateOne matched %d documents, want 1", res.MatchedCount)
			}
		}
		end := time.Now()
		cancel()
		if st.done(ctx, r, start, end, [...]string{"insertOne", "findOne", "updateOne"}[step], err) {
			return
		}
	}
}
