package pool

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Stats is a snapshot of a pool, for SHOW POOLS and health checks.
type Stats struct {
	// Address is the pool's address.
	Address string
	// State is paused, ready or closed.
	State State
	// Generation is the pool's generation (bumped by every Clear).
	Generation uint64
	// Counts are the connection and waiter counts.
	Counts
	// Options are the pool's current options (limits as last set by SetLimits).
	Options Options
	// Limiter is the adaptive limit's state (Options.Adaptive), nil otherwise.
	Limiter *LimiterStats
}

// serviceGen is the load-balancer mode (generation, connection count) of one service.
type serviceGen struct {
	gen   uint64
	count int
}

// errPanicked marks a connection whose scoped user panicked mid-use.
var errPanicked = errors.New("pool: connection user panicked")

// Pool is a CMAP connection pool for one upstream server. All methods are safe for
// concurrent use.
type Pool struct {
	// Immutable after New.
	address   string
	connector Connector
	mon       Monitor // nil: no events at all
	onBgErr   func(error)
	lb        bool
	created   *Options // the options given to New, shown in PoolCreated
	interval  time.Duration
	share     *Share // nil: no budget shared with other pools

	// For the Share (share.go), which never takes mu: idleN mirrors len(idle)
	// (written under mu), evictReq counts evictions it asked for (taken by
	// maintenance), grantN mirrors shareGrant.
	idleN    atomic.Int32
	evictReq atomic.Int32
	grantN   atomic.Int32
	queuedN  atomic.Bool  // mirrors shareQueued
	connN    atomic.Int32 // mirrors len(conns)
	// Guarded by share.mu (not mu): queued in the Share, and slots granted to
	// this pool and not yet used.
	shareQueued bool
	shareGrant  int

	baseCtx    context.Context    // parent of every establishment; cancelled by Close
	baseCancel context.CancelFunc // cancels baseCtx
	runNow     chan struct{}      // wakes maintenance at once; nil when it never runs
	done       chan struct{}      // closed by Close: maintenance exits
	wg         sync.WaitGroup     // every goroutine the pool starts

	// mu guards everything below, and the guarded fields of every Conn and waiter of
	// this pool. It is never held while dialing, closing a socket or calling
	// OnBackgroundError; it is held while calling the Monitor. Lock order: mu, then
	// share.mu (a leaf); never two pools' mu at once.
	mu               sync.Mutex
	opts             Options // current options (limits change with SetLimits)
	state            State
	generation       uint64
	services         map[bson.ObjectID]*serviceGen // load-balancer mode
	nextID           int64
	conns            map[int64]*Conn // every pending, available and in-use connection
	idle             []*Conn         // available connections, most recently used last
	pending          int
	inUse            int
	unclaimed        []*Conn // pending connections no checkout waits for, oldest first
	queue            waitQueue
	expiry           *time.Timer // fails queued waiters at their deadline (expireWaiters)
	expiryAt         instant     // the deadline expiry is armed for; 0: not armed
	clearCause       error       // the error given to the last ClearWithError
	interruptPending bool        // maintenance must interrupt in-use connections
	interruptGen     uint64      // ...whose generation is <= this
	// lim is the adaptive limit on checked-out connections (Options.Adaptive),
	// nil otherwise. Its state is guarded by mu like the rest: it is fed at
	// CheckIn and read by the checks that gate checkouts (limitedLocked).
	lim limiter
	// probeTimer ends a limiter's probe at its deadline when no check-in
	// does (armProbeLocked); nil when not armed.
	probeTimer *time.Timer
}

