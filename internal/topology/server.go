package topology

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// ServerState says whether a server may be used.
type ServerState int32

const (
	// Unknown: never checked successfully, or the last check or an
	// application error said the server is unreachable or changing state.
	Unknown ServerState = iota
	// Usable: the last check succeeded and the server's pool is ready.
	Usable
)

// String returns "Unknown" or "Usable".
func (s ServerState) String() string {
	switch s {
	case Usable:
		return "Usable"
	case Unknown:
		return "Unknown"
	}
	return "ServerState(" + strconv.Itoa(int(s)) + ")"
}

// Kind is the SDAM server type, derived from the server's hello reply.
type Kind int32

// Server kinds, as in the SDAM specification's ServerType.
const (
	KindUnknown Kind = iota
	KindStandalone
	KindMongos
	KindRSPrimary
	KindRSSecondary
	KindRSArbiter
	KindRSOther
	KindRSGhost
	KindLoadBalancer
)

var kindNames = [...]string{
	KindUnknown:      "Unknown",
	KindStandalone:   "Standalone",
	KindMongos:       "Mongos",
	KindRSPrimary:    "RSPrimary",
	KindRSSecondary:  "RSSecondary",
	KindRSArbiter:    "RSArbiter",
	KindRSOther:      "RSOther",
	KindRSGhost:      "RSGhost",
	KindLoadBalancer: "LoadBalancer",
}

