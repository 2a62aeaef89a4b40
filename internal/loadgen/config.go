package loadgen

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"
)

// Workload names accepted in Config.Workload.
const (
	// WorkloadPing sends raw OP_MSG pings, one TCP connection per client.
	WorkloadPing = "ping"
	// WorkloadDriver runs insertOne / findOne / updateOne through one
	// shared official Go driver client.
	WorkloadDriver = "driver"
	// WorkloadFindInsert runs 80 % findOne by _id (of documents seeded
	// before the run) and 20 % insertOne through one shared official Go
	// driver client: the demo's workload.
	WorkloadFindInsert = "find-insert"
)

// Defaults applied by Config for zero fields.
const (
	DefaultClients     = 8
	DefaultDuration    = 2 * time.Second
	DefaultMaxOps      = 10_000_000
	DefaultRounds      = 4
	DefaultOpTimeout   = 5 * time.Second
	DefaultDialTimeout = 5 * time.Second
	DefaultMaxPoolSize = 16
	DefaultDatabase    = "loadgen"
)

// maxClients bounds Config.Clients so a typo cannot start a million
// goroutines and sockets; each client also owns a 16 KiB histogram. Use
// ProbeIdle for more (idle) connections.
const maxClients = 10_000

// ErrInvalidConfig is matched (errors.Is) by every configuration error.
var ErrInvalidConfig = errors.New("loadgen: invalid configuration")

// Config describes one load run. Zero fields take the defaults above.
type Config struct {
	// Workload is WorkloadPing (default) or WorkloadDriver.
	Workload string
	// Clients is the number of concurrent clients (goroutines).
	Clients int
	// Duration bounds one run (one side of one round in Compare),
	// warm-up included.
	Duration time.Duration
	// Warmup is the leading part of Duration whose operations are
	// excluded from the figures (0: none). It must be shorter than
	// Duration.
	Warmup time.Duration
	// MaxOps bounds the operations one run attempts, warm-up and failed
	// ones included; the run stops when it is reached or Duration ends,
	// whichever comes first.
	MaxOps int64
	// Rounds is the number of direct+proxied round pairs Compare runs.
	// Run ignores it.
	Rounds int
	// RoundOffset numbers Compare's rounds from this value, and its
	// alternation follows the number (even: direct first), so that a
	// comparison run one round at a time, interleaved with others and
	// joined with Report.Merge, alternates as one run would.
	RoundOffset int
	// OpTimeout bounds each operation (a hung server costs at most this
	// long, and never outlives the run).
	OpTimeout time.Duration
	// DialTimeout bounds each connection attempt including the hello.
	DialTimeout time.Duration
	// MaxPoolSize is the driver's maxPoolSize (driver workload only).
	MaxPoolSize uint64
	// Database is where the driver workload creates its throw-away
	// collection (driver workload only).
	Database string
	// Logger receives progress messages; nil discards them.
	Logger *slog.Logger
	// OnStart, when set, is called by Run once its set-up is done, with
	// the instant its clock starts (the run's Start): a caller timing
	// events within the run (an upstream slowing down) starts from it.
	OnStart func(start time.Time)
	// SourceAddrs are the local addresses the ping workload's connections
	// come from, spread round-robin, when the target is a loopback address
	// (ParseSourceAddrs; empty: the kernel picks).
	SourceAddrs []netip.Addr
	// Processes are the processes whose CPU time Compare reports per
	// operation (Linux only; elsewhere nothing is reported).
	Processes []Process
}

func (c Config) withDefaults() Config {
	if c.Workload == "" {
		c.Workload = WorkloadPing
	}
	if c.Clients == 0 {
		c.Clients = DefaultClients
	}
	if c.Duration == 0 {
		c.Duration = DefaultDuration
	}
	if c.MaxOps == 0 {
		c.MaxOps = DefaultMaxOps
	}
	if c.Rounds == 0 {
		c.Rounds = DefaultRounds
	}
	if c.OpTimeout == 0 {
		c.OpTimeout = DefaultOpTimeout
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.MaxPoolSize == 0 {
		c.MaxPoolSize = DefaultMaxPoolSize
	}
	if c.Database == "" {
		c.Database = DefaultDatabase
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.Workload != WorkloadPing && c.Workload != WorkloadDriver && c.Workload != WorkloadFindInsert:
		return fmt.Errorf("%w: unknown workload %q (want %q, %q or %q)", ErrInvalidConfig, c.Workload, WorkloadPing, WorkloadDriver, WorkloadFindInsert)
	case c.Clients < 1 || c.Clients > maxClients:
		return fmt.Errorf("%w: clients %d out of range [1, %d]", ErrInvalidConfig, c.Clients, maxClients)
	case c.Duration < 0:
		return fmt.Errorf("%w: negative duration", ErrInvalidConfig)
	case c.Warmup < 0 || c.Warmup >= c.Duration:
		return fmt.Errorf("%w: warm-up %v must be in [0, duration %v)", ErrInvalidConfig, c.Warmup, c.Duration)
	case c.MaxOps < 1:
		return fmt.Errorf("%w: max ops %d must be positive", ErrInvalidConfig, c.MaxOps)
	case c.Rounds < 1:
		return fmt.Errorf("%w: rounds %d must be positive", ErrInvalidConfig, c.Rounds)
	case c.RoundOffset < 0:
		return fmt.Errorf("%w: negative round offset %d", ErrInvalidConfig, c.RoundOffset)
	case c.OpTimeout < 0 || c.DialTimeout < 0:
		return fmt.Errorf("%w: negative timeout", ErrInvalidConfig)
	}
	return nil
}
