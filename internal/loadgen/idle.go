package loadgen

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// Idle-probe defaults.
const (
	DefaultIdleSettle   = 2 * time.Second
	DefaultIdleParallel = 32
	// fdReserve leaves descriptors for whatever else the process opens
	// while the probe runs (logs, the driver, listeners).
	fdReserve = 64
)

// ErrTooManyConns is matched (errors.Is) by a *FileLimitError.
var ErrTooManyConns = errors.New("loadgen: too many connections for the file descriptor limit")

// FileLimitError reports an idle probe that would need more file
// descriptors than RLIMIT_NOFILE allows, even after raising the soft limit
// to the hard limit.
type FileLimitError struct {
	// Conns is the number of idle connections asked for.
	Conns int
	// Need is the number of descriptors the probe would hold at its peak.
	Need uint64
	// Limit is the soft RLIMIT_NOFILE after raising it.
	Limit uint64
}

// Error implements error.
func (e *FileLimitError) Error() string {
	return fmt.Sprintf("loadgen: %d idle connections need about %d file descriptors, RLIMIT_NOFILE allows %d (raise the hard limit, e.g. ulimit -Hn)",
		e.Conns, e.Need, e.Limit)
}

// Is makes errors.Is(err, ErrTooManyConns) true.
func (e *FileLimitError) Is(target error) bool { return target == ErrTooManyConns }

// IdleConfig configures ProbeIdle. Zero fields take defaults.
type IdleConfig struct {
	// Conns is the number of idle client connections to open (K).
	Conns int
	// PID is the process whose resident set is measured (the proxy).
	PID int
	// Settle is how long the connections stay idle before RSS is read
	// again, so lazily allocated per-connection state is counted.
	Settle time.Duration
	// DialTimeout bounds each connection attempt including its hello.
	DialTimeout time.Duration
	// Parallel bounds concurrent connection attempts, so the probe does
	// not overflow the target's accept backlog.
	Parallel int
	// SourceAddrs spread the connections over local addresses, as
	// Config.SourceAddrs does, so that more than one address's ephemeral
	// ports can be held open.
	SourceAddrs []netip.Addr
	// Logger receives progress messages; nil discards them.
	Logger *slog.Logger
}

// IdleReport is the outcome of ProbeIdle. JSON sizes are in bytes.
type IdleReport struct {
	// Addr is the probed address.
	Addr string `json:"addr"`
	// PID is the measured process.
	PID int `json:"pid"`
	// Conns is the number of idle connections held during the measure.
	Conns int `json:"conns"`
	// RSSBefore and RSSAfter are the process's VmRSS before opening the
	// connections and after they settled.
	RSSBefore int64 `json:"rss_before_bytes"`
	// RSSAfter is the VmRSS after the settle time.
	RSSAfter int64 `json:"rss_after_bytes"`
	// Delta is RSSAfter - RSSBefore.
	Delta int64 `json:"rss_delta_bytes"`
	// BytesPerConn is Delta / Conns.
	BytesPerConn float64 `json:"bytes_per_conn"`
	// ClosedByPeer counts connections the target had closed by the end of
	// the settle time; when non-zero the figure undercounts.
	ClosedByPeer int `json:"closed_by_peer"`
	// Answered counts the connections that answered a ping after the
	// RSS was read: all of them, or the probe fails.
	Answered int `json:"answered"`
	// FileLimit is the soft RLIMIT_NOFILE the probe ran with.
	FileLimit uint64 `json:"file_limit"`
	// Settle is the settle time used.
	Settle time.Duration `json:"settle_ns"`
	// SelfMeasured is true when PID is the probing process itself; the
	// probe's own client sockets (a few hundred bytes each) are then
	// included in the delta.
	SelfMeasured bool `json:"self_measured"`
}

