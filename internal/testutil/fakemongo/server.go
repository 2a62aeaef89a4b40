package fakemongo

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// Kind is the kind of server the fake claims to be in its hello reply.
type Kind int

const (
	// Standalone is a lone mongod.
	Standalone Kind = iota
	// ReplicaSetMember is a replica-set member (primary unless
	// Options.Secondary).
	ReplicaSetMember
	// Mongos is a sharded-cluster router (msg: "isdbgrid").
	Mongos
)

// Defaults of the hello reply, those of MongoDB 8.0.
const (
	DefaultMaxWireVersion               = 25
	DefaultMaxBSONObjectSize            = 16 * 1024 * 1024
	DefaultMaxMessageSizeBytes          = 48_000_000
	DefaultMaxWriteBatchSize            = 100_000
	DefaultLogicalSessionTimeoutMinutes = 30
)

// Options shape a fake server. The zero value is a standalone 8.0 mongod
// without compression, topologyVersion or in-memory engine.
type Options struct {
	// Kind is what hello says the server is.
	Kind Kind
	// SetName, Hosts, Primary and Secondary describe a ReplicaSetMember.
	// Empty Hosts defaults to the server's own address, and empty Primary
	// to that address unless Secondary.
	SetName   string
	Hosts     []string
	Primary   string
	Secondary bool

	// MaxWireVersion defaults to DefaultMaxWireVersion; MinWireVersion is 0
	// unless set.
	MaxWireVersion int32
	MinWireVersion int32
	// MaxBSONObjectSize, MaxMessageSizeBytes and MaxWriteBatchSize default
	// to MongoDB's values. MaxMessageSizeBytes also bounds what the fake
	// reads: a longer message closes the connection.
	MaxBSONObjectSize   int32
	MaxMessageSizeBytes int32
	MaxWriteBatchSize   int32
	// LogicalSessionTimeoutMinutes defaults to 30; a negative value leaves
	// the field out, which makes drivers disable sessions.
	LogicalSessionTimeoutMinutes int32

	// LoadBalanced makes hello answer a client that sent loadBalanced:
	// true with serviceId = ServiceID (a fresh ObjectID when zero), as a
	// mongos behind a load balancer does.
	LoadBalanced bool
	ServiceID    bson.ObjectID

	// Compressors are the compressors the server accepts ("snappy",
	// "zlib", "zstd", "noop"). hello answers the subset of the client's
	// list found here, in the client's order.
	Compressors []string

	// TopologyVersion adds topologyVersion to hello replies and turns on
	// awaitable hello: a hello carrying the current topologyVersion and
	// maxAwaitTimeMS is answered after maxAwaitTimeMS or when
	// BumpTopologyVersion is called, and streamed with moreToCome when
	// the client allowed exhaust.
	TopologyVersion bool

	// HelloExtra holds fields appended to every built-in hello reply
	// (saslSupportedMechs, a custom msg, ...).
	HelloExtra bson.D

	// InMemory enables the built-in insert / update / delete / find /
	// getMore / killCursors / drop engine and transaction bookkeeping (commitTransaction,
	// abortTransaction, Server.Transactions).
	InMemory bool

	// AnswerMoreToCome makes the server answer requests sent with
	// moreToCome, as FerretDB 1.24 does (a real server must not): the
	// reply is sent after AnswerMoreToComeAfter, before the connection's
	// next request is read, so a client that sent one meanwhile finds the
	// stray reply ahead of its own.
	AnswerMoreToCome      bool
	AnswerMoreToComeAfter time.Duration

	// Users turns on authentication (see auth.go): clients log in as one
	// of them with SCRAM-SHA-1, SCRAM-SHA-256 or MONGODB-X509, and other
	// commands than hello, ping and the like need a logged-in connection.
	Users []User
	// AuthLongForm makes SCRAM conversations end with the empty exchange
	// even when the client asks to skip it (as FerretDB and servers
	// before 4.4 do).
	AuthLongForm bool
	// NoSpeculativeAuth ignores speculativeAuthenticate in hello (as
	// FerretDB and servers before 4.4 do).
	NoSpeculativeAuth bool
	// TLSConfig, when set, makes the server speak TLS only (see tls.go).
	TLSConfig *tls.Config

	// Capacity, when set with a Service time, serves every command but
	// the handshake and authentication through a capacity model (see
	// capacity.go): Workers at a time, each for Service.
	Capacity *Capacity

	// Logger receives the server's diagnostics; nil discards them.
	Logger *slog.Logger
}

