package topology

// Application errors: what an error seen by a request (or by the pool while
// it established a connection) does to the server, as SDAM's error
// handling decides it (sdam.HandleAppError); this file only translates Go
// errors into the rules' terms and carries out the decision.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"

	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/sdam"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// IsStateChangeCode reports whether a server error code means the server is
// changing state: "not writable primary" (10107, 13435, 10058) or "node is
// recovering" (11600, 11602, 13436, 189, 91).
func IsStateChangeCode(code int32) bool { return sdam.IsStateChangeError(code, true, "") }

// HandleError applies SDAM's application error handling to err, seen on c
// while running an operation against this server. c may be nil when the
// error came from CheckOut, or from the pool's background connection
// establishment (Options.Pool.OnBackgroundError is wired here).
//
//   - An error from before the pool's last clear (the connection's, or the
//     failed establishment's, generation is older than the pool's), or a
//     state-change error whose topologyVersion is not newer than the
//     server's, is stale and ignored.
//   - A connection that broke or timed out while being established (the
//     connect, the TLS handshake or hello) is labelled
//     SystemOverloadedError by CMAP's backpressure rule and changes
//     nothing: an overloaded server looks like that, and the monitor, on
//     its own connection, finds a server that is really gone.
//   - Any other failure to establish a connection (*pool.ConnectionError
//     or *upstream.ConnectError: a failed authentication, an unusable or
//     refused hello, a name that does not resolve, a certificate that does
//     not verify) and a network error on an established connection that
//     is not a timeout mark the server Unknown and clear its pool.
//   - A state-change error (NotWritablePrimary, NodeIsRecovering...) marks
//     the server Unknown and asks for an immediate check; the pool is
//     cleared only for shutdown errors (11600, 91).
//   - A timeout on an established connection is the operation's problem,
//     and the pool's own CheckOut errors (wait-queue timeout, pool cleared
//     or closed), a cancelled context and other command errors change
//     nothing.
//
// Behind a load balancer the server never becomes Unknown (there is no SDAM
// for a load balancer); the failing backend's connections are cleared by
// serviceId instead.
//
// An error of a user pool's (HandleUserPoolError) comes here once it is
// known not to be stale for that pool, with current set: it is judged
// against the server's current generation.
func (s *Server) HandleError(err error, c *pool.Conn) { s.handleError(err, c, false) }

func (s *Server) handleError(err error, c *pool.Conn, current bool) {
	if err == nil || s.topo.isClosed() || errors.Is(err, context.Canceled) {
		// Our own cancellation (a clear or close interrupting a pending
		// connection, a client going away) says nothing about the server.
		return
	}
	ae, ok := s.appError(err, c)
	if !ok {
		return
	}
	if current {
		ae.Generation = noGeneration
	}
	t := s.topo
	t.mu.Lock()
	if t.closed || t.servers[s.addr] != s {
		t.mu.Unlock()
		return
	}
	cur, _ := t.desc.Server(s.addr)
	gen := s.pool.Stats().Generation
	if ae.Generation == noGeneration {
		ae.Generation = gen
	}
	act := sdam.HandleAppError(cur, t.desc.Type, gen, ae)
	if act.Stale {
		t.mu.Unlock()
		t.log.Debug("ignoring a stale error: from a connection of an older pool generation, or an older topologyVersion",
			slog.String("topology", t.name), slog.String("address", s.addr), slog.Any("error", err))
		return
	}
	var removed []*Server
	// Only the error that changes the server is worth a line at Info: on a
	// server without topologyVersion no later error is stale, and every
	// request in flight at a stepdown reports one.
	wasUsable := s.State() == Usable
	if act.MarkUnknown {
		removed = t.applyLocked(s, act.Unknown, nil)
		t.publishLocked()
	}
	if act.ClearPool {
		// After publishing: no new selection picks s while it clears.
		if s.loadBalancer {
			// Without a connection there is no serviceId to clear (and c
			// may be nil: a checkout's error).
			if c != nil {
				if id, ok := c.ServiceID(); ok {
					s.pool.ClearService(id)
					s.eachUserPool(func(p *pool.Pool) { p.ClearService(id) })
				}
			}
		} else {
			s.clearPoolsLocked(err, act.InterruptInUse)
		}
	}
	t.mu.Unlock()
	for _, r := range removed {
		r.closePools()
	}
	// The check request also cancels a streaming check after a network
	// error (act.CancelCheck): the monitor drops a stream whose server was
	// marked Unknown by one, and checks on a new connection.
	if act.MarkUnknown || act.RequestCheck {
		s.RequestCheck()
	}
	var authErr *upstream.AuthError
	switch {
	case act.MarkUnknown && errors.As(err, &authErr):
		// Once per pool generation: the failure clears the pool, and the
		// failures of the attempts already under way are stale. The error
		// names the user and mechanism, never the password.
		t.log.Warn("authentication to the upstream failed; server marked Unknown and its pool paused until the next successful check",
			slog.String("topology", t.name), slog.String("address", s.addr),
			slog.String("mechanism", authErr.Mechanism), slog.String("user", authErr.Username),
			slog.String("authSource", authErr.Source), slog.Uint64("generation", ae.Generation), slog.Any("error", err))
	case act.MarkUnknown:
		level := slog.LevelInfo
		if !wasUsable {
			level = slog.LevelDebug
		}
		t.log.Log(context.Background(), level, "marked server Unknown after an operation error",
			slog.String("topology", t.name), slog.String("address", s.addr),
			slog.Bool("poolCleared", act.ClearPool), slog.Any("error", err))
	}
}

