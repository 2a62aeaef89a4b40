package proxy

// TLS for clients, the proxy's side: a new client goes through clienttls
// on its own goroutine (never on the accept loop), and a plain client
// refused because TLS is required gets a MongoDB error reply here. A TLS
// client stays on its goroutine for its whole life: the event loop reads
// raw sockets and cannot decrypt (loopClient.enter).

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/clienttls"
	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/evloop"
	"github.com/mongobouncer/mongobouncer/internal/gate"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// errTLSRefused ends a client refused at its TLS step. It wraps
// errClientGone: the refusal was logged already.
var errTLSRefused = fmt.Errorf("TLS refused: %w", errClientGone)

// maxRefusedRequest bounds what is read of a refused plain client's first
// request (a hello, well under this), so that the close that follows the
// error reply does not reset the connection before the client reads it.
const maxRefusedRequest = 64 * 1024

// SetTLS changes the client TLS settings (configuration reload): new
// clients use them, connected ones keep theirs.
func (s *Server) SetTLS(t clienttls.Settings) error { return s.tls.Set(t) }

// TLSRefusals returns how many clients were refused because they spoke
// plain while TLS was required, and how many failed their TLS handshake.
func (s *Server) TLSRefusals() (plain, handshake uint64) { return s.tls.Refusals() }

// startTLS runs on the client's goroutine before its first request: cn is
// the client's connection, ep its endpoint (the read window, and Mu, which
// guards cn.nc), connected when it connected, log its log. clienttls
// decides (under the handshake timeout, and client_login_timeout: a client
// must send its first message within it of connecting); here a refused
// plain client is answered, a login timeout reported, and a TLS client's
// connection installed.
func (cn *conn) startTLS(s *Server, ep *evloop.Endpoint, connected time.Time, log *slog.Logger) error {
	var loginDeadline time.Time
	login := time.Duration(s.loginTimeout.Load())
	if login > 0 {
		loginDeadline = connected.Add(login)
	}
	obs, _ := s.opts.Observer.(clienttls.Observer)
	r, err := s.tls.Accept(cn.nc, ep.Win.Free(), loginDeadline, obs, log)
	ep.Win.Hi += r.N
	if err != nil {
		if te := (*clienttls.Error)(nil); errors.As(err, &te) && te.LoginTimeout {
			why := gate.TimeoutFirstMessage
			if te.Step == clienttls.StepHandshake {
				why = gate.TimeoutTLSHandshake
			}
			s.loginTimedOut(log, why, time.Since(connected), login)
		}
		return errTLSRefused
	}
	switch {
	case r.RefusePlain:
		cn.refusePlain(&ep.Win, `mongobouncer requires TLS (tls_mode = "require"): connect with tls=true`)
		return errTLSRefused
	case r.Conn != nil:
		ep.Win.Reset()
		cn.setTLS(&ep.Mu, r.Conn)
	}
	return nil
}

// setTLS makes the connection tc under mu (the endpoint's): disconnect
// reads cn.nc under it.
func (cn *conn) setTLS(mu *sync.Mutex, tc *clienttls.Conn) {
	mu.Lock()
	defer mu.Unlock()
	cn.nc = tc
	cn.tlsConn = tc.Conn
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