// Server is a running fake server. Its methods are safe for concurrent use.
type Server struct {
	opts     Options
	ln       net.Listener
	addr     string
	log      *slog.Logger
	store    *store    // nil unless Options.InMemory; shared by a replica set's members
	capacity *capacity // nil without Options.Capacity
	// member is the replica-set member this server is one life of (nil for
	// a lone server); it decides the hello state and refuses writes and
	// reads the member's state forbids.
	member    *Member
	helloTail []byte     // HelloExtra's elements, appended to hello replies
	users     *authUsers // nil without Options.Users
	processID bson.ObjectID
	serviceID bson.ObjectID

	// killed is closed by Kill; killOnce guards closing it.
	killed   chan struct{}
	killOnce sync.Once
	// wg counts the accept loop and connection goroutines.
	wg sync.WaitGroup

	mu sync.Mutex
	// conns are the open connections. Guarded by mu.
	conns map[*conn]struct{}

	// handlers maps command names to test handlers. Copy-on-write so
	// the request path reads it without locking; writers hold hmu.
	handlers atomic.Pointer[map[string]Handler]
	hmu      sync.Mutex

	fpMu sync.Mutex
	// fp is the failCommand fail point. Guarded by fpMu.
	fp FailPoint
	// fpArmed mirrors fp.Mode != FailOff so the request path skips fpMu
	// when no fail point is set.
	fpArmed atomic.Bool
	fpHits  atomic.Int64

	// topoCounter is topologyVersion.counter.
	topoCounter atomic.Int64

	cmdMu sync.RWMutex
	// cmdCounts counts requests per command name. Guarded by cmdMu; the
	// counters themselves are atomic and cached by each connection.
	cmdCounts map[string]*cmdCounter

	authAttempts atomic.Int64
	authFailures atomic.Int64

	nextConnID atomic.Int64
	accepted   atomic.Int64
	open       atomic.Int64
	maxOpen    atomic.Int64
}

type cmdCounter struct {
	name string
	n    atomic.Int64
}

