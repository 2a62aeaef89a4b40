// Package proxy is the client-facing side of mongobouncer: it accepts
// driver connections, answers the handshake as a mongos, and forwards every
// other command to an upstream connection lent by the route's pool,
// according to the route's pool mode.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/topology"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// Route sends the commands of one database (or of every database, for the
// "*" route) to one upstream deployment.
type Route struct {
	// Name is the database name, or "*" for the catch-all route.
	Name string
	// Mode is the pool mode of this route's clients.
	Mode PoolMode
	// Topology holds the route's servers and their pools.
	Topology *topology.Topology

	// cursors remembers which server opened a cursor, and txns which server
	// runs a transaction. They are used only when the route has more than
	// one server: with one, every command goes to it anyway.
	cursors *affinity[int64, *topology.Server]
	txns    *affinity[txnKey, *topology.Server]
	multi   bool
}

// Options configure a Server. The zero value of each field has a usable
// meaning, noted on the field.
type Options struct {
	// Routes maps database names to routes; "*" catches every other database.
	Routes []*Route
	// MaxClientConn bounds client connections; 0 means 10000.
	MaxClientConn int
	// MaxMessageSize bounds any message read from a client; 0 means 48,000,000.
	// The upstream's smaller maxMessageSizeBytes wins once known.
	MaxMessageSize int
	// ClientIdleTimeout closes clients idle that long; 0 means never.
	ClientIdleTimeout time.Duration
	// HandshakeWait bounds how long a client's first hello waits for any
	// upstream's hello (for its limits); 0 means 5s. After it, defaults are
	// used.
	HandshakeWait time.Duration
	// Compressors are offered to clients in our order of preference; nil
	// means snappy, zstd, zlib.
	Compressors []string
	// MaxCursors and MaxTransactions bound the affinity maps of each route;
	// 0 means 100000 and 100000.
	MaxCursors, MaxTransactions int
	// AbortTimeout bounds the abortTransaction sent for a client that
	// disconnects inside a transaction; 0 means 5s.
	AbortTimeout time.Duration
	// Logger receives client connect/disconnect at info and problems at
	// warn; nil discards.
	Logger *slog.Logger
}

func (o *Options) setDefaults() {
	if o.MaxClientConn == 0 {
		o.MaxClientConn = 10000
	}
	if o.MaxMessageSize == 0 {
		o.MaxMessageSize = wire.DefaultMaxMessageSize
	}
	if o.HandshakeWait == 0 {
		o.HandshakeWait = 5 * time.Second
	}
	if o.Compressors == nil {
		o.Compressors = []string{"snappy", "zstd", "zlib"}
	}
	if o.MaxCursors == 0 {
		o.MaxCursors = 100_000
	}
	if o.MaxTransactions == 0 {
		o.MaxTransactions = 100_000
	}
	if o.AbortTimeout == 0 {
		o.AbortTimeout = 5 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Server accepts client connections on any number of listeners.
type Server struct {
	opts      Options
	routes    map[string]*Route
	wildcard  *Route
	serviceID bson.ObjectID
	log       *slog.Logger

	nextClientID atomic.Int64
	clientCount  atomic.Int64
	totalClients atomic.Uint64

	mu        sync.Mutex // guards listeners, clients and closed
	listeners map[net.Listener]struct{}
	clients   map[*client]struct{}
	closed    bool

	wg sync.WaitGroup // accept loops and client goroutines

	txnMu sync.Mutex // guards txnOwners
	// txnOwners maps an open transaction to the client that began it.
	txnOwners map[txnKey]*client
}

// ErrServerClosed is returned by Serve after Close.
var ErrServerClosed = errors.New("mongobouncer: server closed")

// New builds a Server. Routes must have distinct names.
func New(opts Options) (*Server, error) {
	opts.setDefaults()
	s := &Server{
		opts:      opts,
		routes:    make(map[string]*Route),
		serviceID: bson.NewObjectID(),
		log:       opts.Logger,
		listeners: make(map[net.Listener]struct{}),
		clients:   make(map[*client]struct{}),
	}
	for _, r := range opts.Routes {
		if r == nil || r.Topology == nil {
			return nil, fmt.Errorf("proxy: route %q has no topology", routeName(r))
		}
		if _, dup := s.routes[r.Name]; dup || (r.Name == "*" && s.wildcard != nil) {
			return nil, fmt.Errorf("proxy: route %q is defined twice", r.Name)
		}
		r.cursors = newAffinity[int64, *topology.Server](opts.MaxCursors, 30*time.Minute)
		r.txns = newAffinity[txnKey, *topology.Server](opts.MaxTransactions, 30*time.Minute)
		r.multi = len(r.Topology.Servers()) > 1
		if r.Name == "*" {
			s.wildcard = r
		} else {
			s.routes[r.Name] = r
		}
	}
	if len(opts.Routes) == 0 {
		return nil, errors.New("proxy: no routes")
	}
	return s, nil
}

func routeName(r *Route) string {
	if r == nil {
		return "<nil>"
	}
	return r.Name
}

// Route returns the route named name ("*" for the catch-all), or nil.
func (s *Server) Route(name string) *Route {
	if name == "*" {
		return s.wildcard
	}
	return s.routes[name]
}

// routeFor finds the route of a database name given as bytes; the map
// lookup with a converted key does not allocate.
func (s *Server) routeFor(db []byte) *Route {
	if r, ok := s.routes[string(db)]; ok {
		return r
	}
	return s.wildcard
}

// Serve accepts clients on l until Close. If only is not nil, every command
// of these clients goes to that route whatever its $db (a listener
// dedicated to one route).
func (s *Server) Serve(l net.Listener, only *Route) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		l.Close()
		return ErrServerClosed
	}
	s.listeners[l] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()

	var backoff time.Duration
	for {
		nc, err := l.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || isTemporaryAcceptError(err) {
				// Out of file descriptors and the like: back off rather than spin.
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.log.Warn("accept failed; retrying", "listen", l.Addr().String(), "error", err, "backoff", backoff)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		s.accept(nc, only)
	}
}

func isTemporaryAcceptError(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

// accept starts the goroutine of one client, or refuses it when the server
// is full or closing.
func (s *Server) accept(nc net.Conn, only *Route) {
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	n := s.clientCount.Add(1)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.clientCount.Add(-1)
		nc.Close()
		return
	}
	c := newClient(s, nc, only)
	over := n > int64(s.opts.MaxClientConn)
	if !over {
		s.clients[c] = struct{}{}
	}
	s.wg.Add(1)
	s.mu.Unlock()
	s.totalClients.Add(1)
	if over {
		go func() {
			defer s.wg.Done()
			defer s.clientCount.Add(-1)
			c.refuse(fmt.Sprintf("mongobouncer: too many client connections (max_client_conn = %d)", s.opts.MaxClientConn))
		}()
		return
	}
	go func() {
		defer s.wg.Done()
		defer s.clientCount.Add(-1)
		c.serve()
		s.mu.Lock()
		delete(s.clients, c)
		s.mu.Unlock()
	}()
}

// ClientCount returns the number of connected clients.
func (s *Server) ClientCount() int { return int(s.clientCount.Load()) }

// TotalClients returns the number of clients accepted since start.
func (s *Server) TotalClients() uint64 { return s.totalClients.Load() }

// Close stops every listener, disconnects every client (aborting their open
// transactions) and waits for their goroutines, bounded by ctx. It does not
// close the routes' topologies: their owner does.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	for l := range s.listeners {
		l.Close()
	}
	for c := range s.clients {
		c.closeConn()
	}
	s.mu.Unlock()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("mongobouncer: clients still running at close: %w", ctx.Err())
	}
}