// String returns the SDAM name of the kind.
func (k Kind) String() string {
	if k >= 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Description is an immutable snapshot of what the topology knows about one
// server. A new Description replaces the old one on every change.
type Description struct {
	Address string
	State   ServerState
	// Kind is the type the latest successful hello reported. It is kept when
	// the server becomes Unknown so that logs and errors can say what the
	// server was; State decides usability.
	Kind Kind
	// Hello is the latest successful hello reply, nil before the first one.
	Hello *upstream.Hello
	// LastError is the error that made the server Unknown, nil while Usable.
	LastError error
	// Updated is when this description was made.
	Updated time.Time
}

// Server is one upstream host of a topology with its pool and monitor.
type Server struct {
	topo *Topology
	addr string
	pool *pool.Pool

	// mu serializes description changes together with the pool.Ready or
	// pool.Clear that must accompany them, so that a Usable server never ends
	// up with a paused pool because a clear and a successful check
	// interleaved. It guards no field: desc is atomic so that selection reads
	// it without locking.
	mu   sync.Mutex
	desc atomic.Pointer[Description]

	// rtt is the moving average round-trip time of hello, in nanoseconds;
	// 0 before the first sample. Written only by the monitor goroutine.
	rtt atomic.Int64

	// checkNow asks the monitor for an immediate check (capacity 1, so
	// requests coalesce).
	checkNow chan struct{}

	// mconn is the monitoring connection. Only the monitor goroutine uses it.
	mconn *upstream.Conn

	// checked is set once the first check has ended, whatever its outcome.
	checked atomic.Bool
}

func newServer(t *Topology, addr string) *Server {
	s := &Server{topo: t, addr: addr, checkNow: make(chan struct{}, 1)}
	s.desc.Store(&Description{Address: addr, State: Unknown, Updated: time.Now()})
	return s
}

// Address returns the server's normalized address: "host:port" or a Unix
// socket path.
func (s *Server) Address() string { return s.addr }

// Pool returns the server's connection pool.
func (s *Server) Pool() *pool.Pool { return s.pool }

// Description returns the server's current description.
func (s *Server) Description() Description { return *s.desc.Load() }

// Hello returns the latest successful hello reply, nil before the first.
func (s *Server) Hello() *upstream.Hello { return s.desc.Load().Hello }

// Checked reports whether the monitor's first check of the server has
// ended, with a hello or an error. Behind a load balancer a failed check
// changes nothing else, so this is the only sign of it.
func (s *Server) Checked() bool { return s.checked.Load() }

// State returns whether the server is currently usable.
func (s *Server) State() ServerState { return s.desc.Load().State }

// Kind returns the server type from the latest successful hello.
func (s *Server) Kind() Kind { return s.desc.Load().Kind }

// RTT returns the moving average of hello round-trip times, 0 before the
// first successful check.
func (s *Server) RTT() time.Duration { return time.Duration(s.rtt.Load()) }

// RequestCheck asks the monitor to check the server now instead of at the
// next heartbeat. Requests are coalesced and rate-limited by
// MinHeartbeatInterval, so calling it often is cheap.
func (s *Server) RequestCheck() {
	select {
	case s.checkNow <- struct{}{}:
	default:
	}
}

// rttAlpha is the weight of a new sample in the RTT moving average (SDAM
// uses 0.2).
const rttAlpha = 0.2

func (s *Server) addRTTSample(d time.Duration) {
	old := s.rtt.Load()
	if old == 0 {
		s.rtt.Store(int64(d))
		return
	}
	s.rtt.Store(int64(rttAlpha*float64(d) + (1-rttAlpha)*float64(old)))
}

// markUsable records a successful check. The pool is marked ready before the
// description says Usable, so selection never sees a Usable server whose pool
// is still paused.
func (s *Server) markUsable(h *upstream.Hello) {
	s.mu.Lock()
	prev := s.desc.Load()
	if err := s.pool.Ready(); err != nil {
		// Only a closed pool refuses; the topology is closing.
		s.mu.Unlock()
		return
	}
	d := &Description{Address: s.addr, State: Usable, Kind: kindOf(h, s.topo.opts.Pool.LoadBalanced), Hello: h, Updated: time.Now()}
	s.desc.Store(d)
	s.topo.serverChanged(s, prev, d)
	s.mu.Unlock()
}

// markLoadBalancer makes a load-balanced server Usable before any check:
// there is no SDAM for a load balancer, so its pool is ready from the start.
func (s *Server) markLoadBalancer() {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev := s.desc.Load()
	if err := s.pool.Ready(); err != nil {
		return
	}
	d := &Description{Address: s.addr, State: Usable, Kind: KindLoadBalancer, Hello: prev.Hello, Updated: time.Now()}
	s.desc.Store(d)
	s.topo.serverChanged(s, prev, d)
}

// markUnknown marks the server Unknown with cause err and, if clear is set,
// clears its pool (interrupting in-use connections if interrupt is set).
// The description changes first, as SDAM requires, so that no new selection
// picks the server while its pool is being cleared.
func (s *Server) markUnknown(err error, clear, interrupt bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.markUnknownLocked(err, clear, interrupt)
}

// markUnknownIfCurrent is markUnknown for application errors: it does
// nothing, and returns false, when haveGen is set and gen is older than the
// pool's generation (the error comes from before the last clear). The check
// and the clear happen under s.mu so that two racing errors from the same
// generation clear once.
func (s *Server) markUnknownIfCurrent(err error, clear bool, gen uint64, haveGen bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if haveGen && gen < s.pool.Stats().Generation {
		return false
	}
	s.markUnknownLocked(err, clear, false)
	return true
}

func (s *Server) markUnknownLocked(err error, clear, interrupt bool) {
	prev := s.desc.Load()
	d := &Description{Address: s.addr, State: Unknown, Kind: prev.Kind, Hello: prev.Hello, LastError: err, Updated: time.Now()}
	s.desc.Store(d)
	// Publish (drop from selection) before clearing, as SDAM requires.
	s.topo.serverChanged(s, prev, d)
	if clear {
		s.pool.ClearWithError(err, interrupt)
	}
}

// State-change error codes (SDAM "not writable primary" and "node is
// recovering" errors).
const (
	codeShutdownInProgress          = 91
	codePrimarySteppedDown          = 189
	codeNotWritablePrimary          = 10107
	codeInterruptedAtShutdown       = 11600
	codeInterruptedDueToReplChange  = 11602
	codeNotPrimaryNoSecondaryOk     = 13435
	codeNotPrimaryOrSecondary       = 13436
	minWireVersionKeepingPoolOnStep = 8 // 4.2: stepdown no longer closes connections
)

// IsStateChangeCode reports whether a server error code means the server is
// changing state (stepping down, recovering, shutting down).
func IsStateChangeCode(code int32) bool {
	switch code {
	case codeShutdownInProgress, codePrimarySteppedDown, codeNotWritablePrimary,
		codeInterruptedAtShutdown, codeInterruptedDueToReplChange,
		codeNotPrimaryNoSecondaryOk, codeNotPrimaryOrSecondary:
		return true
	}
	return false
}

func isShutdownCode(code int32) bool {
	return code == codeShutdownInProgress || code == codeInterruptedAtShutdown
}

// HandleError applies SDAM's application error handling to err, seen on c
// while running an operation against this server. c may be nil when the
// error came from CheckOut, or from the pool's background connection
// establishment (Options.Pool.OnBackgroundError is wired here).
//
//   - An error from before the pool's last clear (the connection's, or the
//     failed establishment's, generation is older than the pool's) is stale
//     and ignored: the clear it asks for has happened.
//   - A failure to establish a connection (*pool.ConnectionError or
//     *upstream.ConnectError: network error, timeout, failed hello or
//     authentication) marks the server Unknown and clears the pool. The
//     pool's own CheckOut errors (wait-queue timeout, pool cleared, pool
//     closed) change nothing, and neither does a cancelled context.
//   - A network error that is not a timeout marks the server Unknown and
//     clears the pool. A timeout is the operation's own problem and changes
//     nothing.
//   - A state-change error (codes 10107, 13435, 11600, 11602, 13436, 189,
//     91) marks the server Unknown. The pool is cleared only for shutdown
//     errors (11600, 91) or servers older than 4.2: newer servers keep their
//     connections open across a stepdown, so clearing would only cost
//     reconnects.
//   - Anything else (command errors, pool-cleared or wait-queue errors) is
//     left alone.
//
// Whenever the server is marked Unknown an immediate check is requested, so
// that a healthy server returns to rotation after MinHeartbeatInterval
// rather than a full heartbeat interval.
//
// In load-balanced mode the server never becomes Unknown (there is no SDAM
// for a load balancer); instead the failing backend's connections are
// cleared by serviceId.
func (s *Server) HandleError(err error, c *pool.Conn) {
	if err == nil || s.topo.isClosed() {
		return
	}
	if errors.Is(err, context.Canceled) {
		// Our own cancellation (a clear or close interrupting a pending
		// connection, a client going away) says nothing about the server.
		return
	}
	var connErr *pool.ConnectionError
	var upErr *upstream.ConnectError
	connectFailed := errors.As(err, &connErr) || errors.As(err, &upErr)
	code, isCmd := commandCode(err)
	network := upstream.IsNetworkError(err)
	timeout := isTimeout(err)

	var clear bool
	switch {
	case connectFailed:
		// SDAM: any failure before the handshake completes, timeouts and
		// authentication failures included.
		clear = true
	case isCmd && IsStateChangeCode(code):
		clear = isShutdownCode(code) || s.maxWireVersion() < minWireVersionKeepingPoolOnStep
	case network && !timeout && c != nil:
		clear = true
	default:
		// Timeouts, other command errors, and the pool's own errors from
		// CheckOut (wait-queue timeout, pool cleared or closed).
		return
	}

	if s.topo.opts.Pool.LoadBalanced {
		// The load-balancer specification: never mark the server Unknown;
		// clear only the backend (serviceId) the connection was talking to.
		// A failed handshake has no serviceId yet, so nothing to clear.
		if c == nil {
			return
		}
		if id, ok := c.ServiceID(); ok {
			s.pool.ClearService(id)
		}
		return
	}

	// The generation the failing connection belonged to: errors from before
	// the last clear are stale and must not clear again.
	var gen uint64
	haveGen := true
	switch {
	case c != nil:
		gen = c.Generation()
	case connErr != nil:
		gen = connErr.Generation
	default:
		haveGen = false
	}
	if !s.markUnknownIfCurrent(err, clear, gen, haveGen) {
		s.topo.log.Debug("ignoring error from a connection of an older pool generation",
			slog.String("topology", s.topo.name), slog.String("address", s.addr), slog.Any("error", err))
		return
	}
	s.topo.log.Info("marked server Unknown after an operation error",
		slog.String("topology", s.topo.name), slog.String("address", s.addr),
		slog.Bool("poolCleared", clear), slog.Any("error", err))
	s.RequestCheck()
}

func (s *Server) maxWireVersion() int32 {
	if h := s.Hello(); h != nil {
		return h.MaxWireVersion
	}
	return 0
}

// commandCode returns the server error code carried by err, if any.
func commandCode(err error) (int32, bool) {
	var ce *upstream.CommandError
	if errors.As(err, &ce) {
		return ce.Code, true
	}
	return 0, false
}

// isTimeout reports whether err is a network or context timeout.
func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// kindOf derives the SDAM server type from a hello reply.
func kindOf(h *upstream.Hello, loadBalanced bool) Kind {
	switch {
	case loadBalanced:
		return KindLoadBalancer
	case h == nil:
		return KindUnknown
	case h.Msg == "isdbgrid":
		return KindMongos
	case h.SetName != "":
		switch {
		case h.IsWritablePrimary:
			return KindRSPrimary
		case h.Secondary:
			return KindRSSecondary
		case h.ArbiterOnly:
			return KindRSArbiter
		}
		return KindRSOther
	case helloBool(h, "isreplicaset"):
		return KindRSGhost
	}
	return KindStandalone
}