// New creates a pool for address that establishes connections with c. The pool
// starts paused: CheckOut fails with a PoolClearedError until Ready is called.
// A PoolCreated event is emitted before New returns.
func New(address string, c Connector, opts Options) (*Pool, error) {
	if address == "" {
		return nil, fmt.Errorf("%w: empty address", ErrInvalidOptions)
	}
	if c == nil {
		return nil, fmt.Errorf("%w: nil Connector", ErrInvalidOptions)
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.MaintenanceInterval == 0 {
		opts.MaintenanceInterval = DefaultMaintenanceInterval
	}
	if opts.Share != nil && opts.MaintenanceInterval < 0 {
		return nil, fmt.Errorf("%w: a Share needs the maintenance goroutine (MaintenanceInterval >= 0)", ErrInvalidOptions)
	}
	var logMon Monitor
	if opts.Logger != nil {
		logMon = NewLogMonitor(opts.Logger)
	}
	created := opts
	p := &Pool{
		address:   address,
		connector: c,
		mon:       Monitors(opts.Monitor, logMon),
		onBgErr:   opts.OnBackgroundError,
		lb:        opts.LoadBalanced,
		created:   &created,
		interval:  opts.MaintenanceInterval,
		done:      make(chan struct{}),
		opts:      opts,
		conns:     make(map[int64]*Conn),
		share:     opts.Share,
	}
	if p.share != nil {
		p.share.join(p)
	}
	if p.lb {
		p.services = make(map[bson.ObjectID]*serviceGen)
	}
	if opts.Adaptive {
		p.lim = newAdaptiveLimiter(opts.Limits().limiterOptions())
	}
	p.baseCtx, p.baseCancel = context.WithCancel(context.Background())
	p.mu.Lock()
	if p.mon != nil {
		p.emitLocked(Event{Type: PoolCreated, Options: p.created})
	}
	p.mu.Unlock()
	if p.interval > 0 {
		p.runNow = make(chan struct{}, 1)
		p.wg.Add(1)
		go p.maintain()
	}
	return p, nil
}

// Address returns the address of the server the pool connects to.
func (p *Pool) Address() string { return p.address }

// Stats returns a snapshot of the pool.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Stats{
		Address:    p.address,
		State:      p.state,
		Generation: p.generation,
		Counts:     p.countsLocked(),
		Options:    p.opts,
		Limiter:    p.limiterStatsLocked(),
	}
}

// SetLimits changes the pool's limits live (configuration reload). Raising
// MaxPoolSize or MaxConnecting serves waiters at once; lowering MaxPoolSize closes
// surplus available connections at the next maintenance run (in-use ones are never
// taken away, so the total may exceed the new maximum until they are checked in).
func (p *Pool) SetLimits(l Limits) error {
	if err := l.Validate(); err != nil {
		return err
	}
	p.mu.Lock()
	if p.state == StateClosed {
		p.mu.Unlock()
		return &PoolClosedError{Address: p.address}
	}
	if p.opts.MaxIdleTime == 0 && l.MaxIdleTime > 0 {
		// idleSince is only recorded while MaxIdleTime is set; start the clock now.
		now := monoNow()
		for _, c := range p.idle {
			c.idleSince = now
		}
	}
	p.opts = p.opts.withLimits(l)
	switch {
	case !l.Adaptive:
		p.lim = nil
	case p.lim == nil:
		p.lim = newAdaptiveLimiter(l.limiterOptions())
	default:
		lo := l.limiterOptions()
		p.lim.SetBounds(lo.Floor, lo.Ceiling)
	}
	p.dispatchLocked()
	p.mu.Unlock()
	p.kick()
	return nil
}

// CheckOut returns a connection for the caller's exclusive use until CheckIn.
//
// Checkouts are served in arrival order. An available non-perished connection is
// reused (perished ones met on the way are closed); otherwise a new one is created if
// MaxPoolSize and MaxConnecting allow (or a connection already being established that
// nobody waits for is taken over); otherwise the caller waits for either. Errors:
// *PoolClosedError, *PoolClearedError (paused or cleared while waiting; retryable),
// *WaitQueueTimeoutError (WaitQueueTimeout or ctx ended; unwraps to ctx.Err()), and
// *ConnectionError (establishing the connection made for this checkout failed).
func (p *Pool) CheckOut(ctx context.Context) (*Conn, error) {
	p.mu.Lock()
	start, c, err := p.beginLocked(ctx)
	if c != nil || err != nil {
		p.mu.Unlock()
		return c, err
	}
	w := getWaiter()
	w.start = start
	p.enqueueLocked(w)
	p.dispatchLocked()
	p.mu.Unlock()
	return p.await(ctx, w)
}

// beginLocked starts a checkout: the CheckOutStarted event, the checks that fail it at
// once, and the fast path. It returns a connection or an error, or neither when the
// checkout must queue, and then start, when it began waiting.
//
// The clock is read only when the checkout has to wait. One that is decided
// at once (a connection from the available stack, or an immediate failure)
// never releases the pool's lock, so its duration is the few dozen
// nanoseconds of this function: its events report 0 (an untaken instant, see
// waited), which spares the two clock reads that would otherwise cost more
// than the checkout itself.
func (p *Pool) beginLocked(ctx context.Context) (start instant, c *Conn, err error) {
	if p.mon != nil {
		p.emitLocked(Event{Type: ConnectionCheckOutStarted})
	}
	if p.state != StateReady {
		err, reason := p.unavailableLocked()
		p.emitFailedLocked(0, reason, err)
		return 0, nil, err
	}
	if ctx != nil {
		if cerr := ctx.Err(); cerr != nil {
			err := p.timeoutErrLocked(cerr, 0)
			p.emitFailedLocked(0, ReasonTimeout, err)
			return 0, nil, err
		}
	}
	// Fast path, only when nobody waits: a newcomer never overtakes a waiter.
	if p.queue.n == 0 && !p.limitedLocked() {
		if c := p.popAvailableLocked(); c != nil {
			p.handOutLocked(c, 0)
			return 0, c, nil
		}
	}
	return monoNow(), nil, nil
}

