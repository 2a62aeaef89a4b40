package pool

import (
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Default option values (CMAP defaults where the spec has one).
const (
	DefaultMaxPoolSize         = 100
	DefaultMinPoolSize         = 0
	DefaultMaxConnecting       = 2
	DefaultMaintenanceInterval = 10 * time.Second
)

// ErrInvalidOptions is wrapped by every error returned from Options.Validate and
// Limits.Validate.
var ErrInvalidOptions = errors.New("invalid pool options")

// Options configures a Pool. Start from DefaultOptions: the zero value is not valid
// (MaxConnecting must be at least 1).
type Options struct {
	// MaxPoolSize caps the total number of connections (pending + available + in use).
	// 0 means unlimited. Default 100.
	MaxPoolSize int
	// MinPoolSize is the number of connections the background maintenance keeps open
	// while the pool is ready. Must not exceed MaxPoolSize when that is > 0. Default 0.
	MinPoolSize int
	// MaxIdleTime closes connections that stayed available longer than this.
	// 0 means never. Default 0.
	MaxIdleTime time.Duration
	// MaxConnecting bounds how many connections may be established concurrently.
	// Must be >= 1. Default 2.
	MaxConnecting int
	// WaitQueueTimeout bounds how long a CheckOut may wait in the wait queue. 0 means
	// no limit besides the caller's context. It does not bound the establishment of a
	// connection once one is being made for the caller (the spec's wait queue ends
	// there); the context still does. Default 0.
	WaitQueueTimeout time.Duration
	// MaintenanceInterval is the pause between the end of one background run and the
	// start of the next. 0 means DefaultMaintenanceInterval (10s). A negative value
	// means no background goroutine at all: minPoolSize is not maintained, perished
	// available connections are only closed when CheckOut meets them, and an
	// interrupting Clear does not interrupt in-use connections. That mode exists for the
	// CMAP test runner (backgroundThreadIntervalMS < 0) and is not meant for production.
	MaintenanceInterval time.Duration
	// Adaptive makes the number of connections checked out at once follow a
	// Limiter (max_pool_size = "auto") between MinPoolSize (at least 1) and
	// MaxPoolSize (DefaultLimiterCeiling when 0), which stays the cap on the
	// total. Checkouts beyond the limit wait in the queue, in order, as they
	// wait for MaxPoolSize. Default false.
	Adaptive bool
	// LoadBalanced selects load-balancer mode: generations are tracked per serviceId,
	// ClearService replaces Clear, and every Upstream must implement ServiceIDer.
	// Default false.
	LoadBalanced bool
	// OnBackgroundError receives errors from establishing connections that no CheckOut
	// is waiting for (minPoolSize population, or a checkout that gave up). The topology
	// layer applies SDAM error handling in it, typically by calling Clear. It is called
	// from a pool goroutine without the pool's lock held, and before the failed
	// connection's ConnectionClosed event. Establishments interrupted by Clear or Close
	// are not reported. The error is a *ConnectionError. Default nil.
	OnBackgroundError func(error)
	// Monitor receives every pool event. nil means no events and no event cost.
	// See Monitor for the calling contract. Default nil.
	Monitor Monitor
	// Share, when set, is a connection budget this pool shares with other pools of
	// the same server (share.go): a new connection needs a slot of it besides
	// MaxPoolSize. It needs the maintenance goroutine (MaintenanceInterval >= 0).
	// Default nil.
	Share *Share
	// Logger, when set, receives the CMAP "Connection Pool Logging" messages at Debug
	// level through NewLogMonitor (in addition to Monitor). Default nil.
	Logger *slog.Logger
}

// DefaultOptions returns the default pool options.
func DefaultOptions() Options {
	return Options{
		MaxPoolSize:         DefaultMaxPoolSize,
		MinPoolSize:         DefaultMinPoolSize,
		MaxConnecting:       DefaultMaxConnecting,
		MaintenanceInterval: DefaultMaintenanceInterval,
	}
}

// Validate reports whether o is usable by New.
func (o Options) Validate() error {
	return o.Limits().Validate()
}

// Limits returns the fields of o that SetLimits can change on a live pool.
func (o Options) Limits() Limits {
	return Limits{
		MaxPoolSize:      o.MaxPoolSize,
		MinPoolSize:      o.MinPoolSize,
		MaxConnecting:    o.MaxConnecting,
		MaxIdleTime:      o.MaxIdleTime,
		WaitQueueTimeout: o.WaitQueueTimeout,
		Adaptive:         o.Adaptive,
	}
}

// withLimits returns o with the live-changeable fields replaced by l.
func (o Options) withLimits(l Limits) Options {
	o.MaxPoolSize = l.MaxPoolSize
	o.MinPoolSize = l.MinPoolSize
	o.MaxConnecting = l.MaxConnecting
	o.MaxIdleTime = l.MaxIdleTime
	o.WaitQueueTimeout = l.WaitQueueTimeout
	o.Adaptive = l.Adaptive
	return o
}

// Limits are the options that can be changed on a live pool with SetLimits
// (configuration reload). Field meanings are those of Options.
type Limits struct {
	MaxPoolSize      int
	MinPoolSize      int
	MaxConnecting    int
	MaxIdleTime      time.Duration
	WaitQueueTimeout time.Duration
	Adaptive         bool
}

// limiterOptions returns the bounds of an adaptive limit under l.
func (l Limits) limiterOptions() LimiterOptions {
	ceiling := l.MaxPoolSize
	if ceiling == 0 {
		ceiling = DefaultLimiterCeiling
	}
	return LimiterOptions{Floor: l.MinPoolSize, Ceiling: ceiling}
}

// Validate reports whether l is usable.
func (l Limits) Validate() error {
	switch {
	case l.MaxPoolSize < 0:
		return fmt.Errorf("%w: MaxPoolSize %d must be >= 0", ErrInvalidOptions, l.MaxPoolSize)
	case l.MinPoolSize < 0:
		return fmt.Errorf("%w: MinPoolSize %d must be >= 0", ErrInvalidOptions, l.MinPoolSize)
	case l.MaxPoolSize > 0 && l.MinPoolSize > l.MaxPoolSize:
		return fmt.Errorf("%w: MinPoolSize %d must not exceed MaxPoolSize %d", ErrInvalidOptions, l.MinPoolSize, l.MaxPoolSize)
	case l.MaxConnecting < 1:
		return fmt.Errorf("%w: MaxConnecting %d must be >= 1", ErrInvalidOptions, l.MaxConnecting)
	case l.MaxIdleTime < 0:
		return fmt.Errorf("%w: MaxIdleTime %v must be >= 0", ErrInvalidOptions, l.MaxIdleTime)
	case l.WaitQueueTimeout < 0:
		return fmt.Errorf("%w: WaitQueueTimeout %v must be >= 0", ErrInvalidOptions, l.WaitQueueTimeout)
	}
	return nil
}
