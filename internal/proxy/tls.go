package proxy

// TLS for clients: telling a TLS client from a plain one by its first
// bytes (gate.SniffTLS), the handshake on the client's own goroutine (never on the accept
// loop, always under a deadline), and the refusal of plain clients when TLS
// is required. A TLS client stays on its goroutine for its whole life: the
// event loop reads raw sockets and cannot decrypt (loopClient.enter).

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/evloop"
	"github.com/mongobouncer/mongobouncer/internal/gate"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// TLSMode says whether clients connect with TLS: config's type (tls_mode),
// taken as it is. The zero value "" is disable.
type TLSMode = config.TLSMode

// Client TLS modes, config's.
const (
	// TLSDisable serves plain clients only.
	TLSDisable = config.TLSModeDisable
	// TLSAllow serves TLS and plain clients on the same listeners.
	TLSAllow = config.TLSModeAllow
	// TLSRequire refuses plain clients.
	TLSRequire = config.TLSModeRequire
)

// DefaultTLSHandshakeTimeout is ClientTLS.HandshakeTimeout's default.
const DefaultTLSHandshakeTimeout = 10 * time.Second

// ClientTLS is the TLS offered to clients. The zero value disables it.
type ClientTLS struct {
	// Mode says which clients use TLS.
	Mode TLSMode
	// Config is the server configuration of the handshake (certificate,
	// client CAs); required when Mode serves TLS.
	Config *tls.Config
	// HandshakeTimeout bounds both the wait for a new client's first
	// bytes and its handshake; 0 means DefaultTLSHandshakeTimeout.
	HandshakeTimeout time.Duration
}

// ErrTLSConfig is returned by New and SetTLS for a mode that serves TLS
// without a tls.Config, or a mode config does not define.
var ErrTLSConfig = errors.New("mongobouncer: client TLS mode without a TLS configuration")

// SetTLS changes the client TLS settings (configuration reload): new
// clients use them, connected ones keep theirs.
func (s *Server) SetTLS(t ClientTLS) error {
	if !t.Mode.Valid() {
		return fmt.Errorf("%w: tls mode %q: must be disable, allow or require", ErrTLSConfig, t.Mode)
	}
	if t.Mode.Serves() && t.Config == nil {
		return ErrTLSConfig
	}
	if t.HandshakeTimeout <= 0 {
		t.HandshakeTimeout = DefaultTLSHandshakeTimeout
	}
	s.tls.Store(&t)
	return nil
}

// TLSRefusals returns how many clients were refused because they spoke
// plain while TLS was required, and how many failed their TLS handshake
// (no or a bad client certificate, a protocol error, the timeout).
func (s *Server) TLSRefusals() (plain, handshake uint64) {
	return s.tlsPlainRefused.Load(), s.tlsHandshakeFailed.Load()
}

// TLSObserver is implemented by an Observer that counts client TLS
// refusals; reason is "plain" or "handshake".
type TLSObserver interface {
	ClientTLSRefused(reason string)
}

// errTLSRefused ends a client refused at its TLS step. It wraps
// errClientGone: the refusal was logged already.
var errTLSRefused = fmt.Errorf("TLS refused: %w", errClientGone)

// maxRefusedRequest bounds what is read of a refused plain client's first
// request (a hello, well under this), so that the close that follows the
// error reply does not reset the connection before the client reads it.
const maxRefusedRequest = 64 * 1024

