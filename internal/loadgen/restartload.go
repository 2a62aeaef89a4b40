// The application side of a restart measurement: a Go driver client with
// its default retry settings, writers inserting numbered documents and
// readers reading them back by _id, recording every outcome in a Ledger;
// a pool and server monitor counting the connections the driver closes and
// why; and the read-back that finds what was stored.

package loadgen

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Restart workload defaults: the shape of the measurement in issue 29.
const (
	DefaultRestartWriters   = 24
	DefaultRestartReaders   = 8
	DefaultRestartOpTimeout = 10 * time.Second
	// restartErrorPause spaces a client's operations after an error, as
	// an application's error path would, so that a dead address costs a
	// few errors per client per second and not a busy loop.
	restartErrorPause = 10 * time.Millisecond
	// maxRestartOps bounds each client's operations, a bound besides the
	// run's context.
	maxRestartOps = 1_000_000
	// recentIDs is how many acknowledged _ids the readers choose from.
	recentIDs = 4096
)

// RestartLoadConfig configures StartRestartLoad.
type RestartLoadConfig struct {
	// URI is the application's connection string (the balancer's or the
	// proxy's address, with loadBalanced=true or without). Nothing else
	// is set on the client but the pool, server and command monitors,
	// the app name and maxPoolSize: retryWrites and retryReads keep
	// their defaults.
	URI string
	// Writers and Readers are the concurrent clients of each kind.
	Writers, Readers int
	// OpTimeout bounds each operation (its context).
	OpTimeout time.Duration
	// Database and Collection name where the documents go.
	Database, Collection string
	// MaxPoolSize is the driver's maxPoolSize (0: the driver's default).
	MaxPoolSize uint64
	Logger      *slog.Logger
	// OnStuck, when set, is called once for each command still without a
	// reply StuckAfter after it was sent (a diagnostic: what the sockets
	// hold at that moment), with a line describing it.
	OnStuck    func(what string)
	StuckAfter time.Duration
}

// ConnStats counts the driver's connection events during a run.
type ConnStats struct {
	// Created is how many connections the pool opened.
	Created int `json:"created"`
	// Closed is how many it closed, by reason (stale: its pool was
	// cleared; error: it failed; idle; poolClosed).
	Closed map[string]int `json:"closed_by_reason"`
	// ClosedTotal is the sum of Closed.
	ClosedTotal int `json:"closed"`
	// PoolCleared is how many times a pool was cleared.
	PoolCleared int `json:"pool_cleared"`
	// CheckOutFailed is how many check-outs failed, by reason.
	CheckOutFailed map[string]int `json:"checkout_failed_by_reason,omitempty"`
	// HeartbeatFailed is how many monitoring checks failed.
	HeartbeatFailed int `json:"heartbeat_failed"`
	// Refused and Reset are how many of the driver's own connection
	// failures (heartbeats and pool events carrying an error) say that
	// the connection was refused or reset by the peer.
	Refused int `json:"refused"`
	Reset   int `json:"reset"`
	// CommandsFailed counts the commands that failed on the wire, by
	// command and error text (command monitoring): a failure the driver
	// retried successfully is here and not among the application's
	// errors.
	CommandsFailed map[string]int `json:"commands_failed,omitempty"`
}

// connCounter is the monitors' state.
type connCounter struct {
	mu sync.Mutex
	s  ConnStats // guarded by mu
	// inflight are the commands sent and not answered yet, by request id
	// (restartstuck.go); guarded by imu.
	imu      sync.Mutex
	inflight map[int64]*inflightCmd
}

func (c *connCounter) pool(e *event.PoolEvent) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch e.Type {
	case event.ConnectionCreated:
		c.s.Created++
	case event.ConnectionClosed:
		c.s.Closed[e.Reason]++
		c.s.ClosedTotal++
	case event.ConnectionPoolCleared:
		c.s.PoolCleared++
	case event.ConnectionCheckOutFailed:
		c.s.CheckOutFailed[e.Reason]++
	}
	if e.Error != nil {
		c.classify(e.Error)
	}
}

func (c *connCounter) commandFailed(_ context.Context, e *event.CommandFailedEvent) {
	c.done(e.RequestID)
	text := e.Failure.Error()
	if errors.Is(e.Failure, context.Canceled) || strings.Contains(text, context.Canceled.Error()) {
		return // the run's end, which cancels the clients' contexts
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.s.CommandsFailed[e.CommandName+": "+NormalizeErrorText(text)]++
}

func (c *connCounter) heartbeatFailed(e *event.ServerHeartbeatFailedEvent) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.s.HeartbeatFailed++
	c.classify(e.Failure)
}

