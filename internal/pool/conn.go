package pool

import (
	"context"
	"errors"
	"sync/atomic"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// connState is a connection's CMAP state.
type connState uint8

const (
	connPending   connState = iota + 1 // created, being established
	connAvailable                      // established, idle in the pool
	connInUse                          // checked out (or being handed to a checkout)
	connClosed                         // removed from the pool
)

// errMarked is recorded when MarkErrored is called with a nil error.
var errMarked = errors.New("pool: connection marked errored")

// Conn is a pooled upstream connection. A Conn returned by CheckOut belongs to the
// caller until it is given back with CheckIn; the pool never hands it to anyone else
// in between (one request in flight per connection).
type Conn struct {
	pool *Pool
	id   int64

	// Set before the connection is first handed out, then read-only. The hand-off
	// happens under the pool's lock or through the waiter's channel, which orders
	// these writes before any reader.
	generation   uint64
	serviceID    bson.ObjectID
	hasServiceID bool
	up           Upstream

	// interrupted is set by maintenance (under pool.mu) when a Clear(true) interrupted
	// this in-use connection; read without the lock by the connection's owner.
	interrupted atomic.Bool

	// Guarded by pool.mu.
	state       connState
	lease       uint64             // bumped at every hand-out (see Pool.Use)
	background  bool               // created by minPoolSize population
	owner       *waiter            // checkout this pending connection is established for
	cancel      context.CancelFunc // cancels establishment (pending only)
	cancelled   Reason             // why the pool cancelled establishment ("" = not cancelled)
	createdAt   instant            // for ConnectionReady.Duration (only with a monitor)
	idleSince   instant            // when it became available (only with MaxIdleTime)
	errored     error              // MarkErrored
	overloaded  bool               // MarkOverloaded: a drop for the limiter, not an error
	outAt       instant            // when handed out; taken only for the limiter
	outInflight int                // connections in use when handed out (limiter only)
	upClosed    bool               // Upstream.Close already scheduled
}

// ID returns the connection's ID, unique within its pool, assigned from 1 upwards in
// creation order.
func (c *Conn) ID() int64 { return c.id }

// Address returns the address of the pool (server) the connection belongs to.
func (c *Conn) Address() string { return c.pool.address }

// Pool returns the pool the connection belongs to: the one to check it back
// in to, and whose generation its errors are measured against. A server with
// several pools (one per user, for SCRAM pass-through) tells them apart by it.
func (c *Conn) Pool() *Pool { return c.pool }

// Generation returns the pool generation the connection belongs to (in load-balancer
// mode, its service's generation at establishment).
func (c *Conn) Generation() uint64 { return c.generation }

// ServiceID returns the connection's serviceId in load-balancer mode.
func (c *Conn) ServiceID() (bson.ObjectID, bool) { return c.serviceID, c.hasServiceID }

// Upstream returns the established network connection.
func (c *Conn) Upstream() Upstream { return c.up }

// Interrupted reports whether a Clear(true) interrupted the connection while it was in
// use (its Upstream has been closed). An operation that failed on an interrupted
// connection should fail with a retryable error, e.g. InterruptedError.
func (c *Conn) Interrupted() bool { return c.interrupted.Load() }

// InterruptedError returns the retryable error the spec prescribes for operations whose
// connection was interrupted by a clear.
func (c *Conn) InterruptedError() error {
	return &PoolClearedError{Address: c.pool.address, Interrupted: true}
}

// MarkErrored records that the connection must not be reused (I/O error, timeout,
// unread reply bytes...). It is closed with reason "error" when checked in. Only the
// connection's owner may call it, while the connection is checked out; later calls
// are ignored.
func (c *Conn) MarkErrored(err error) {
	if err == nil {
		err = errMarked
	}
	p := c.pool
	p.mu.Lock()
	if c.state == connInUse && c.errored == nil {
		c.errored = err
	}
	p.mu.Unlock()
}

// MarkOverloaded records that the server refused this use of the connection
// as overloaded (error 462, SystemOverloadedError): the connection stays
// good, but an adaptive pool counts its check-in as a drop and lowers its
// limit. It does nothing on a connection that is not in use.
func (c *Conn) MarkOverloaded() {
	p := c.pool
	p.mu.Lock()
	if c.state == connInUse {
		c.overloaded = true
	}
	p.mu.Unlock()
}