// CheckOutFunc is CheckOut for callers that must not block (the proxy's event
// loop). A connection that can be had at once is returned, and so is an error
// that fails the checkout at once, as CheckOut would. Otherwise queued is true: the
// checkout waits in the queue, in order with every other one and with the same
// events, and the pool later calls done exactly once with its result (a connection,
// or one of CheckOut's errors; WaitQueueTimeout applies, there is no context).
//
// done is called with the pool's lock held, possibly before CheckOutFunc returns
// and on any goroutine that changes the pool (a CheckIn, an establishment, Clear,
// Close, the timeout), so it must be quick, must not block and must not call the
// pool: typically it queues the result for the caller's own thread.
func (p *Pool) CheckOutFunc(done func(*Conn, error)) (c *Conn, queued bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	start, c, err := p.beginLocked(nil)
	if c != nil || err != nil {
		return c, false, err
	}
	w := getWaiter()
	w.start = start
	w.fn = done
	p.enqueueLocked(w)
	p.dispatchLocked()
	return nil, true, nil
}

// await waits for w's result, and for ctx. WaitQueueTimeout is the pool's to
// enforce (expireWaiters): a waiter it fails gets its error through w.ch.
func (p *Pool) await(ctx context.Context, w *waiter) (*Conn, error) {
	select {
	case <-w.ch:
		return finish(w)
	case <-ctx.Done():
		p.mu.Lock()
		if w.state == waiterQueued || w.state == waiterBound {
			err := p.abandonLocked(w, ctx.Err())
			p.mu.Unlock()
			putWaiter(w)
			return nil, err
		}
		p.mu.Unlock()
		// Served just before the context ended: the token is already in w.ch.
		<-w.ch
		return finish(w)
	}
}