// startTLS runs on the client's goroutine before its first request: cn is
// the client's connection, ep its endpoint (the read window, and Mu, which
// guards cn.nc), connected when it connected, log its log. With TLS off,
// or for a unix socket client, it does nothing. Otherwise it reads the
// client's first bytes into the read window, under the handshake timeout:
// a plain client keeps them there for its first request (allow) or is
// refused (require); a TLS client's bytes are replayed into the
// handshake, and cn.nc becomes the TLS connection.
func (cn *conn) startTLS(s *Server, ep *evloop.Endpoint, connected time.Time, log *slog.Logger) error {
	ts := s.tls.Load()
	if ts == nil || !ts.Mode.Serves() {
		return nil
	}
	if _, local := cn.nc.(*net.UnixConn); local {
		// As mongod: a unix socket is a local channel that the file
		// system's permissions protect, and drivers do not speak TLS on it.
		return nil
	}
	// The handshake counts towards client_login_timeout: a client must send
	// its first message within it of connecting.
	deadline, byLogin := time.Now().Add(ts.HandshakeTimeout), false
	login := time.Duration(s.loginTimeout.Load())
	if ld := connected.Add(login); login > 0 && ld.Before(deadline) {
		deadline, byLogin = ld, true
	}
	_ = cn.nc.SetDeadline(deadline)
	n, isTLS, err := gate.SniffTLS(cn.nc, ep.Win.Free())
	ep.Win.Hi += n
	if err != nil {
		// Connected and said nothing in time, or left: port scanners
		// and TCP health checks.
		if byLogin && isTimeout(err) {
			s.loginTimedOut(log, gate.TimeoutFirstMessage, time.Since(connected), login)
			return errTLSRefused
		}
		log.Debug("client sent nothing before tls_handshake_timeout or closed", "error", err)
		return errTLSRefused
	}
	if !isTLS {
		_ = cn.nc.SetDeadline(time.Time{})
		if ts.Mode == TLSAllow {
			return nil
		}
		s.tlsPlainRefused.Add(1)
		if o, ok := s.opts.Observer.(TLSObserver); ok {
			o.ClientTLSRefused("plain")
		}
		log.Debug("plain client refused: tls_mode = require")
		cn.refusePlain(&ep.Win, `mongobouncer requires TLS (tls_mode = "require"): connect with tls=true`)
		return errTLSRefused
	}
	raw := cn.nc
	pre := append([]byte(nil), ep.Win.Pending()...)
	ep.Win.Reset()
	tc := tls.Server(&replayConn{Conn: raw, pre: pre}, ts.Config)
	if err := tc.Handshake(); err != nil {
		s.tlsHandshakeFailed.Add(1)
		if o, ok := s.opts.Observer.(TLSObserver); ok {
			o.ClientTLSRefused("handshake")
		}
		if byLogin && isTimeout(err) {
			s.loginTimedOut(log, gate.TimeoutTLSHandshake, time.Since(connected), login)
			return errTLSRefused
		}
		log.Debug("client TLS handshake failed", "error", err)
		return errTLSRefused
	}
	_ = raw.SetDeadline(time.Time{})
	cn.setTLS(&ep.Mu, tc, raw)
	return nil
}

// setTLS makes the connection tc, over raw, under mu (the endpoint's):
// disconnect reads cn.nc under it.
func (cn *conn) setTLS(mu *sync.Mutex, tc *tls.Conn, raw net.Conn) {
	mu.Lock()
	defer mu.Unlock()
	cn.nc = &tlsClientConn{Conn: tc, raw: raw}
	cn.tlsConn = tc
}

// refusePlain answers a plain client's first request, whose first bytes
// are in the read window win, with an error that says TLS is required,
// then the caller closes it.
func (cn *conn) refusePlain(win *evloop.Window, reason string) {
	_ = cn.nc.SetDeadline(time.Now().Add(2 * time.Second))
	for win.Hi < wire.HeaderLen {
		n, err := cn.nc.Read(win.Buf[win.Hi:])
		win.Hi += n
		if err != nil && win.Hi < wire.HeaderLen {
			return
		}
	}
	h, err := wire.ParseHeader(win.Buf[:wire.HeaderLen])
	if err != nil {
		return
	}
	if rest := int(h.MessageLength) - win.Hi; rest > 0 && rest <= maxRefusedRequest {
		_, _ = io.CopyN(io.Discard, cn.nc, int64(rest))
	}
	win.Lo, win.Hi = 0, 0
	cn.writeFailure(h.RequestID, h.OpCode, command.ErrorReply(6, "HostUnreachable", reason))
}

// replayConn gives back the bytes read to tell TLS from plain before
// reading on.
type replayConn struct {
	net.Conn
	pre []byte
}

func (r *replayConn) Read(b []byte) (int, error) {
	if len(r.pre) > 0 {
		n := copy(b, r.pre)
		r.pre = r.pre[n:]
		return n, nil
	}
	return r.Conn.Read(b)
}

// tlsClientConn is a client's TLS connection. Close closes the socket
// without sending close_notify: tls.Conn.Close may block up to 5 s writing
// it to a client that does not read, and Close runs under the client's
// ownMu (disconnect) and at shutdown for every client in turn. Drivers do
// not need the alert; they see the connection end either way.
type tlsClientConn struct {
	*tls.Conn
	raw net.Conn
}

func (t *tlsClientConn) Close() error { return t.raw.Close() }
