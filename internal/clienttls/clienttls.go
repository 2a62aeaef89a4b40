// Package clienttls terminates TLS for clients: the settings offered
// (tls_mode and its certificate), a new client's first bytes telling TLS
// from plain (gate.SniffTLS), its handshake under a deadline with those
// bytes replayed, and the count of clients refused at this step. It knows
// sockets and nothing of the proxy: answering a refused plain client is its
// caller's (it speaks MongoDB), as is deciding which clients come here.
package clienttls

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/gate"
)

// DefaultHandshakeTimeout is Settings.HandshakeTimeout's default.
const DefaultHandshakeTimeout = 10 * time.Second

// Settings is the TLS offered to clients. The zero value disables it.
type Settings struct {
	// Mode says which clients use TLS (tls_mode); "" is disable.
	Mode config.TLSMode
	// Config is the server configuration of the handshake (certificate,
	// client CAs); required when Mode serves TLS.
	Config *tls.Config
	// HandshakeTimeout bounds both the wait for a new client's first
	// bytes and its handshake; 0 means DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
}

// ErrConfig is returned by Terminator.Set for a mode that serves TLS
// without a tls.Config, or a mode config does not define.
var ErrConfig = errors.New("mongobouncer: client TLS mode without a TLS configuration")

// Observer is implemented by an observer that counts client TLS refusals;
// reason is "plain" or "handshake".
type Observer interface {
	ClientTLSRefused(reason string)
}

// Terminator holds the client TLS in force and counts the clients refused
// at their TLS step. The zero value serves no TLS; it is safe for
// concurrent use.
type Terminator struct {
	// cur is the settings in force (Set); each new client reads them once.
	cur atomic.Pointer[Settings]
	// plainRefused and handshakeFailed count Refusals.
	plainRefused    atomic.Uint64
	handshakeFailed atomic.Uint64
}

// Set checks and installs s (configuration reload): new clients use it,
// connected ones keep what they negotiated.
func (t *Terminator) Set(s Settings) error {
	if !s.Mode.Valid() {
		return fmt.Errorf("%w: tls mode %q: must be disable, allow or require", ErrConfig, s.Mode)
	}
	if s.Mode.Serves() && s.Config == nil {
		return ErrConfig
	}
	if s.HandshakeTimeout <= 0 {
		s.HandshakeTimeout = DefaultHandshakeTimeout
	}
	t.cur.Store(&s)
	return nil
}

// Refusals returns how many clients were refused because they spoke plain
// while TLS was required, and how many failed their TLS handshake (no or a
// bad client certificate, a protocol error, the timeout).
func (t *Terminator) Refusals() (plain, handshake uint64) {
	return t.plainRefused.Load(), t.handshakeFailed.Load()
}

// Step names where a client failed: before its first bytes told TLS from
// plain, or in its handshake.
type Step int

const (
	// StepFirstBytes is the wait for the client's first bytes.
	StepFirstBytes Step = iota
	// StepHandshake is the TLS handshake.
	StepHandshake
)

// Error ends a client that failed at its TLS step. The failure was logged
// (at debug) and counted already, except a login timeout, which is the
// caller's to report.
type Error struct {
	// Step is where the client failed.
	Step Step
	// LoginTimeout is set when the deadline that expired was the caller's
	// login deadline (Accept's), not the handshake timeout.
	LoginTimeout bool
	// Err is the read's or the handshake's error.
	Err error
}

func (e *Error) Error() string { return fmt.Sprintf("client TLS: %v", e.Err) }

func (e *Error) Unwrap() error { return e.Err }

// Result is what Accept made of a new client.
type Result struct {
	// Conn is the client's TLS connection, nil for a plain client.
	Conn *Conn
	// N is how many bytes of a plain client Accept read into its buffer
	// (the start of its first request); 0 for a TLS client, whose bytes
	// went into the handshake.
	N int
	// RefusePlain is set for a plain client while TLS is required: the
	// caller answers it with an error and closes it.
	RefusePlain bool
}

// Accept runs on a new client's own goroutine, before its first request,
// never on an accept loop: it blocks until the client's first bytes tell
// TLS from plain, and through the handshake, under the handshake timeout or
// loginDeadline if that comes first (zero means none). With TLS off, or
// for a unix socket client (as mongod: a local channel that the file
// system's permissions protect, and drivers do not speak TLS on it), it
// does nothing. A plain client's first bytes stay in buf for its first
// request; a TLS client's are replayed into its handshake. obs may be nil;
// log hears the failures at debug.
func (t *Terminator) Accept(nc net.Conn, buf []byte, loginDeadline time.Time, obs Observer, log *slog.Logger) (Result, error) {
	ts := t.cur.Load()
	if ts == nil || !ts.Mode.Serves() {
		return Result{}, nil
	}
	if _, local := nc.(*net.UnixConn); local {
		return Result{}, nil
	}
	deadline, byLogin := time.Now().Add(ts.HandshakeTimeout), false
	if !loginDeadline.IsZero() && loginDeadline.Before(deadline) {
		deadline, byLogin = loginDeadline, true
	}
	_ = nc.SetDeadline(deadline)
	n, isTLS, err := gate.SniffTLS(nc, buf)
	if err != nil {
		// Connected and said nothing in time, or left: port scanners
		// and TCP health checks.
		timedOut := byLogin && isTimeout(err)
		if !timedOut {
			log.Debug("client sent nothing before tls_handshake_timeout or closed", "error", err)
		}
		return Result{N: n}, &Error{Step: StepFirstBytes, LoginTimeout: timedOut, Err: err}
	}
	if !isTLS {
		_ = nc.SetDeadline(time.Time{})
		if ts.Mode == config.TLSModeAllow {
			return Result{N: n}, nil
		}
		t.plainRefused.Add(1)
		if obs != nil {
			obs.ClientTLSRefused("plain")
		}
		log.Debug("plain client refused: tls_mode = require")
		return Result{N: n, RefusePlain: true}, nil
	}
	pre := append([]byte(nil), buf[:n]...)
	tc := tls.Server(&replayConn{Conn: nc, pre: pre}, ts.Config)
	if err := tc.Handshake(); err != nil {
		t.handshakeFailed.Add(1)
		if obs != nil {
			obs.ClientTLSRefused("handshake")
		}
		timedOut := byLogin && isTimeout(err)
		if !timedOut {
			log.Debug("client TLS handshake failed", "error", err)
		}
		return Result{}, &Error{Step: StepHandshake, LoginTimeout: timedOut, Err: err}
	}
	_ = nc.SetDeadline(time.Time{})
	return Result{Conn: &Conn{Conn: tc, raw: nc}}, nil
}

// isTimeout reports whether err is a deadline's.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
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

// Conn is a client's TLS connection. Close closes the socket without
// sending close_notify: tls.Conn.Close may block up to 5 s writing it to a
// client that does not read, and a proxy closes clients under their locks
// and at shutdown for every client in turn. Drivers do not need the alert;
// they see the connection end either way.
type Conn struct {
	*tls.Conn
	raw net.Conn
}

// Close closes the socket under the TLS connection.
func (c *Conn) Close() error { return c.raw.Close() }

// Raw returns the socket under the TLS connection.
func (c *Conn) Raw() net.Conn { return c.raw }
