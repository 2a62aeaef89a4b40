// Package upstream dials and handshakes mongobouncer's connections to the
// MongoDB servers behind it.
//
// A Dialer implements pool.Connector: Connect dials (TCP, Unix socket or TLS),
// sends the OP_MSG hello with mongobouncer's client metadata and compression
// offer, checks and records the reply, negotiates a compressor and runs the
// optional Authenticator. The resulting *Conn frames, compresses and bounds
// every message it reads or writes.
//
// Errors are typed so callers can branch: *ConnectError for a failed
// establishment, *NetworkError (IsNetworkError) when the connection itself
// failed and must be dropped, *CommandError when the server answered ok:0.
package upstream

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// Defaults for zero Options fields.
const (
	DefaultAppName        = "mongobouncer"
	DefaultConnectTimeout = 10 * time.Second
	// DefaultPort is used for a TCP address given without a port.
	DefaultPort = "27017"
)

// minOpMsgWireVersion is the first wire version with OP_MSG (MongoDB 3.6).
const minOpMsgWireVersion = 6

// Options configure a Dialer. The zero value dials plain TCP with no
// compression and no authentication.
type Options struct {
	// AppName is sent as the client metadata's application.name (truncated
	// to the spec's 128 bytes). Default "mongobouncer".
	AppName string
	// ConnectTimeout bounds the whole establishment: dial, TLS, hello and
	// authentication. Default 10s.
	ConnectTimeout time.Duration
	// Compressors are offered in hello in this order of preference, e.g.
	// ["zstd", "snappy", "zlib"]; the server picks. Names the wire package
	// does not implement are dropped (and logged).
	Compressors []string
	// LoadBalanced sends loadBalanced:true and requires a serviceId in the
	// reply.
	LoadBalanced bool
	// TLSConfig, when set, wraps TCP connections with tls.Client. When its
	// ServerName is empty the host of the address is used.
	TLSConfig *tls.Config
	// Authenticator, when set, runs after hello on every new connection
	// (not on an arbiter's, which cannot authenticate). A
	// HandshakeAuthenticator also adds to that connection's hello.
	// Monitoring dialers must not have one (the auth spec).
	Authenticator Authenticator
	// MaxMessageSize bounds the replies read before hello has told us the
	// server's maxMessageSizeBytes (which bounds them afterwards). Default
	// wire.DefaultMaxMessageSize.
	MaxMessageSize int
	// Detach takes established plain (no TLS, no compression) TCP and
	// Unix connections out of Go's netpoller, for an event loop that polls
	// their sockets itself (Linux; elsewhere it does nothing). Blocking
	// reads and writes still work, each waiting in poll(2) on its own
	// thread.
	Detach bool
	// Dial replaces net.Dialer.DialContext, for tests.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Logger receives debug logs of established connections. Default
	// slog.Default().
	Logger *slog.Logger
}

// String summarises o without what may be secret: the Authenticator
// prints as its own String (no password), TLSConfig only as whether there
// is one (its certificates hold private keys), and functions not at all.
// GoString and LogValue print the same.
func (o Options) String() string {
	return fmt.Sprintf("upstream.Options{AppName:%q ConnectTimeout:%v Compressors:%v LoadBalanced:%v TLS:%v Authenticator:%v MaxMessageSize:%d Detach:%v}",
		o.AppName, o.ConnectTimeout, o.Compressors, o.LoadBalanced, o.TLSConfig != nil, o.Authenticator, o.MaxMessageSize, o.Detach)
}

// GoString is String, for %#v.
func (o Options) GoString() string { return o.String() }

// LogValue is String, for slog.
func (o Options) LogValue() slog.Value { return slog.StringValue(o.String()) }

// Authenticator authenticates a new connection after its hello. It is the
// seam for SCRAM and other mechanisms. ctx carries the connect deadline; c
// is ready for RoundTrip.
type Authenticator interface {
	Authenticate(ctx context.Context, c *Conn, hello *Hello) error
}

