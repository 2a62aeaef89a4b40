package topology

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/sdam"
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

// Kind is the SDAM server type (a replica-set member's role), derived from
// the server's hello reply.
type Kind = sdam.ServerType

// Server kinds, as in the SDAM specification's ServerType.
const (
	KindUnknown         = sdam.Unknown
	KindStandalone      = sdam.Standalone
	KindMongos          = sdam.Mongos
	KindPossiblePrimary = sdam.PossiblePrimary
	KindRSPrimary       = sdam.RSPrimary
	KindRSSecondary     = sdam.RSSecondary
	KindRSArbiter       = sdam.RSArbiter
	KindRSOther         = sdam.RSOther
	KindRSGhost         = sdam.RSGhost
	KindLoadBalancer    = sdam.LoadBalancer
)

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
	// SDAM is the server's description in the SDAM topology: its role,
	// round-trip time, tags, set name and versions.
	SDAM sdam.ServerDescription
}

// Server is one upstream host of a topology with its pool and monitor.
type Server struct {
	topo *Topology
	addr string
	pool *pool.Pool
	// share is the budget of pool and every user pool together
	// (Options.MaxDBConnections); set before the pool is made.
	share *pool.Share

	// desc is written under the topology's mu, together with the pool.Ready
	// or pool.Clear that must accompany it, so that a Usable server never
	// ends up with a paused pool because a clear and a successful check
	// interleaved; it is atomic so that selection reads it without locking.
	desc atomic.Pointer[Description]

	// stop stops the server's monitor; set under the topology's mu when
	// the monitor starts.
	stop func()
	// removed is set when the server leaves the topology.
	removed atomic.Bool
	// loadBalancer is set, before the monitor starts, for a load
	// balancer: there is no SDAM behind one.
	loadBalancer bool

	// rtt is the moving average round-trip time of hello, in nanoseconds;
	// noRTT before the first sample and after the server became Unknown.
	// Written by the monitor, its RTT goroutine and setDescLocked, each
	// with a compare-and-swap.
	rtt atomic.Int64

	// checkNow asks the monitor for an immediate check (capacity 1, so
	// requests coalesce).
	checkNow chan struct{}

	// mconn is the monitoring connection. Only the monitor goroutine uses it.
	mconn *upstream.Conn

	// checked is set once the first check has ended, whatever its outcome.
	checked atomic.Bool

	// users are the server's user pools (users.go).
	users userPools
}

func newServer(t *Topology, addr string) *Server {
	s := &Server{topo: t, addr: addr, checkNow: make(chan struct{}, 1)}
	s.rtt.Store(noRTT)
	s.desc.Store(&Description{Address: addr, State: Unknown, Updated: time.Now()})
	return s
}

// Address returns the server's normalized address: "host:port" or a Unix
// socket path.
func (s *Server) Address() string { return s.addr }

// Pool returns the server's connection pool.
func (s *Server) Pool() *pool.Pool { return s.pool }

// Share returns the connection budget the server's main pool and user pools
// share (max_db_connections).
func (s *Server) Share() *pool.Share { return s.share }

// SetMaxDBConnections changes the server's max_db_connections live (a
// reload; 0: no cap).
func (s *Server) SetMaxDBConnections(n int) error { return s.share.SetMax(n) }

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
// first successful check and while the server is Unknown.
func (s *Server) RTT() time.Duration { return time.Duration(max(s.rtt.Load(), 0)) }

// avgRTT returns the moving average and whether there is one.
func (s *Server) avgRTT() (time.Duration, bool) {
	v := s.rtt.Load()
	return time.Duration(max(v, 0)), v != noRTT
}

// RequestCheck asks the monitor to check the server now instead of at the
// next heartbeat. Requests are coalesced and rate-limited by
// MinHeartbeatInterval, so calling it often is cheap.
func (s *Server) RequestCheck() {
	select {
	case s.checkNow <- struct{}{}:
	default:
	}
}

// noRTT is Server.rtt without an average.
const noRTT = -1

// addRTTSample folds a hello round trip into the average, as
// server-selection.md computes it (sdam.NextAvgRTT: rounded, a negative
// sample counted as zero). The monitor and the RTT goroutine both add
// samples, and a change to Unknown resets the average, hence the
// compare-and-swap.
func (s *Server) addRTTSample(d time.Duration) {
	for {
		old := s.rtt.Load()
		next := sdam.NextAvgRTT(time.Duration(max(old, 0)), old != noRTT, d)
		if s.rtt.CompareAndSwap(old, int64(next)) {
			return
		}
	}
}

// resetRTT forgets the average: SDAM sets a server's round-trip time to
// null when it changes from a known type to Unknown, and the next sample
// starts the average afresh instead of being weighed against a server that
// may since have moved or restarted.
func (s *Server) resetRTT() { s.rtt.Store(noRTT) }

// markUsable records a successful check: the hello becomes the server's
// new SDAM description, applied to the topology.
func (s *Server) markUsable(h *upstream.Hello) {
	now := time.Now()
	var sd sdam.ServerDescription
	if s.loadBalancer {
		sd = sdam.ServerDescription{Address: s.addr, Type: sdam.LoadBalancer, LastUpdateTime: now}
	} else {
		sd = sdam.ParseServerDescription(s.addr, h.Raw, s.RTT(), now)
	}
	s.topo.update(s, sd, h, false, false)
}

// isTimeout reports whether err is a network or context timeout.
func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