// classify counts err as refused or reset. Guarded by mu.
func (c *connCounter) classify(err error) {
	switch s := err.Error(); {
	case strings.Contains(s, "connection refused"):
		c.s.Refused++
	case strings.Contains(s, "connection reset"):
		c.s.Reset++
	}
}

func (c *connCounter) snapshot() ConnStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.s
	s.Closed = cloneMap(c.s.Closed)
	s.CheckOutFailed = cloneMap(c.s.CheckOutFailed)
	s.CommandsFailed = cloneMap(c.s.CommandsFailed)
	return s
}

func cloneMap(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// idRing holds the most recent acknowledged _ids, for the readers.
type idRing struct {
	mu   sync.Mutex
	ids  []bson.ObjectID // guarded by mu
	next int             // guarded by mu
}

func (r *idRing) add(id bson.ObjectID) {
	r.mu.Lock()
	if len(r.ids) < recentIDs {
		r.ids = append(r.ids, id)
	} else {
		r.ids[r.next] = id
		r.next = (r.next + 1) % recentIDs
	}
	r.mu.Unlock()
}

func (r *idRing) pick(rng *rand.Rand) (bson.ObjectID, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.ids) == 0 {
		return bson.ObjectID{}, false
	}
	return r.ids[rng.IntN(len(r.ids))], true
}