// finish returns a served waiter's result and recycles it.
func finish(w *waiter) (*Conn, error) {
	c, err := w.conn, w.err
	putWaiter(w)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// abandonLocked ends a queued or bound waiter that timed out. A connection being
// established for it is kept: it becomes unclaimed, for the next waiter or the pool.
func (p *Pool) abandonLocked(w *waiter, cause error) error {
	switch w.state {
	case waiterQueued:
		p.queue.remove(w)
	case waiterBound:
		c := w.pending
		w.pending = nil
		c.owner = nil
		p.unclaimed = append(p.unclaimed, c)
	}
	w.state = waiterDone
	err := p.timeoutErrLocked(cause, w.start)
	p.emitFailedLocked(w.start, ReasonTimeout, err)
	p.dispatchLocked()
	return err
}

// CheckIn returns a connection obtained from CheckOut. A perished connection (stale,
// interrupted or marked errored) or any connection of a closed pool is closed;
// otherwise it becomes available, or goes straight to the oldest waiter. It returns
// ErrForeignConn for a connection of another pool, ErrNilConn and ErrNotCheckedOut
// for other misuse.
func (p *Pool) CheckIn(c *Conn) error { return p.checkIn(c, 0) }

// checkIn checks c in; a non-zero lease must match c's current lease (Use guards
// against checking in a connection that was re-lent after its user checked it in).
func (p *Pool) checkIn(c *Conn, lease uint64) error {
	if c == nil {
		return ErrNilConn
	}
	if c.pool != p {
		return ErrForeignConn
	}
	p.mu.Lock()
	if c.state != connInUse || (lease != 0 && c.lease != lease) {
		p.mu.Unlock()
		return ErrNotCheckedOut
	}
	if p.mon != nil {
		p.emitLocked(Event{Type: ConnectionCheckedIn, ConnectionID: c.id, Generation: c.generation})
	}
	switch {
	case c.errored != nil:
		p.closeLocked(c, ReasonError, c.errored)
	case p.state == StateClosed:
		p.closeLocked(c, ReasonPoolClosed, nil)
	case c.interrupted.Load() || p.staleLocked(c):
		p.closeLocked(c, ReasonStale, nil)
	case p.shareReclaimLocked():
		// Other pools of the Share wait, and nobody here does or this pool
		// holds more than its part: make room (share.go).
		p.closeLocked(c, ReasonIdle, nil)
		p.share.checkedInEviction()
	default:
		p.inUse--
		p.makeAvailableLocked(c)
	}
	if p.lim != nil && c.outAt != 0 {
		now := monoNow()
		p.lim.Sample(time.Duration(now), now.sub(c.outAt), c.outInflight, c.overloaded || isDrop(c.errored))
		p.armProbeLocked()
	}
	c.outAt, c.overloaded = 0, false
	p.dispatchLocked()
	p.mu.Unlock()
	return nil
}

// Use checks a connection out, calls fn with it and checks it back in, also when fn
// panics (then the connection is marked errored, since a request may be half done,
// and the panic continues). fn must not check the connection in itself. Use returns
// the checkout error or fn's error.
func (p *Pool) Use(ctx context.Context, fn func(*Conn) error) (err error) {
	c, err := p.CheckOut(ctx)
	if err != nil {
		return err
	}
	p.mu.Lock()
	lease := c.lease
	p.mu.Unlock()
	panicked := true
	defer func() {
		if panicked {
			p.markErrored(c, lease, errPanicked)
		}
		if cerr := p.checkIn(c, lease); cerr != nil && err == nil && !panicked {
			err = cerr
		}
	}()
	err = fn(c)
	panicked = false
	return err
}

// markErrored is MarkErrored restricted to one lease.
func (p *Pool) markErrored(c *Conn, lease uint64, err error) {
	p.mu.Lock()
	if c.state == connInUse && c.lease == lease && c.errored == nil {
		c.errored = err
	}
	p.mu.Unlock()
}

// dispatchLocked serves waiters from the front of the queue for as long as possible:
// with an available connection, by taking over an unclaimed pending connection, or by
// creating a connection for the waiter. Only the front waiter is ever considered, so
// the queue is strictly FIFO. Called after every change that may let a waiter progress.
func (p *Pool) dispatchLocked() {
	for p.state == StateReady {
		w := p.queue.front()
		if w == nil || p.limitedLocked() {
			p.shareSettleLocked()
			return
		}
		if c := p.popAvailableLocked(); c != nil {
			p.queue.remove(w)
			p.handOutLocked(c, w.start)
			p.deliverLocked(w, c)
			continue
		}
		if len(p.unclaimed) > 0 {
			// A connection already being established that nobody waits for (minPoolSize
			// population, or its checkout gave up) serves this waiter rather than a new
			// one: that never costs more time than a new dial and does not overshoot
			// the pool size (spec: no establishing while a populated one is coming).
			c := p.unclaimed[0]
			p.removeUnclaimedLocked(c)
			p.queue.remove(w)
			p.bindLocked(w, c)
			continue
		}
		if !p.canCreateLocked() {
			p.shareSettleLocked()
			return
		}
		if p.share != nil && !p.share.acquire(p) {
			return // p waits in the Share; a grant wakes maintenance, which dispatches
		}
		p.queue.remove(w)
		c := p.createLocked(false)
		p.bindLocked(w, c)
		p.establishLocked(c)
	}
}

// popAvailableLocked pops the most recently used available connection that has not
// perished, closing the perished ones it meets. LIFO keeps the busy set of connections
// warm and lets surplus ones age out through MaxIdleTime.
func (p *Pool) popAvailableLocked() *Conn {
	var now instant
	for n := len(p.idle); n > 0; n = len(p.idle) {
		c := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.shareIdleLocked()
		if p.staleLocked(c) {
			p.closeLocked(c, ReasonStale, nil)
			continue
		}
		if p.opts.MaxIdleTime > 0 {
			if now == 0 {
				now = monoNow()
			}
			if now.sub(c.idleSince) > p.opts.MaxIdleTime {
				p.closeLocked(c, ReasonIdle, nil)
				continue
			}
		}
		return c
	}
	return nil
}

// handOutLocked marks c (just popped, or just established) in use.
func (p *Pool) handOutLocked(c *Conn, start instant) {
	c.state = connInUse
	c.lease++
	p.inUse++
	if p.lim != nil {
		// The clock is read for the limiter only: its sample is the time
		// the connection is held, and how many were held with it.
		c.outAt, c.outInflight = monoNow(), p.inUse
		// A probe's clock starts with its first checkout (demand, not an
		// idle pool, is what it must not hold back for long); a limit it
		// raises is seen by the caller's next limitedLocked.
		p.lim.Tick(time.Duration(c.outAt))
		p.armProbeLocked()
	}
	if p.mon != nil {
		p.emitLocked(Event{Type: ConnectionCheckedOut, ConnectionID: c.id, Generation: c.generation, Duration: waited(start)})
	}
}

// makeAvailableLocked puts an established connection on top of the available stack.
func (p *Pool) makeAvailableLocked(c *Conn) {
	c.state = connAvailable
	if p.opts.MaxIdleTime > 0 {
		c.idleSince = monoNow()
	}
	p.idle = append(p.idle, c)
	p.shareIdleLocked()
}

// deliverLocked completes waiter w with connection c (already handed out).
func (p *Pool) deliverLocked(w *waiter, c *Conn) {
	w.pending = nil
	w.state = waiterDone
	if w.fn != nil {
		p.callLocked(w, c, nil)
		return
	}
	w.conn = c
	w.ch <- struct{}{}
}

// callLocked gives a CheckOutFunc waiter its result and recycles it: nothing
// else holds a waiter that is done (no timer of its own refers to it).
func (p *Pool) callLocked(w *waiter, c *Conn, err error) {
	fn := w.fn
	putWaiter(w)
	fn(c, err)
}

// failWaiterLocked completes waiter w with err and emits ConnectionCheckOutFailed.
func (p *Pool) failWaiterLocked(w *waiter, reason Reason, err error) {
	if w.state == waiterQueued {
		p.queue.remove(w)
	}
	w.pending = nil
	w.state = waiterDone
	p.emitFailedLocked(w.start, reason, err)
	if w.fn != nil {
		p.callLocked(w, nil, err)
		return
	}
	w.err = err
	w.ch <- struct{}{}
}

// failEvictedLocked fails, in queue order, the waiters of a list taken with
// waitQueue.detach.
func (p *Pool) failEvictedLocked(w *waiter, reason Reason, err error) {
	for w != nil {
		next := w.next
		w.prev, w.next = nil, nil
		w.state = waiterDone // no longer queued: failWaiterLocked must not unlink it
		p.failWaiterLocked(w, reason, err)
		w = next
	}
}

// bindLocked takes w out of the queue's competition: c is being established for it.
func (p *Pool) bindLocked(w *waiter, c *Conn) {
	w.state = waiterBound
	w.pending = c
	c.owner = w
}

// unavailableLocked returns the error (and checkout-failure reason) of a pool that is
// not ready.
func (p *Pool) unavailableLocked() (error, Reason) {
	if p.state == StateClosed {
		return &PoolClosedError{Address: p.address}, ReasonPoolClosed
	}
	return &PoolClearedError{Address: p.address, Cause: p.clearCause}, ReasonConnectionError
}

func (p *Pool) timeoutErrLocked(cause error, start instant) *WaitQueueTimeoutError {
	c := p.countsLocked()
	var shared ShareStats
	if p.share != nil {
		shared = p.share.Stats() // lock order: p.mu, then the Share's
	}
	return &WaitQueueTimeoutError{
		SharedMax:        shared.Max,
		SharedUsed:       shared.Used,
		Address:          p.address,
		Cause:            cause,
		Waited:           waited(start),
		WaitQueueTimeout: p.opts.WaitQueueTimeout,
		MaxPoolSize:      p.opts.MaxPoolSize,
		MaxConnecting:    p.opts.MaxConnecting,
		Total:            c.Total,
		InUse:            c.InUse,
		Pending:          c.Pending,
		Available:        c.Available,
		Waiters:          c.Waiters,
	}
}

func (p *Pool) countsLocked() Counts {
	return Counts{
		Total:     len(p.conns),
		Available: len(p.idle),
		Pending:   p.pending,
		InUse:     p.inUse,
		Waiters:   p.queue.n,
	}
}

// emitLocked fills the common fields and hands e to the monitor; callers check
// p.mon != nil first so that nothing is computed when nobody listens.
func (p *Pool) emitLocked(e Event) {
	e.Address = p.address
	e.Counts = p.countsLocked()
	p.mon.HandleEvent(e)
}

func (p *Pool) emitFailedLocked(start instant, reason Reason, err error) {
	if p.mon != nil {
		p.emitLocked(Event{Type: ConnectionCheckOutFailed, Duration: waited(start), Reason: reason, Err: err})
	}
}