// Dialer establishes upstream connections. It is safe for concurrent use.
type Dialer struct {
	opts  Options
	hello bsoncore.Document // immutable after NewDialer
	// offered are the compressors we offered, for checking the server's pick.
	offered map[string]wire.CompressorID
}

// String is the options', without secrets (fmt would print the
// unexported options field by field, the password with them).
func (d *Dialer) String() string { return "upstream.Dialer " + d.opts.String() }

// GoString is String, for %#v.
func (d *Dialer) GoString() string { return d.String() }

// LogValue is String, for slog.
func (d *Dialer) LogValue() slog.Value { return slog.StringValue(d.String()) }

var (
	_ pool.Connector = (*Dialer)(nil)
	_ pool.Upstream  = (*Conn)(nil)
)

// NewDialer returns a Dialer for o, with defaults applied.
func NewDialer(o Options) *Dialer {
	if o.AppName == "" {
		o.AppName = DefaultAppName
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = DefaultConnectTimeout
	}
	if o.MaxMessageSize <= 0 {
		o.MaxMessageSize = wire.DefaultMaxMessageSize
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Dial == nil {
		d := &net.Dialer{KeepAlive: 30 * time.Second}
		o.Dial = d.DialContext
	}
	d := &Dialer{offered: make(map[string]wire.CompressorID)}
	var names []string
	for _, name := range o.Compressors {
		id, ok := wire.CompressorByName(name)
		if !ok {
			o.Logger.Warn("upstream: ignoring unsupported compressor", "compressor", name)
			continue
		}
		if _, dup := d.offered[name]; dup {
			continue
		}
		d.offered[name] = id
		names = append(names, name)
	}
	o.Compressors = names
	d.opts = o
	d.hello = buildHello(&o)
	return d
}

// WithAuthenticator returns a Dialer that makes the same connections as d
// but logs each one in with a (SCRAM pass-through: one user's pool).
func (d *Dialer) WithAuthenticator(a Authenticator) *Dialer {
	c := *d // hello and offered are never modified after NewDialer
	c.opts.Authenticator = a
	return &c
}

// Connect establishes a connection to address and returns it as a *Conn. It
// implements pool.Connector.
func (d *Dialer) Connect(ctx context.Context, address string, id int64) (pool.Upstream, error) {
	c, err := d.Dial(ctx, address, id)
	if err != nil {
		return nil, err // a nil interface, not a nil *Conn
	}
	return c, nil
}

// Dial is Connect returning the concrete type. address is "host:port",
// "host" (port 27017), or a Unix socket path (see ParseAddress). Cancelling
// ctx, or ConnectTimeout elapsing, interrupts the dial or handshake at once.
// Errors are *ConnectError.
func (d *Dialer) Dial(ctx context.Context, address string, id int64) (*Conn, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, d.opts.ConnectTimeout)
	defer cancel()

	network, addr := ParseAddress(address)
	nc, err := d.opts.Dial(ctx, network, addr)
	if err != nil {
		return nil, connectError(address, "dial", ctxError(ctx, err), &NetworkError{Addr: address, Op: "dial", Err: err})
	}
	// From here on ctx's end closes the connection, which interrupts
	// whatever I/O the handshake is blocked in.
	raw := nc
	stop := context.AfterFunc(ctx, func() { raw.Close() })
	fail := func(stage string, err error) (*Conn, error) {
		stop()
		raw.Close()
		return nil, connectError(address, stage, ctxError(ctx, err), err)
	}

	if d.opts.TLSConfig != nil && network == "tcp" {
		cfg := d.opts.TLSConfig
		if cfg.ServerName == "" {
			cfg = cfg.Clone()
			cfg.ServerName, _, _ = net.SplitHostPort(addr)
			if verify := cfg.VerifyConnection; verify != nil {
				// crypto/tls leaves ConnectionState.ServerName empty
				// for an IP address (it sends no SNI for one), and a
				// VerifyConnection that checks the name needs it.
				name := cfg.ServerName
				cfg.VerifyConnection = func(st tls.ConnectionState) error {
					if st.ServerName == "" {
						st.ServerName = name
					}
					return verify(st)
				}
			}
		}
		tc := tls.Client(nc, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			return fail("tls", &NetworkError{Addr: address, Op: "tls", Err: err})
		}
		nc = tc
	}

	hello, auth := d.hello, d.opts.Authenticator
	if ha, ok := auth.(HandshakeAuthenticator); ok {
		elems, finish, err := ha.StartHandshake()
		if err != nil {
			return fail("auth", err)
		}
		hello, auth = withElems(d.hello, elems), finish
	}
	c := newConn(nc, raw, address, id, d.opts.MaxMessageSize)
	reply, err := c.RoundTrip(ctx, "admin", hello)
	if err != nil {
		return fail("hello", err)
	}
	h, err := ParseHello(reply)
	if err != nil {
		return fail("hello", &NetworkError{Addr: address, Op: "read", Err: fmt.Errorf("%w: %w", ErrBadReply, err)})
	}
	if h.MaxWireVersion < minOpMsgWireVersion {
		return fail("hello", fmt.Errorf("%w: server reports %d", ErrWireVersion, h.MaxWireVersion))
	}
	if d.opts.LoadBalanced && !h.HasServiceID {
		return fail("hello", ErrNoServiceID)
	}
	c.hello = h
	if h.MaxMessageSizeBytes >= wire.HeaderLen {
		c.maxMsg = int(h.MaxMessageSizeBytes)
	}
	// The OP_COMPRESSED spec: "clients MUST use the first compressor in the
	// client's configured compressors list that is also in the servers
	// list" — our order, not the order of the server's reply.
	for _, name := range d.opts.Compressors {
		if slices.Contains(h.Compression, name) {
			c.compressor, c.compress = d.offered[name], true
			break
		}
	}

	if auth != nil && !h.ArbiterOnly {
		if err := auth.Authenticate(ctx, c, h); err != nil {
			return fail("auth", err)
		}
	}

	if !stop() {
		// ctx ended as we finished and the connection is (being) closed.
		return fail("hello", context.Cause(ctx))
	}
	if err := nc.SetDeadline(time.Time{}); err != nil {
		return fail("hello", &NetworkError{Addr: address, Op: "write", Err: err})
	}
	// A compressed connection is never the loop's (it relays whole
	// messages uncompressed), so it stays in the netpoller, where its
	// blocking reads cost no thread each.
	if d.opts.Detach && nc == raw && !c.compress && c.br.Buffered() == 0 {
		if dc, ok := detach(raw); ok {
			c.nc, c.raw = dc, dc
			c.br.Reset(dc)
		}
	}
	if d.opts.Logger.Enabled(ctx, slog.LevelDebug) {
		d.opts.Logger.Debug("upstream: connected", "address", address, "id", id,
			"maxWireVersion", h.MaxWireVersion, "compressor", compressorName(c),
			"serviceId", serviceIDString(c), "duration", time.Since(start))
	}
	return c, nil
}

// ParseAddress returns the network and address to dial for a server address.
// An absolute path, a name ending in ".sock", or a URI-escaped path
// ("%2Ftmp%2Fmongodb-27017.sock", as in connection strings) is a Unix socket;
// anything else is TCP "host:port", with port 27017 added when missing.
func ParseAddress(addr string) (network, address string) {
	if len(addr) >= 3 && strings.EqualFold(addr[:3], "%2F") {
		if p, err := url.PathUnescape(addr); err == nil {
			return "unix", p
		}
	}
	if strings.HasPrefix(addr, "/") || strings.HasSuffix(addr, ".sock") {
		return "unix", addr
	}
	if _, _, err := net.SplitHostPort(addr); err == nil {
		return "tcp", addr
	}
	return "tcp", net.JoinHostPort(strings.TrimSuffix(strings.TrimPrefix(addr, "["), "]"), DefaultPort)
}

func compressorName(c *Conn) string {
	if !c.compress {
		return "none"
	}
	return c.compressor.String()
}

func serviceIDString(c *Conn) string {
	if id, ok := c.ServiceID(); ok {
		return id.Hex()
	}
	return ""
}