// noGeneration stands for "the pool's current generation" in an AppError
// built without a connection.
const noGeneration = ^uint64(0)

// appError translates err into SDAM's terms; false means the rules have
// nothing to say about it (the pool's own checkout errors, context
// errors).
func (s *Server) appError(err error, c *pool.Conn) (sdam.AppError, bool) {
	var connErr *pool.ConnectionError
	var upErr *upstream.ConnectError
	var cmdErr *upstream.CommandError
	ae := sdam.AppError{Err: err, Generation: noGeneration, HandshakeCompleted: true, MaxWireVersion: s.maxWireVersion()}
	if c != nil {
		ae.Generation = c.Generation()
		if id, ok := c.ServiceID(); ok {
			ae.ServiceID = &id
		}
	}
	timeout := isTimeout(err)
	switch {
	case errors.As(err, &connErr) || errors.As(err, &upErr):
		// SDAM: any failure before the handshake completes, timeouts and
		// authentication failures included, unless CMAP's backpressure
		// rule labels it (sdam.ConnectFailure).
		gen := ae.Generation
		if connErr != nil {
			gen = connErr.Generation
		}
		id := ae.ServiceID
		ae = sdam.ConnectFailure(connectStage(upErr), isIOFailure(err), timeout, gen, err)
		ae.MaxWireVersion, ae.ServiceID = s.maxWireVersion(), id
	case errors.As(err, &cmdErr):
		ae.Kind = sdam.CommandError
		ae.Code, ae.HasCode, ae.Message = cmdErr.Code, true, cmdErr.Message
		if tv := cmdErr.TopologyVersion; tv != nil {
			ae.TopologyVersion = &sdam.TopologyVersion{ProcessID: tv.ProcessID, Counter: tv.Counter}
		}
	case upstream.IsNetworkError(err) && c != nil:
		ae.Kind = sdam.NetworkError
		if timeout {
			ae.Kind = sdam.NetworkTimeout
		}
	default:
		// The pool's own errors from CheckOut (wait-queue timeout, pool
		// cleared or closed), timeouts of our own contexts.
		return ae, false
	}
	return ae, true
}

func (s *Server) maxWireVersion() int32 {
	if h := s.Hello(); h != nil {
		return h.MaxWireVersion
	}
	return 0
}

// connectStage maps the dialer's stage names onto SDAM's; a
// *pool.ConnectionError whose cause is no *upstream.ConnectError (a
// Connector of a test's) counts as the handshake's.
func connectStage(e *upstream.ConnectError) sdam.Stage {
	if e == nil {
		return sdam.StageHello
	}
	switch e.Stage {
	case "dial":
		return sdam.StageDial
	case "tls":
		return sdam.StageTLS
	case "auth":
		return sdam.StageAuth
	}
	return sdam.StageHello
}

// isIOFailure reports whether a connection establishment failed because
// the connection itself broke or timed out, which an overloaded server
// causes too, rather than for a reason no load explains: a name that does
// not resolve, a certificate that does not verify or is refused, a reply
// that is no hello (all of which the dialer also wraps as network errors).
func isIOFailure(err error) bool {
	if !upstream.IsNetworkError(err) || errors.Is(err, upstream.ErrBadReply) {
		return false
	}
	var (
		dnsErr    *net.DNSError
		verifyErr *tls.CertificateVerificationError
		hostErr   x509.HostnameError
		authErr   x509.UnknownAuthorityError
		certErr   x509.CertificateInvalidError
		alertErr  tls.AlertError
		recordErr tls.RecordHeaderError
	)
	return !errors.As(err, &dnsErr) && !errors.As(err, &verifyErr) && !errors.As(err, &hostErr) &&
		!errors.As(err, &authErr) && !errors.As(err, &certErr) && !errors.As(err, &alertErr) &&
		!errors.As(err, &recordErr)
}
