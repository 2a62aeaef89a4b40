package pool

import (
	"errors"
	"fmt"
	"time"
)

// Spec texts of the pool errors (as the CMAP JSON tests spell them).
const (
	msgPoolClosed       = "Attempted to check out a connection from closed connection pool"
	msgWaitQueueTimeout = "Timed out while checking out a connection from connection pool"
	msgConnectionError  = "An error occurred while trying to establish a new connection"
)

// Errors returned by CheckIn for misuse. They indicate a bug in the caller.
var (
	// ErrNilConn is returned when CheckIn is given a nil connection.
	ErrNilConn = errors.New("pool: check-in of a nil connection")
	// ErrForeignConn is returned when a connection is checked in to a pool that did not
	// create it (the spec requires this to be an error).
	ErrForeignConn = errors.New("pool: connection was checked in to a pool that did not create it")
	// ErrNotCheckedOut is returned when a connection that is not checked out (for
	// example a double check-in) is checked in.
	ErrNotCheckedOut = errors.New("pool: connection is not checked out")
	// ErrNoServiceID is the cause inside a *ConnectionError when a load-balanced pool
	// established a connection whose handshake reported no serviceId.
	ErrNoServiceID = errors.New("pool: load-balanced connection has no serviceId")
)

// PoolClosedError is returned by CheckOut (and Ready) once the pool is closed.
type PoolClosedError struct {
	// Address is the pool's address.
	Address string
}

// Error implements error.
func (e *PoolClosedError) Error() string {
	return msgPoolClosed + " for " + e.Address
}

// Message returns the spec's message for this error, without the address.
func (e *PoolClosedError) Message() string { return msgPoolClosed }

// PoolClearedError is returned by CheckOut while the pool is paused (after Clear and
// before Ready, or before the first Ready) and to every waiter evicted by Clear. It is
// retryable and must not be treated as a network error: it deliberately does not
// unwrap to the error that caused the clear.
type PoolClearedError struct {
	// Address is the pool's address.
	Address string
	// Cause is the error given to ClearWithError, if any. It is informational only.
	Cause error
	// Interrupted is set when the checkout's connection was being established and was
	// interrupted by Clear(true).
	Interrupted bool
}

// Error implements error with the spec's messages.
func (e *PoolClearedError) Error() string {
	switch {
	case e.Interrupted:
		return "Connection to " + e.Address + " interrupted due to server monitor timeout"
	case e.Cause != nil:
		return "Connection pool for " + e.Address + " was cleared because another operation failed with: " + e.Cause.Error()
	default:
		return "Connection pool for " + e.Address + " was cleared (or is not ready yet)"
	}
}

// Message returns the same text as Error (the spec's message includes the address).
func (e *PoolClearedError) Message() string { return e.Error() }

// Retryable reports true: the operation can be retried once the pool is ready again.
func (e *PoolClearedError) Retryable() bool { return true }

// WaitQueueTimeoutError is returned by CheckOut when the wait for a connection ended
// because WaitQueueTimeout elapsed or the caller's context ended (then it unwraps to
// ctx.Err(), so errors.Is(err, context.Canceled) and context.DeadlineExceeded work).
// The counts describe the pool at the moment of the timeout.
type WaitQueueTimeoutError struct {
	// Address is the pool's address.
	Address string
	// Cause is the context's error, or nil when WaitQueueTimeout elapsed.
	Cause error
	// Waited is how long the checkout waited.
	Waited time.Duration
	// WaitQueueTimeout is the pool's configured timeout (0 = none).
	WaitQueueTimeout time.Duration
	// MaxPoolSize, MaxConnecting and the counts are the pool's at the timeout.
	MaxPoolSize, MaxConnecting                int
	Total, InUse, Pending, Available, Waiters int
	// SharedMax and SharedUsed are the pool's Share's cap and count at the
	// timeout (ShareStats Max and Used); SharedMax 0: no shared cap.
	SharedMax, SharedUsed int
}

// Error implements error.
func (e *WaitQueueTimeoutError) Error() string {
	cause := "waitQueueTimeout " + e.WaitQueueTimeout.String() + " elapsed"
	if e.Cause != nil {
		cause = e.Cause.Error()
	}
	shared := ""
	if e.SharedMax > 0 {
		// Else the counts of this pool alone would not say why it waited.
		shared = fmt.Sprintf("; shared cap over the server's pools (max_db_connections): %d, connections under it: %d", e.SharedMax, e.SharedUsed)
	}
	return fmt.Sprintf("%s %s: %s; maxPoolSize: %d, maxConnecting: %d, connections in use: %d, pending: %d, available: %d, total: %d, waiters: %d, waited: %s%s",
		msgWaitQueueTimeout, e.Address, cause, e.MaxPoolSize, e.MaxConnecting, e.InUse, e.Pending, e.Available, e.Total, e.Waiters, e.Waited, shared)
}

// Message returns the spec's message for this error.
func (e *WaitQueueTimeoutError) Message() string { return msgWaitQueueTimeout }

// Unwrap returns the context error, if the context ended the wait.
func (e *WaitQueueTimeoutError) Unwrap() error { return e.Cause }

// Timeout reports true (net.Error style).
func (e *WaitQueueTimeoutError) Timeout() bool { return true }

// ConnectionError reports a failure to establish a connection (dial, handshake or
// auth); CheckOut returns it with a ConnectionCheckOutFailed event of reason
// "connectionError", and OnBackgroundError receives it. Generation and ServiceID let
// the topology layer ignore errors from connections older than the last clear.
type ConnectionError struct {
	// Address is the pool's address.
	Address string
	// ConnectionID is the pool's ID of the failed connection.
	ConnectionID int64
	// Generation is the pool generation the connection was created in.
	Generation uint64
	// Err is the Connector's error.
	Err error
}

// Error implements error.
func (e *ConnectionError) Error() string {
	return fmt.Sprintf("connection %d to %s could not be established: %v", e.ConnectionID, e.Address, e.Err)
}

// Message returns the spec's checkout-failure text for this error.
func (e *ConnectionError) Message() string { return msgConnectionError }

// Unwrap returns the Connector's error.
func (e *ConnectionError) Unwrap() error { return e.Err }