// RestartLoad is a running restart workload.
type RestartLoad struct {
	cfg    RestartLoadConfig
	ledger *Ledger
	client *mongo.Client
	coll   *mongo.Collection
	conns  *connCounter
	recent idRing
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// StartRestartLoad connects a client to cfg.URI and starts the writers and
// readers, which run until Stop (or ctx ends), recording into ledger.
func StartRestartLoad(ctx context.Context, cfg RestartLoadConfig, ledger *Ledger) (*RestartLoad, error) {
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = DefaultRestartOpTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	conns := &connCounter{s: ConnStats{Closed: map[string]int{}, CheckOutFailed: map[string]int{}, CommandsFailed: map[string]int{}},
		inflight: map[int64]*inflightCmd{}}
	opts := options.Client().ApplyURI(cfg.URI).SetAppName("mongobouncer-bench-restart").
		SetPoolMonitor(&event.PoolMonitor{Event: conns.pool}).
		SetServerMonitor(&event.ServerMonitor{ServerHeartbeatFailed: conns.heartbeatFailed}).
		SetMonitor(&event.CommandMonitor{Started: conns.commandStarted, Succeeded: conns.commandSucceeded, Failed: conns.commandFailed})
	if cfg.MaxPoolSize > 0 {
		opts.SetMaxPoolSize(cfg.MaxPoolSize)
	}
	client, err := mongo.Connect(opts)
	if err != nil {
		return nil, fmt.Errorf("loadgen: connect %s: %w", cfg.URI, err)
	}
	pctx, cancel := context.WithTimeout(ctx, cfg.OpTimeout)
	err = client.Ping(pctx, nil)
	cancel()
	if err != nil {
		_ = client.Disconnect(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("loadgen: first ping through %s: %w", cfg.URI, err)
	}
	runCtx, stop := context.WithCancel(ctx)
	l := &RestartLoad{cfg: cfg, ledger: ledger, client: client, conns: conns, cancel: stop,
		coll: client.Database(cfg.Database).Collection(cfg.Collection)}
	if cfg.OnStuck != nil {
		l.wg.Go(func() { conns.watchStuck(runCtx, cfg.StuckAfter, cfg.OnStuck) })
	}
	for w := range cfg.Writers {
		l.wg.Go(func() { l.writer(runCtx, int64(w)) })
	}
	for r := range cfg.Readers {
		l.wg.Go(func() { l.reader(runCtx, int64(r)) })
	}
	return l, nil
}

// Stop ends the clients, waits for them and disconnects. It returns the
// connection counts from before the disconnection (which closes every
// pooled connection, reason poolClosed, and is no part of a restart).
func (l *RestartLoad) Stop() ConnStats {
	l.cancel()
	l.wg.Wait()
	conns := l.conns.snapshot()
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if err := l.client.Disconnect(ctx); err != nil {
		l.cfg.Logger.Warn("loadgen: driver disconnect failed", "err", err)
	}
	return conns
}

// writer inserts {w, s} documents, s counting from 1; the driver sets
// their _id (an ObjectID, as for any application that leaves it out), so
// a retry it sends itself carries the same _id.
func (l *RestartLoad) writer(ctx context.Context, w int64) {
	for seq := int64(1); seq <= maxRestartOps && ctx.Err() == nil; seq++ {
		k := WriteKey{Writer: w, Seq: seq}
		opCtx, cancel := context.WithTimeout(ctx, l.cfg.OpTimeout)
		res, err := l.coll.InsertOne(opCtx, bson.D{{Key: "w", Value: w}, {Key: "s", Value: seq}})
		cancel()
		end := time.Now()
		switch {
		case err == nil:
			l.ledger.Success(end)
			l.ledger.Acked(k)
			if id, ok := res.InsertedID.(bson.ObjectID); ok {
				l.recent.add(id)
			}
		case ctx.Err() != nil:
			l.ledger.WriteCut(k)
			return
		default:
			l.ledger.Failure(end, ErrorText("insert", err))
			l.ledger.WriteFailed(k)
			pause(ctx, restartErrorPause)
		}
	}
}

// reader finds recently acknowledged documents by _id; a document not
// found is an error (it was acknowledged).
func (l *RestartLoad) reader(ctx context.Context, r int64) {
	rng := rand.New(rand.NewPCG(uint64(r), uint64(time.Now().UnixNano())))
	for range maxRestartOps {
		if ctx.Err() != nil {
			return
		}
		id, ok := l.recent.pick(rng)
		if !ok {
			pause(ctx, restartErrorPause)
			continue
		}
		opCtx, cancel := context.WithTimeout(ctx, l.cfg.OpTimeout)
		err := l.coll.FindOne(opCtx, bson.D{{Key: "_id", Value: id}}).Err()
		cancel()
		end := time.Now()
		switch {
		case err == nil:
			l.ledger.Success(end)
		case ctx.Err() != nil:
			return
		default:
			l.ledger.Failure(end, ErrorText("find", err))
			pause(ctx, restartErrorPause)
		}
	}
}

// pause sleeps for d or until ctx ends.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// ErrorText names an operation's error for grouping: the server's code
// name and code with its error labels for a command or write error, else
// the driver's text with addresses and connection numbers removed.
func ErrorText(op string, err error) string {
	var ce mongo.CommandError
	var we mongo.WriteException
	switch {
	case errors.As(err, &ce) && ce.Name == "" && ce.Code == 0:
		// The driver's wrapping of a network error: its text says what.
		return fmt.Sprintf("%s: %s%s", op, NormalizeErrorText(ce.Message), labels(ce.Labels))
	case errors.As(err, &ce):
		return fmt.Sprintf("%s: %s (%d)%s", op, ce.Name, ce.Code, labels(ce.Labels))
	case errors.As(err, &we) && len(we.WriteErrors) > 0:
		e := we.WriteErrors[0]
		name := "write error"
		if e.Code == 11000 {
			name = "DuplicateKey"
		}
		return fmt.Sprintf("%s: %s (%d)%s", op, name, e.Code, labels(we.Labels))
	case errors.As(err, &we) && we.WriteConcernError != nil:
		return fmt.Sprintf("%s: write concern %s (%d)%s", op, we.WriteConcernError.Name, we.WriteConcernError.Code, labels(we.Labels))
	case errors.Is(err, mongo.ErrNoDocuments):
		return op + ": acknowledged document not found"
	}
	return op + ": " + NormalizeErrorText(err.Error())
}

func labels(ls []string) string {
	if len(ls) == 0 {
		return ""
	}
	return " [" + strings.Join(ls, ",") + "]"
}

// ReadBackWrites reads the WriteKey of every document in the collection,
// through its own client (uri: the upstream itself, not the proxies).
func ReadBackWrites(ctx context.Context, uri, database, collection string) ([]WriteKey, error) {
	client, err := mongo.Connect(options.Client().ApplyURI(uri))
	if err != nil {
		return nil, err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_ = client.Disconnect(dctx)
	}()
	cur, err := client.Database(database).Collection(collection).Find(ctx, bson.D{},
		options.Find().SetProjection(bson.D{{Key: "_id", Value: 0}, {Key: "w", Value: 1}, {Key: "s", Value: 1}}))
	if err != nil {
		return nil, fmt.Errorf("loadgen: read back: %w", err)
	}
	var out []WriteKey
	if err := cur.All(ctx, &out); err != nil {
		return nil, fmt.Errorf("loadgen: read back: %w", err)
	}
	return out, nil
}
