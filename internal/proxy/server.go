package proxy

// The Server: listeners, the set of connected clients, limits advertised
// in the handshake, graceful shutdown and SHOW CLIENTS.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/clienttls"
	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/gate"
	"github.com/mongobouncer/mongobouncer/internal/hello"
	"github.com/mongobouncer/mongobouncer/internal/routing"
	"github.com/mongobouncer/mongobouncer/internal/session"
	"github.com/mongobouncer/mongobouncer/internal/topology"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// Options configure a Server. The zero value of each field has a usable
// meaning, noted on the field.
type Options struct {
	// Routes maps database names to routes; "*" catches every other database.
	Routes []*routing.Route
	// MaxClientConn bounds client connections; 0 means 10000.
	MaxClientConn int
	// MaxMessageSize bounds any message read from a client; 0 means 48,000,000.
	// The upstream's smaller maxMessageSizeBytes wins once known.
	MaxMessageSize int
	// MaxPreLoginMessageSize bounds, with Auth, a message (and a compressed
	// message's declared size) from a client that has not logged in; 0
	// means gate.DefaultMaxPreLoginMessageSize (max_prelogin_message_size).
	MaxPreLoginMessageSize int
	// MaxUserClientConn caps the clients logged in as one user; 0 means no
	// cap (max_user_client_conn; SetUserClientLimit changes it).
	MaxUserClientConn int
	// ClientIdleTimeout closes clients idle that long; 0 means never.
	ClientIdleTimeout time.Duration
	// ClientLoginTimeout closes a client that has sent no whole message
	// that long after connecting, or (with Auth) has not logged in and
	// stays silent that long, or leaves a message or a SASL conversation
	// unfinished that long (logintimeout.go); 0 means never.
	ClientLoginTimeout time.Duration
	// HandshakeWait bounds how long a client's hello waits for every
	// route's servers to answer a hello or fail a check (for their
	// limits); 0 means 5s. After it, the minimum over those that answered
	// is used (defaults if none has).
	HandshakeWait time.Duration
	// Compressors are offered to clients in our order of preference; nil
	// means snappy, zstd, zlib.
	Compressors []string
	// MaxCursors and MaxTransactions bound the affinity maps of each route;
	// 0 means 100000 and 100000.
	MaxCursors, MaxTransactions int
	// CommandTimeout bounds the commands mongobouncer sends upstream on its
	// own: the abortTransaction sent for a client that disconnects inside a
	// transaction, and the fence after a request sent with moreToCome; 0
	// means 5s.
	CommandTimeout time.Duration
	// Logger receives client connect/disconnect at info and problems at
	// warn; nil discards.
	Logger *slog.Logger
	// Observer hears about clients and requests, for metrics; nil ignores.
	Observer Observer
	// Admin answers commands on the "mongobouncer" database; nil refuses
	// them.
	Admin AdminHandler
	// Auth makes clients log in before they run commands; nil lets every
	// client in (auth_type = "none").
	Auth *ClientAuth
	// EventLoop serves idle clients and plain requests on event-loop
	// threads, without a goroutine per client (Linux only; elsewhere it is
	// ignored). False serves every client on its own goroutine.
	EventLoop bool
	// LoopThreads is the number of event-loop threads; 0 means GOMAXPROCS
	// when the loop starts. Each blocks in epoll_wait holding an OS thread,
	// so a process that wants goroutine work (accepts, monitors, clients
	// served by their goroutine) never to wait behind them runs with more
	// Ps than loop threads (cmd/mongobouncer runs one more).
	LoopThreads int
	// LoopIO chooses the event loop's I/O: LoopIOAuto (io_uring where the
	// kernel allows it, else epoll; "" too), LoopIOEpoll, or LoopIOUring
	// (io_uring or New fails). Server.LoopIO says which one runs.
	LoopIO config.EventLoopIO
	// LoopSpin bounds how long an io_uring loop thread waits awake for the
	// reply to its one request in flight, and the average reply delay
	// under which it does (loop_spin_linux.go); 0 never spins.
	LoopSpin time.Duration
	// TLS is the TLS offered to clients; the zero value offers none.
	// SetTLS changes it live.
	TLS clienttls.Settings
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
	if o.CommandTimeout == 0 {
		o.CommandTimeout = 5 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Observer == nil {
		o.Observer = nopObserver{}
	}
}

// Server accepts client connections on any number of listeners.
type Server struct {
	opts      Options
	table     atomic.Pointer[routing.Table]
	serviceID bson.ObjectID
	log       *slog.Logger

	// maxClients and idleTimeout (nanoseconds) are the live values of
	// MaxClientConn and ClientIdleTimeout (SetClientLimits).
	maxClients  atomic.Int64
	idleTimeout atomic.Int64
	// loginTimeout (nanoseconds) is the live ClientLoginTimeout
	// (SetLoginTimeout); loginTimeouts counts the clients it closed.
	loginTimeout  atomic.Int64
	loginTimeouts atomic.Uint64
	// sweepKick wakes the loop's idle sweeper when SetLoginTimeout
	// shortens the timeout, so that it need not sleep out the old one's
	// interval.
	sweepKick chan struct{}
	// preLoginMax is max_prelogin_message_size, live
	// (SetPreLoginMessageSize); 0 means gate.DefaultMaxPreLoginMessageSize.
	preLoginMax atomic.Int64

	nextClientID atomic.Int64
	clientCount  atomic.Int64
	totalClients atomic.Uint64

	// pass holds the secrets pass-through routes log in upstream with,
	// one per user (passthrough.go).
	pass topology.UserSecrets

	// userClients counts logged-in clients per user (max_user_client_conn).
	userClients gate.Users

	clientsMu sync.Mutex // guards listeners, clients and closed
	listeners map[net.Listener]struct{}
	// acceptors counts the Serve loops running; none starts once draining
	// is set (Serve checks it under clientsMu).
	acceptors sync.WaitGroup
	clients   map[*client]struct{}
	closed    bool

	wg sync.WaitGroup // accept loops and client goroutines

	// draining is set by Shutdown: requests that are not part of an open
	// transaction get ShutdownInProgress.
	draining atomic.Bool
	// closing is set by Close before it disconnects the clients: a client's
	// goroutine then no longer hands it to the loop (enterLoop), where
	// nobody would disconnect it.
	closing atomic.Bool
	// topo is the topologyVersion of hello replies, the awaitable hellos
	// on it and hello_max_await (hello.go).
	topo hello.State
	// stopping is closed by Shutdown and Close, to end waits at pause gates
	// and awaitable hellos.
	stopping     chan struct{}
	stoppingOnce sync.Once

	// loopsPtr is the event loop, started by the first client that can use
	// it (loopsFor) and stopped by Close.
	loopsPtr atomic.Pointer[loops]
	// loopSpins counts the loop threads' spins (LoopSpins).
	loopSpins spinCounts
	// flush holds the client sockets Close lets their replies out of
	// (linger_linux.go).
	flush    flusher
	loopsMu  sync.Mutex // guards loopsOff and the start of the loop
	loopsOff bool       // the loop failed to start, or the server closed

	txnMu sync.Mutex // guards txnOwners
	// txnOwners maps an open transaction to the session that began it.
	txnOwners map[command.TxnKey]*session.Session

	// tls is the client TLS in force (SetTLS) and its refusals.
	tls clienttls.Terminator
	// panics counts the panics recovered while serving clients (recover.go).
	panics atomic.Uint64
}

// LoopIO values: Options.LoopIO, config's event_loop_io values (typed once,
// in config) under the proxy's names.
const (
	// LoopIOAuto uses io_uring where the kernel allows it, epoll elsewhere
	// ("" too).
	LoopIOAuto = config.EventLoopIOAuto
	// LoopIOEpoll uses epoll and read system calls.
	LoopIOEpoll = config.EventLoopIOEpoll
	// LoopIOUring requires io_uring: New starts the loop at once and fails
	// where the ring cannot start (a kernel that refuses io_uring, or a
	// locked-memory limit), rather than running epoll.
	LoopIOUring = config.EventLoopIOUring
)

// LoopIOOff is what Server.LoopIO says when no event loop runs.
const LoopIOOff = "off"

// LoopIO names the I/O the event loop runs on: "io_uring" or "epoll", read
// from the driver that started; LoopIOOff when the loop is off, has no
// support here, could not start (every client is then served by its
// goroutine) or has stopped. It starts the loop if it has not started yet,
// so that the name is what runs and not a prediction (app logs it in the
// startup line): LoopIOAuto may fall back to epoll where a ring cannot
// start although the kernel has io_uring.
func (s *Server) LoopIO() string {
	if !s.opts.EventLoop || !EventLoopSupported {
		return LoopIOOff
	}
	l, err := s.startLoops()
	if err != nil {
		s.log.Warn("event loop unavailable; every client is served by its goroutine", "error", err)
	}
	return loopDriverName(l)
}

// ErrServerClosed is returned by Serve after Close.
var ErrServerClosed = errors.New("mongobouncer: server closed")

// New builds a Server. Routes must have distinct names.
func New(opts Options) (*Server, error) {
	opts.setDefaults()
	s := &Server{
		opts:      opts,
		serviceID: bson.NewObjectID(),
		log:       opts.Logger,
		listeners: make(map[net.Listener]struct{}),
		clients:   make(map[*client]struct{}),
		stopping:  make(chan struct{}),
		sweepKick: make(chan struct{}, 1),
	}
	s.topo.Init()
	s.maxClients.Store(int64(opts.MaxClientConn))
	s.SetUserClientLimit(opts.MaxUserClientConn)
	s.preLoginMax.Store(int64(opts.MaxPreLoginMessageSize))
	s.idleTimeout.Store(int64(opts.ClientIdleTimeout))
	s.SetLoginTimeout(opts.ClientLoginTimeout)
	t, err := routing.NewTable(opts.Routes, opts.MaxCursors, opts.MaxTransactions)
	if err != nil {
		return nil, err
	}
	s.table.Store(t)
	if err := s.SetTLS(opts.TLS); err != nil {
		return nil, err
	}
	if opts.EventLoop && opts.LoopIO == LoopIOUring && EventLoopSupported {
		if _, err := s.startLoops(); err != nil {
			return nil, fmt.Errorf("proxy: io_uring required, and it cannot start: %w", err)
		}
	}
	return s, nil
}

// Serve accepts clients on l until Close. If only is not "", every command
// of these clients goes to that route whatever its $db (a listener
// dedicated to one route).
func (s *Server) Serve(l net.Listener, only string) error {
	s.clientsMu.Lock()
	if s.closed || s.draining.Load() {
		s.clientsMu.Unlock()
		l.Close()
		return ErrServerClosed
	}
	s.listeners[l] = struct{}{}
	s.wg.Add(1)
	s.acceptors.Add(1)
	s.clientsMu.Unlock()
	defer s.wg.Done()
	defer s.acceptors.Done()

	var backoff time.Duration
	for {
		nc, err := l.Accept()
		if err != nil {
			s.clientsMu.Lock()
			closed := s.closed
			s.clientsMu.Unlock()
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
		s.accept(nc, only, l.Addr().String())
	}
}

func isTemporaryAcceptError(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

// accept starts the goroutine of one client, or refuses it when the server
// is full or closing.
func (s *Server) accept(nc net.Conn, only string, listener string) {
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	n := s.clientCount.Add(1)
	s.clientsMu.Lock()
	if s.closed {
		s.clientsMu.Unlock()
		s.clientCount.Add(-1)
		nc.Close()
		return
	}
	c := newClient(s, nc, only, listener)
	limit := s.maxClients.Load()
	over := n > limit
	if !over {
		s.clients[c] = struct{}{}
	}
	s.wg.Add(1)
	s.clientsMu.Unlock()
	s.totalClients.Add(1)
	if over {
		go func() {
			defer s.wg.Done()
			defer s.clientCount.Add(-1)
			defer s.recoverRefused(&c.conn, c.log)
			c.refuse(c.log, fmt.Sprintf("mongobouncer: too many client connections (max_client_conn = %d)", limit))
		}()
		return
	}
	s.opts.Observer.ClientConnected()
	// The client's finalize releases its count in wg, whoever serves it then.
	go c.serve()
}

// ClientCount returns the number of connected clients.
func (s *Server) ClientCount() int { return int(s.clientCount.Load()) }

// TotalClients returns the number of clients accepted since start.
func (s *Server) TotalClients() uint64 { return s.totalClients.Load() }

// Close stops every listener, disconnects every client (aborting their open
// transactions) and waits for their goroutines, bounded by ctx. It does not
// close the routes' topologies: their owner does.
func (s *Server) Close(ctx context.Context) error {
	// Clients waiting at a paused route's gate give up.
	s.stoppingOnce.Do(func() { close(s.stopping) })
	s.closing.Store(true)
	s.clientsMu.Lock()
	s.closed = true
	for l := range s.listeners {
		l.Close()
	}
	s.clientsMu.Unlock()
	// Outside s.mu: finishing a loop-owned client takes it.
	for _, c := range s.snapshot() {
		c.disconnect()
	}
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	defer s.stopLoops()
	select {
	case <-done:
		// Replies already written may still be on their way to clients
		// that read slowly: let them out before the sockets close.
		err := s.awaitLoopSends(ctx)
		if ferr := s.flush.Await(ctx); err == nil {
			err = ferr
		}
		return err
	case <-ctx.Done():
		_ = s.flush.Await(ctx)
		return fmt.Errorf("mongobouncer: clients still running at close: %w", ctx.Err())
	}
}

// waitLimits returns the hello limits agreed over every route's servers,
// waiting (up to HandshakeWait) for their first checks at startup.
func (s *Server) waitLimits() hello.Limits {
	return routing.WaitLimits(s.table.Load, int32(s.opts.MaxMessageSize), s.opts.HandshakeWait, s.stopping)
}

// Shutdown drains the server gracefully: listeners stop accepting, requests
// that are not part of a transaction a client has open get
// ShutdownInProgress (code 91) so that drivers move to another
// mongobouncer, and requests in flight and open transactions may finish.
// When every client is idle with no open transaction, or ctx ends, the
// remaining clients are disconnected (their open transactions aborted) and
// Shutdown returns; ctx's error says whether the drain was complete.
func (s *Server) Shutdown(ctx context.Context) error {
	if dl, ok := ctx.Deadline(); ok {
		s.topo.SetDrainDeadline(dl)
	}
	// The listeners close before anything says "shutting down": a driver
	// that hears the quiesce (or a request's 91) clears its pool and opens
	// new connections at once, and behind a balancer that has not yet seen
	// /readyz fail, those reach this instance. Refused, the balancer sends
	// them on elsewhere; accepted in the moment before a close, their
	// handshake would meet the quiesce reply, and a driver with the plain
	// URI would clear its pool a second time, failing retries in flight
	// (TestDrainBehindABalancerDevmongo saw it once). draining is set under
	// clientsMu, so Serve refuses any listener from now on.
	s.clientsMu.Lock()
	for l := range s.listeners {
		l.Close()
	}
	s.draining.Store(true)
	s.clientsMu.Unlock()
	// Quiesce: the topologyVersion moves and every waiting hello answers
	// ShutdownInProgress now (hello.go).
	s.topo.Bump()
	s.stoppingOnce.Do(func() { close(s.stopping) })
	// A client an accept loop took just before its listener closed is
	// registered once the loop ends: wait for that, so the drain counts it
	// (and Close disconnects it only after its first reply, see drained)
	// rather than Close refusing it with its first request unread, a reset.
	// The loops end as soon as they see their listener closed.
	accepting := make(chan struct{})
	go func() { s.acceptors.Wait(); close(accepting) }()
	select {
	case <-accepting:
	case <-ctx.Done():
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var drainErr error
wait:
	for !s.drained() {
		select {
		case <-ctx.Done():
			drainErr = fmt.Errorf("mongobouncer: shutdown timeout with requests or transactions still running: %w", ctx.Err())
			break wait
		case <-tick.C:
		}
	}
	// Disconnecting clients aborts what they left open; give that its own
	// short bound so a dead upstream cannot hold the exit.
	cctx, cancel := context.WithTimeout(context.Background(), s.opts.CommandTimeout+time.Second)
	defer cancel()
	if err := s.Close(cctx); err != nil && drainErr == nil {
		drainErr = err
	}
	return drainErr
}

// Draining reports whether Shutdown has begun.
func (s *Server) Draining() bool { return s.draining.Load() }

// freshClientGrace is how long the drain waits for the first message of a
// client accepted just before the listeners closed: disconnecting it with
// its first request unread would reset it (with so_reuseport, an upgrade's
// connections accepted by the old process at the last moment), where
// answering lets its driver move on cleanly. Bounded: a client that stays
// silent holds the drain this long at most.
const freshClientGrace = time.Second

// drained reports whether no awaitable hello is being served, and no
// client has a request in flight or a transaction open, or is new and has not sent its first message yet
// (freshClientGrace).
func (s *Server) drained() bool {
	if s.topo.Serving() > 0 {
		// An awaitable hello writing its quiesce reply (hello.go).
		return false
	}
	now := time.Now()
	s.clientsMu.Lock()
	defer s.clientsMu.Unlock()
	for c := range s.clients {
		if c.sess.Busy() || !c.spoke.Load() && now.Sub(c.connected) < freshClientGrace {
			return false
		}
	}
	return true
}

// ClientInfo describes one connected client (SHOW CLIENTS).
type ClientInfo struct {
	ID      int64
	Addr    string
	AppName string
	// User is who the client logged in as ("user@db"), "" before.
	User         string
	Listener     string
	ConnectedAt  time.Time
	State        string // idle | waiting | active | pinned
	PinnedServer string
	Requests     uint64
	// LoadBalanced is set when the client's handshake said loadBalanced
	// (a driver with loadBalanced=true, behind a balancer).
	LoadBalanced bool
}

// Clients returns a snapshot of the connected clients, oldest first.
func (s *Server) Clients() []ClientInfo {
	s.clientsMu.Lock()
	cs := make([]*client, 0, len(s.clients))
	for c := range s.clients {
		cs = append(cs, c)
	}
	s.clientsMu.Unlock()
	out := make([]ClientInfo, 0, len(cs))
	for _, c := range cs {
		ci := ClientInfo{ID: c.id, Addr: c.remote, Listener: c.listener, ConnectedAt: c.connected,
			State: c.sess.State().String(), Requests: c.sess.Requests()}
		in := c.sess.Describe()
		ci.AppName, ci.User, ci.LoadBalanced, ci.PinnedServer = in.AppName, in.User, in.LoadBalanced, in.PinnedServer
		out = append(out, ci)
	}
	slices.SortFunc(out, func(a, b ClientInfo) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// SetPreLoginMessageSize changes max_prelogin_message_size live
// (configuration reload); 0 means gate.DefaultMaxPreLoginMessageSize. It
// applies from each client's next message.
func (s *Server) SetPreLoginMessageSize(n int) { s.preLoginMax.Store(int64(n)) }

// SetClientLimits changes max_client_conn and client_idle_timeout live
// (configuration reload). Connected clients over a lowered limit stay.
func (s *Server) SetClientLimits(maxClientConn int, idleTimeout time.Duration) {
	if maxClientConn <= 0 {
		maxClientConn = 10000
	}
	s.maxClients.Store(int64(maxClientConn))
	s.idleTimeout.Store(int64(idleTimeout))
}