// limits returns the limits to advertise: the minimum over every upstream
// that has answered a hello. ok is false when none has.
func (s *Server) limits() (limits, bool) {
	lim := defaultLimits
	found := false
	visit := func(r *Route) {
		if r == nil {
			return
		}
		for _, srv := range r.Topology.Servers() {
			h := srv.Hello()
			if h == nil {
				continue
			}
			if !found {
				found = true
				lim = limits{minWire: h.MinWireVersion, maxWire: min(h.MaxWireVersion, OurMaxWireVersion),
					maxBSON: h.MaxBSONObjectSize, maxMsg: h.MaxMessageSizeBytes, maxBatch: h.MaxWriteBatchSize,
					sessionTimeoutMin: defaultLimits.sessionTimeoutMin}
				if h.LogicalSessionTimeoutMinutes != nil {
					lim.sessionTimeoutMin = *h.LogicalSessionTimeoutMinutes
				}
				lim.fillZero()
				continue
			}
			lim.minWire = max(lim.minWire, h.MinWireVersion)
			lim.maxWire = min(lim.maxWire, h.MaxWireVersion)
			lim.maxBSON = minPositive(lim.maxBSON, h.MaxBSONObjectSize)
			lim.maxMsg = minPositive(lim.maxMsg, h.MaxMessageSizeBytes)
			lim.maxBatch = minPositive(lim.maxBatch, h.MaxWriteBatchSize)
			if h.LogicalSessionTimeoutMinutes != nil {
				lim.sessionTimeoutMin = min(lim.sessionTimeoutMin, *h.LogicalSessionTimeoutMinutes)
			}
		}
	}
	visit(s.wildcard)
	for _, r := range s.routes {
		visit(r)
	}
	if lim.maxMsg > int32(s.opts.MaxMessageSize) {
		lim.maxMsg = int32(s.opts.MaxMessageSize)
	}
	return lim, found
}

// fillZero replaces limits an upstream left out with MongoDB's defaults.
func (l *limits) fillZero() {
	if l.maxBSON <= 0 {
		l.maxBSON = defaultLimits.maxBSON
	}
	if l.maxMsg <= 0 {
		l.maxMsg = defaultLimits.maxMsg
	}
	if l.maxBatch <= 0 {
		l.maxBatch = defaultLimits.maxBatch
	}
	if l.maxWire <= 0 {
		l.maxWire = defaultLimits.maxWire
	}
}

func minPositive(a, b int32) int32 {
	if b > 0 && b < a {
		return b
	}
	return a
}

// waitLimits returns the upstream limits, waiting up to HandshakeWait for
// the first upstream hello.
func (s *Server) waitLimits() limits {
	if lim, ok := s.limits(); ok {
		return lim
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.HandshakeWait)
	defer cancel()
	r := s.wildcard
	if r == nil {
		for _, rr := range s.routes {
			r = rr
			break
		}
	}
	if r != nil {
		_, _ = r.Topology.WaitHello(ctx)
	}
	lim, _ := s.limits()
	return lim
}