// Start starts a fake server on 127.0.0.1 with a random port and closes it
// when the test ends. It fails the test if the server cannot listen.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	s, err := Listen("127.0.0.1:0", opts)
	if err != nil {
		t.Fatalf("fakemongo: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// Listen starts a fake server on addr (for tools; tests use Start). The
// caller must Close it.
func Listen(addr string, opts Options) (*Server, error) {
	return listen(addr, opts, nil, nil)
}

// listen starts a server; a replica-set member passes itself and the set's
// shared store.
func listen(addr string, opts Options, member *Member, shared *store) (*Server, error) {
	if opts.Kind < Standalone || opts.Kind > Mongos {
		return nil, fmt.Errorf("fakemongo: unknown Kind %d", opts.Kind)
	}
	for _, c := range opts.Compressors {
		if _, ok := wire.CompressorByName(c); !ok {
			return nil, fmt.Errorf("fakemongo: unknown compressor %q", c)
		}
	}
	var tail []byte
	if len(opts.HelloExtra) > 0 {
		doc, err := bson.Marshal(opts.HelloExtra)
		if err != nil {
			return nil, fmt.Errorf("fakemongo: HelloExtra: %w", err)
		}
		tail = doc[4 : len(doc)-1]
	}
	if opts.MaxWireVersion == 0 {
		opts.MaxWireVersion = DefaultMaxWireVersion
	}
	if opts.MaxBSONObjectSize == 0 {
		opts.MaxBSONObjectSize = DefaultMaxBSONObjectSize
	}
	if opts.MaxMessageSizeBytes == 0 {
		opts.MaxMessageSizeBytes = DefaultMaxMessageSizeBytes
	}
	if opts.MaxWriteBatchSize == 0 {
		opts.MaxWriteBatchSize = DefaultMaxWriteBatchSize
	}
	if opts.LogicalSessionTimeoutMinutes == 0 {
		opts.LogicalSessionTimeoutMinutes = DefaultLogicalSessionTimeoutMinutes
	}
	users, err := newAuthUsers(opts.Users)
	if err != nil {
		return nil, err
	}
	ln, err := listenTLS(addr, opts.TLSConfig)
	if err != nil {
		return nil, fmt.Errorf("fakemongo: listen: %w", err)
	}
	s := &Server{
		users:     users,
		opts:      opts,
		ln:        ln,
		addr:      ln.Addr().String(),
		log:       opts.Logger,
		helloTail: tail,
		processID: bson.NewObjectID(),
		serviceID: opts.ServiceID,
		killed:    make(chan struct{}),
		conns:     make(map[*conn]struct{}),
		cmdCounts: make(map[string]*cmdCounter),
		member:    member,
		capacity:  newCapacity(opts.Capacity),
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.serviceID.IsZero() {
		s.serviceID = bson.NewObjectID()
	}
	switch {
	case shared != nil:
		s.store = shared
	case opts.InMemory:
		s.store = newStore()
	}
	if opts.Kind == ReplicaSetMember {
		if len(s.opts.Hosts) == 0 {
			s.opts.Hosts = []string{s.addr}
		} else {
			s.opts.Hosts = slices.Clone(s.opts.Hosts)
		}
		if s.opts.Primary == "" && !s.opts.Secondary {
			s.opts.Primary = s.addr
		}
		if s.opts.SetName == "" {
			s.opts.SetName = "rs0"
		}
	}
	s.opts.Compressors = slices.Clone(opts.Compressors)
	empty := map[string]Handler{}
	s.handlers.Store(&empty)
	s.wg.Add(1)
	go s.acceptLoop()
	return s, nil
}

// Addr returns the host:port the server listens on.
func (s *Server) Addr() string { return s.addr }

// URI returns a connection string for the server with directConnection.
func (s *Server) URI() string { return "mongodb://" + s.addr + "/?directConnection=true" }

// ProcessID returns topologyVersion.processId, new for every server (and
// for every life of a replica-set member).
func (s *Server) ProcessID() bson.ObjectID { return s.processID }

// ServiceID returns the serviceId sent to load-balanced clients.
func (s *Server) ServiceID() bson.ObjectID { return s.serviceID }

// Handle registers h for the command name (exact match: "isMaster" and
// "hello" are different commands). A handler replaces the built-in command
// of that name, including hello; a nil h removes the handler and restores
// the built-in. Fail points are checked before handlers.
func (s *Server) Handle(cmd string, h Handler) {
	s.hmu.Lock()
	defer s.hmu.Unlock()
	old := *s.handlers.Load()
	m := make(map[string]Handler, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	if h == nil {
		delete(m, cmd)
	} else {
		m[cmd] = h
	}
	s.handlers.Store(&m)
}

// Builtin runs the built-in implementation of req's command, ignoring
// handlers and fail points, so a handler can wrap it (delay it, alter it,
// count it). Awaitable hello is answered at once. The returned documents
// may be shared with other replies: do not modify them in place.
func (s *Server) Builtin(req *Request) Reply {
	return s.builtin(req, nil)
}

// BumpTopologyVersion increments topologyVersion.counter and answers every
// pending awaitable hello at once, as a topology change does on a real
// server.
func (s *Server) BumpTopologyVersion() {
	s.topoCounter.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		c.wakeAwait()
	}
}

// Kill simulates the server dying: it stops accepting, closes every
// connection, aborts in-progress transactions, and returns without waiting
// (it is safe to call from a handler). Later dials are refused. Call Close
// to also wait for the server's goroutines.
func (s *Server) Kill() {
	s.killOnce.Do(func() {
		close(s.killed)
		if err := s.ln.Close(); err != nil {
			s.log.Debug("fakemongo: close listener", "err", err)
		}
		switch {
		case s.member != nil:
			// The store outlives this life of the member: only its
			// cursors die; the set aborts transactions if it was primary.
			s.store.dropCursorsOf(s)
			s.member.rs.lifeEnded(s)
		case s.store != nil:
			s.store.abortAll("killed")
		}
	})
	s.CloseAllConns()
}

// Close kills the server and waits until all its goroutines have exited.
// It is idempotent.
func (s *Server) Close() {
	s.Kill()
	s.wg.Wait()
}

// CloseAllConns closes every open connection without replying to whatever
// they are doing, while the server keeps accepting new ones: the upstream
// dropped its connections but is still up.
func (s *Server) CloseAllConns() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		c.close()
	}
}

// Killed reports whether Kill or Close has been called.
func (s *Server) Killed() bool {
	select {
	case <-s.killed:
		return true
	default:
		return false
	}
}

// Accepted returns the number of connections accepted so far.
func (s *Server) Accepted() int64 { return s.accepted.Load() }

// Open returns the number of connections currently open.
func (s *Server) Open() int64 { return s.open.Load() }

// MaxOpen returns the highest number of connections open at the same time.
func (s *Server) MaxOpen() int64 { return s.maxOpen.Load() }

// Requests returns how many requests named cmd (exact name) were received,
// whether they succeeded, failed or were dropped.
func (s *Server) Requests(cmd string) int64 {
	s.cmdMu.RLock()
	defer s.cmdMu.RUnlock()
	if c := s.cmdCounts[cmd]; c != nil {
		return c.n.Load()
	}
	return 0
}

// RequestCounts returns the request counts of every command name seen.
func (s *Server) RequestCounts() map[string]int64 {
	s.cmdMu.RLock()
	defer s.cmdMu.RUnlock()
	m := make(map[string]int64, len(s.cmdCounts))
	for k, c := range s.cmdCounts {
		if n := c.n.Load(); n > 0 {
			m[k] = n
		}
	}
	return m
}

// ResetCounters zeroes the request counts and sets MaxOpen to the number of
// connections open now; Accepted and FailPointHits keep counting.
func (s *Server) ResetCounters() {
	s.cmdMu.RLock()
	for _, c := range s.cmdCounts {
		c.n.Store(0)
	}
	s.cmdMu.RUnlock()
	s.maxOpen.Store(s.open.Load())
}

// counter returns the shared counter of a command name, creating it. The
// name is only copied into a string when it is new.
func (s *Server) counter(name []byte) *cmdCounter {
	s.cmdMu.RLock()
	c := s.cmdCounts[string(name)]
	s.cmdMu.RUnlock()
	if c != nil {
		return c
	}
	s.cmdMu.Lock()
	defer s.cmdMu.Unlock()
	if c = s.cmdCounts[string(name)]; c == nil {
		c = &cmdCounter{name: string(name)}
		s.cmdCounts[c.name] = c
	}
	return c
}

// ConnInfo describes an open connection.
type ConnInfo struct {
	// ID is the connectionId sent in hello (Request.ConnID).
	ID int64
	// AppName is the client.application.name of the connection's hello.
	AppName string
	// Compressors are the compressors agreed in hello.
	Compressors []string
	// Remote is the client's address.
	Remote string
}

// Conns describes the open connections, sorted by ID.
func (s *Server) Conns() []ConnInfo {
	s.mu.Lock()
	out := make([]ConnInfo, 0, len(s.conns))
	for c := range s.conns {
		out = append(out, c.info())
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b ConnInfo) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

func (s *Server) acceptLoop() {
	defer s.wg.Done()
	var backoff time.Duration
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			if s.Killed() || errors.Is(err, net.ErrClosed) {
				return
			}
			// Temporary failure (e.g. EMFILE under a load test): back off a
			// little instead of spinning, but keep serving.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Warn("fakemongo: accept", "err", err, "backoff", backoff)
			select {
			case <-time.After(backoff):
			case <-s.killed:
				return
			}
			continue
		}
		backoff = 0
		c := newConn(s, nc)
		s.mu.Lock()
		if s.Killed() {
			s.mu.Unlock()
			_ = nc.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		s.accepted.Add(1)
		n := s.open.Add(1)
		for {
			m := s.maxOpen.Load()
			if n <= m || s.maxOpen.CompareAndSwap(m, n) {
				break
			}
		}
		go c.serve()
	}
}

// removeConn forgets a finished connection.
func (s *Server) removeConn(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.open.Add(-1)
}

// okDoc is {ok: 1}, shared read-only by every reply that needs nothing more.
var okDoc = func() bsoncore.Document {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendDoubleElement(d, "ok", 1)
	return endDoc(d, idx)
}()

// okDocs is the Docs slice of okReply; read-only.
var okDocs = []bsoncore.Document{okDoc}

// okReply answers {ok: 1} without allocating.
func okReply() Reply { return Reply{Docs: okDocs} }