// WriteTable prints the report in one human-readable line.
func (r *IdleReport) WriteTable(w io.Writer) error {
	_, err := fmt.Fprintf(w, "idle: %d connections to %s: pid %d RSS %.1f MiB -> %.1f MiB, +%.0f bytes per idle client (settle %v, %d closed by peer, %d answered a ping afterwards)\n",
		r.Conns, r.Addr, r.PID, float64(r.RSSBefore)/(1<<20), float64(r.RSSAfter)/(1<<20), r.BytesPerConn, r.Settle, r.ClosedByPeer, r.Answered)
	return err
}

// ProbeIdle opens cfg.Conns client connections to addr, each completing a
// hello and then staying idle, waits cfg.Settle, and reports how much the
// resident set of process cfg.PID grew. It first raises the RLIMIT_NOFILE
// soft limit to the hard limit, and fails with a *FileLimitError (before
// opening anything) when the connections would not fit. Any failed
// connection aborts the probe. All connections are closed before it
// returns. Linux only (it reads /proc).
func ProbeIdle(ctx context.Context, addr string, cfg IdleConfig) (IdleReport, error) {
	if cfg.Settle == 0 {
		cfg.Settle = DefaultIdleSettle
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	if cfg.Parallel == 0 {
		cfg.Parallel = DefaultIdleParallel
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case cfg.Conns < 1:
		return IdleReport{}, fmt.Errorf("%w: idle connections %d must be positive", ErrInvalidConfig, cfg.Conns)
	case cfg.PID < 1:
		return IdleReport{}, fmt.Errorf("%w: idle probe needs the PID to measure", ErrInvalidConfig)
	case cfg.Settle < 0 || cfg.DialTimeout < 0 || cfg.Parallel < 1:
		return IdleReport{}, fmt.Errorf("%w: negative idle settle, dial timeout or parallelism", ErrInvalidConfig)
	}
	self := cfg.PID == os.Getpid()
	rep := IdleReport{Addr: addr, PID: cfg.PID, Conns: cfg.Conns, Settle: cfg.Settle, SelfMeasured: self}

	limit, err := RaiseFileLimit()
	if err != nil {
		return rep, err
	}
	rep.FileLimit = limit
	open, err := openFDs()
	if err != nil {
		return rep, err
	}
	perConn := uint64(1)
	if self {
		// The accepting side of each connection lives here too.
		perConn = 2
	}
	if need := uint64(open) + uint64(cfg.Conns)*perConn + fdReserve; need > limit {
		return rep, &FileLimitError{Conns: cfg.Conns, Need: need, Limit: limit}
	}

	if rep.RSSBefore, err = settledRSS(cfg.PID, self); err != nil {
		return rep, err
	}
	conns, err := openIdle(ctx, addr, cfg)
	defer func() {
		for _, c := range conns {
			if c != nil {
				_ = c.Close()
			}
		}
	}()
	if err != nil {
		return rep, err
	}
	cfg.Logger.Info("loadgen: idle connections open, settling", "conns", len(conns), "settle", cfg.Settle)
	t := time.NewTimer(cfg.Settle)
	select {
	case <-ctx.Done():
		t.Stop()
		return rep, ctx.Err()
	case <-t.C:
	}
	if rep.RSSAfter, err = settledRSS(cfg.PID, self); err != nil {
		return rep, err
	}
	for _, c := range conns {
		closed, err := peerClosed(c)
		if err != nil {
			return rep, err
		}
		if closed {
			rep.ClosedByPeer++
		}
	}
	rep.Delta = rep.RSSAfter - rep.RSSBefore
	rep.BytesPerConn = float64(rep.Delta) / float64(cfg.Conns)
	// Idle is only worth measuring if the connections still work: every
	// one must answer a ping after the settle time.
	var firstErr error
	rep.Answered, firstErr = pingAll(ctx, conns, cfg)
	if firstErr != nil {
		return rep, fmt.Errorf("loadgen: %d of %d idle connections answered a ping afterwards; first failure: %w", rep.Answered, cfg.Conns, firstErr)
	}
	return rep, nil
}

// pingAll sends one ping on every connection, cfg.Parallel at a time, and
// returns how many answered and the first failure.
func pingAll(ctx context.Context, conns []net.Conn, cfg IdleConfig) (int, error) {
	var (
		mu       sync.Mutex
		answered int
		firstErr error
		wg       sync.WaitGroup
	)
	next := make(chan net.Conn)
	for range min(cfg.Parallel, len(conns)) {
		wg.Go(func() {
			for c := range next {
				err := commandOnce(c, pingBody, time.Now().Add(cfg.DialTimeout))
				mu.Lock()
				if err == nil {
					answered++
				} else if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
			}
		})
	}
feed:
	for _, c := range conns {
		select {
		case next <- c:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if firstErr == nil && ctx.Err() != nil {
		firstErr = ctx.Err()
	}
	return answered, firstErr
}

// settledRSS reads the VmRSS of pid. When pid is this process the heap is
// collected and returned to the OS first, so garbage and freed spans do
// not blur the figure.
func settledRSS(pid int, self bool) (int64, error) {
	if self {
		runtime.GC()
		debug.FreeOSMemory()
	}
	return readRSS(pid)
}

// openIdle opens cfg.Conns connections that each complete a hello. On
// error it returns the connections opened so far, for the caller to close.
func openIdle(ctx context.Context, addr string, cfg IdleConfig) ([]net.Conn, error) {
	conns := make([]net.Conn, cfg.Conns)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(cfg.Parallel, cfg.Conns) {
		wg.Go(func() {
			for i := range next {
				c, err := dialHello(ctx, dialerFor(cfg.SourceAddrs, addr, i), addr, cfg.DialTimeout)
				if err != nil {
					cancel(fmt.Errorf("idle connection %d of %d: %w", i+1, cfg.Conns, err))
					continue
				}
				conns[i] = c
			}
		})
	}
feed:
	for i := range conns {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return conns, err
	}
	return conns, nil
}

// dialHello connects and completes one OP_MSG hello, then clears the
// deadline so the connection can sit idle.
func dialHello(ctx context.Context, d *net.Dialer, addr string, timeout time.Duration) (net.Conn, error) {
	deadline := time.Now().Add(timeout)
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	conn, err := d.DialContext(dctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	// Unblocks the hello if the probe is cancelled meanwhile.
	stop := context.AfterFunc(dctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	err = helloOnce(conn, deadline)
	if !stop() || err != nil {
		_ = conn.Close()
		if err == nil {
			err = context.Cause(dctx)
		}
		return nil, fmt.Errorf("hello: %w", err)
	}
	if err := conn.SetDeadline(time.Time{}); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return conn, nil
}

// helloOnce sends a hello on conn and checks the reply.
func helloOnce(conn net.Conn, deadline time.Time) error {
	return commandOnce(conn, helloBody, deadline)
}

// commandOnce sends the command body on conn, checks the reply, and
// clears the deadline again so the connection can go on idling.
func commandOnce(conn net.Conn, body []byte, deadline time.Time) error {
	if err := conn.SetDeadline(deadline); err != nil {
		return err
	}
	defer func() { _ = conn.SetDeadline(time.Time{}) }()
	const reqID = 1
	if _, err := conn.Write(wire.AppendMsg(nil, reqID, 0, 0, body)); err != nil {
		return err
	}
	// A small reader: the probe holds many connections and must not keep
	// buffers alive, so nothing here outlives the call.
	msg, err := wire.ReadMessage(bufio.NewReaderSize(conn, 512), nil, maxReplySize)
	if err != nil {
		return err
	}
	m, err := wire.ParseMsg(msg)
	if err != nil {
		return err
	}
	if m.Header.ResponseTo != reqID {
		return &ReplyError{Reason: fmt.Sprintf("responseTo %d, want %d", m.Header.ResponseTo, reqID)}
	}
	return replyOK(m.Body)
}
