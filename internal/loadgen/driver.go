package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
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

// runDriver runs the driver workload: cfg.Clients goroutines share one
// driver client and cycle insertOne, findOne (of the document just
// inserted) and updateOne (of the same document) on a collection created
// for this run and dropped afterwards.
func runDriver(ctx context.Context, addr string, r *run) []*stats {
	cfg := r.cfg
	all := make([]*stats, cfg.Clients)
	for i := range all {
		all[i] = newStats()
	}
	opts := options.Client().ApplyURI(driverURI(addr)).
		SetAppName("mongobouncer-bench").
		SetMaxPoolSize(cfg.MaxPoolSize).
		SetConnectTimeout(cfg.DialTimeout).
		SetServerSelectionTimeout(cfg.OpTimeout)
	client, err := mongo.Connect(opts)
	if err != nil {
		all[0].failure(r, fmt.Errorf("connect: %w", err))
		return all
	}
	name := fmt.Sprintf("run_%d_%08x", time.Now().UnixNano(), rand.Uint32())
	coll := client.Database(cfg.Database).Collection(name)
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if err := coll.Drop(cctx); err != nil {
			cfg.Logger.Warn("loadgen: dropping the driver workload collection failed", "collection", name, "err", err)
		}
		if err := client.Disconnect(cctx); err != nil {
			cfg.Logger.Warn("loadgen: driver disconnect failed", "err", err)
		}
	}()

	var wg sync.WaitGroup
	for g := range all {
		st := all[g]
		wg.Go(func() { driverLoop(ctx, r, coll, int64(g), st) })
	}
	wg.Wait()
	return all
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
		if err == nil {
			st.success(r, start, end)
			continue
		}
		// An operation cut by the run's end is not the server's fault.
		if ctx.Err() != nil || !end.Before(r.deadline) {
			return
		}
		st.failure(r, fmt.Errorf("%s: %w", [...]string{"insertOne", "findOne", "updateOne"}[step], err))
	}
}
