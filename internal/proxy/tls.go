package proxy

// TLS for clients: telling a TLS client from a plain one by its first
// bytes, the handshake on the client's own goroutine (never on the accept
// loop, always under a deadline), and the refusal of plain clients when TLS
// is required. A TLS client stays on its goroutine for its whole life: the
// event loop reads raw sockets and cannot decrypt (loopClient.enter).

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/evloop"
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

// tlsRecordHandshake is the first byte of a TLS handshake record.
const tlsRecordHandshake = 0x16

// maxRefusedRequest bounds what is read of a refused plain client's first
// request (a hello, well under this), so that the close that follows the
// error reply does not reset the connection before the client reads it.
const maxRefusedRequest = 64 * 1024

// startTLS runs on the client's goroutine before its first request. With
// TLS off, or for a unix socket client, it does nothing. Otherwise it reads the client's first bytes
// into the read window, under the handshake timeout: a plain client keeps them there
// for its first request (allow) or is refused (require); a TLS client's
// bytes are replayed into the handshake, and c.nc becomes the TLS
// connection.
func (c *client) startTLS() error {
	ts := c.s.tls.Load()
	if ts == nil || !ts.Mode.Serves() {
		return nil
	}
	if _, local := c.nc.(*net.UnixConn); local {
		// As mongod: a unix socket is a local channel that the file
		// system's permissions protect, and drivers do not speak TLS on it.
		return nil
	}
	// The handshake counts towards client_login_timeout: a client must send
	// its first message within it of connecting.
	deadline, byLogin := time.Now().Add(ts.HandshakeTimeout), false
	login := time.Duration(c.s.loginTimeout.Load())
	if ld := c.connected.Add(login); login > 0 && ld.Before(deadline) {
		deadline, byLogin = ld, true
	}
	_ = c.nc.SetDeadline(deadline)
	isTLS, err := sniffTLS(c.nc, &c.lc.Win)
	if err != nil {
		// Connected and said nothing in time, or left: port scanners
		// and TCP health checks.
		if byLogin && isTimeout(err) {
			c.loginTimedOut(LoginTimeoutFirstMessage, time.Since(c.connected), login)
			return errTLSRefused
		}
		c.log.Debug("client sent nothing before tls_handshake_timeout or closed", "error", err)
		return errTLSRefused
	}
	if !isTLS {
		_ = c.nc.SetDeadline(time.Time{})
		if ts.Mode == TLSAllow {
			return nil
		}
		c.s.tlsPlainRefused.Add(1)
		if o, ok := c.s.opts.Observer.(TLSObserver); ok {
			o.ClientTLSRefused("plain")
		}
		c.log.Debug("plain client refused: tls_mode = require")
		c.refusePlain(`mongobouncer requires TLS (tls_mode = "require"): connect with tls=true`)
		return errTLSRefused
	}
	raw := c.nc
	pre := append([]byte(nil), c.lc.Win.Pending()...)
	c.lc.Win.Reset()
	tc := tls.Server(&replayConn{Conn: raw, pre: pre}, ts.Config)
	if err := tc.Handshake(); err != nil {
		c.s.tlsHandshakeFailed.Add(1)
		if o, ok := c.s.opts.Observer.(TLSObserver); ok {
			o.ClientTLSRefused("handshake")
		}
		if byLogin && isTimeout(err) {
			c.loginTimedOut(LoginTimeoutTLSHandshake, time.Since(c.connected), login)
			return errTLSRefused
		}
		c.log.Debug("client TLS handshake failed", "error", err)
		return errTLSRefused
	}
	_ = raw.SetDeadline(time.Time{})
	c.setTLSConn(tc, raw)
	return nil
}

// setTLSConn makes the client's connection tc, over raw, under ownMu:
// disconnect reads c.nc under it.
func (c *client) setTLSConn(tc *tls.Conn, raw net.Conn) {
	c.lc.Mu.Lock()
	defer c.lc.Mu.Unlock()
	c.nc = &tlsClientConn{Conn: tc, raw: raw}
	c.tlsConn = tc
}

// sniffTLS reads a new client's first bytes from nc into the read window
// win until they tell a
// TLS handshake record from a MongoDB message. The first byte alone does
// not: 0x16 is also the low byte of a message length (a 278-byte hello
// starts with it). A TLS record continues with the version 3.1 to 3.4 (TLS
// 1.0 to 1.3 spell the record version 0x0301 to 0x0303), which for a
// message would mean a first request of at least 66,326 bytes; a driver's
// first request is a hello of a few hundred.
func sniffTLS(nc net.Conn, win *evloop.Window) (bool, error) {
	for {
		if isTLS, decided := tlsRecordStart(win.Pending()); decided {
			return isTLS, nil
		}
		n, err := nc.Read(win.Free())
		win.Hi += n
		if _, decided := tlsRecordStart(win.Pending()); err != nil && !decided {
			return false, err
		}
	}
}

// tlsRecordStart tells from a connection's first bytes whether they start
// a TLS handshake record (see sniffTLS), and whether b is enough to tell.
func tlsRecordStart(b []byte) (isTLS, decided bool) {
	switch {
	case len(b) > 0 && b[0] != tlsRecordHandshake:
		return false, true
	case len(b) >= 3:
		return b[1] == 3 && b[2] >= 1 && b[2] <= 4, true
	}
	return false, false
}

// refusePlain answers a plain client's first request with an error that
// says TLS is required, then the caller closes it. Its first bytes are in
// the read window.
func (c *client) refusePlain(reason string) {
	_ = c.nc.SetDeadline(time.Now().Add(2 * time.Second))
	for c.lc.Win.Hi < wire.HeaderLen {
		n, err := c.nc.Read(c.lc.Win.Buf[c.lc.Win.Hi:])
		c.lc.Win.Hi += n
		if err != nil && c.lc.Win.Hi < wire.HeaderLen {
			return
		}
	}
	h, err := wire.ParseHeader(c.lc.Win.Buf[:wire.HeaderLen])
	if err != nil {
		return
	}
	if rest := int(h.MessageLength) - c.lc.Win.Hi; rest > 0 && rest <= maxRefusedRequest {
		_, _ = io.CopyN(io.Discard, c.nc, int64(rest))
	}
	c.lc.Win.Lo, c.lc.Win.Hi = 0, 0
	c.writeFailure(h.RequestID, h.OpCode, command.ErrorReply(6, "HostUnreachable", reason))
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
