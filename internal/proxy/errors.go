package proxy

// Upstream failures as clients see them: the error reply for a request
// that could not reach or finish at its upstream (the Go errors of pool,
// topology and upstream mapped to command's codes and labels, details
// kept from clients that have not logged in), and the SDAM state-change
// errors of replies.

import (
	"context"
	"errors"
	"fmt"
	"net"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/routing"
	"github.com/mongobouncer/mongobouncer/internal/topology"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// errUpstreamProtocol marks a reply that breaks the wire protocol on one
// connection (a reply to another request, a bad checksum, a stream nobody
// allowed, bytes past the last reply): the connection is closed, but the
// server is neither marked unknown nor its pool cleared.
var errUpstreamProtocol = errors.New("upstream broke the wire protocol")

// upstreamError turns a failure to reach or use an upstream into an error
// reply that drivers retry, labelled for writes and transactions.
func (s *Server) upstreamError(route *routing.Route, err error, req *command.Request, inTxn bool) bsoncore.Document {
	code, codeName := int32(command.CodeSocketException), "SocketException"
	var what string
	var sel *topology.SelectionError
	var wq *pool.WaitQueueTimeoutError
	var cleared *pool.PoolClearedError
	var closed *pool.PoolClosedError
	var ne net.Error
	var rpe *routing.ReadPrefError
	switch {
	case errors.As(err, &rpe):
		// The client's mistake: not retryable, and nothing upstream.
		msg := fmt.Sprintf("mongobouncer: %v (route %q, command %s)", rpe, route.Name, req.Name())
		return command.ErrorReply(command.CodeFailedToParse, "FailedToParse", msg)
	case upstreamAuthFailure(err, &sel, &cleared):
		// The route's service user was refused: no retry can help until
		// the configuration is fixed, so the server's code 18, no labels.
		s.opts.Observer.UpstreamError(route.Name, upstream.CodeAuthenticationFailed)
		detail := clientDetail(s, route, err)
		msg := fmt.Sprintf("mongobouncer: authentication of route %q to its upstream failed (command %s): %s", route.Name, req.Name(), detail)
		if route.PassThrough {
			msg = fmt.Sprintf("mongobouncer: route %q logs in upstream as each client's own user (SCRAM pass-through), and the upstream refused this user (command %s): %s", route.Name, req.Name(), detail)
		}
		return command.ErrorReply(upstream.CodeAuthenticationFailed, "AuthenticationFailed", msg)
	case errors.Is(err, errNoPassThroughSecret):
		// Nothing to retry with: the client's login gave no usable secret.
		s.opts.Observer.UpstreamError(route.Name, upstream.CodeAuthenticationFailed)
		msg := fmt.Sprintf("mongobouncer: route %q logs in upstream as each client's own user (SCRAM pass-through), and cannot for this client (command %s): %v", route.Name, req.Name(), err)
		return command.ErrorReply(upstream.CodeAuthenticationFailed, "AuthenticationFailed", msg)
	case errors.Is(err, errShuttingDown):
		code, codeName = 91, "ShutdownInProgress"
		what = "shutting down"
	case errors.Is(err, errRouteReplaced):
		code, codeName = command.CodeHostUnreachable, "HostUnreachable"
		what = "the route was reconfigured while the request waited at its pause; retry"
	case errors.As(err, &sel):
		code, codeName = command.CodeHostUnreachable, "HostUnreachable"
		what = "no upstream server available"
	case errors.As(err, &wq):
		code, codeName = command.CodeNetworkTimeout, "NetworkTimeout"
		what = "timed out waiting for an upstream connection"
	case errors.As(err, &cleared):
		code, codeName = command.CodeHostUnreachable, "HostUnreachable"
		what = "upstream pool was cleared"
	case errors.As(err, &closed):
		code, codeName = command.CodeHostUnreachable, "HostUnreachable"
		what = "upstream pool is closed"
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		code, codeName = command.CodeNetworkTimeout, "NetworkTimeout"
		what = "upstream timed out"
	case isConnectError(err):
		code, codeName = command.CodeHostUnreachable, "HostUnreachable"
		what = "cannot connect to upstream"
	default:
		what = "upstream connection failed"
	}
	s.opts.Observer.UpstreamError(route.Name, code)
	msg := fmt.Sprintf("mongobouncer: %s (route %q, command %s): %s", what, route.Name, req.Name(), clientDetail(s, route, err))
	doc := command.ErrorReply(code, codeName, msg, command.Labels(req, inTxn)...)
	if code == command.CodeShutdownInProgress {
		// Our own shutdown: a state change error, with our topologyVersion.
		doc = s.topo.WithVersion(doc)
	}
	return doc
}

// clientDetail is the text of err a client gets. A selection error lists
// every member with its address and error, which mongobouncer, a mongos to
// its clients, keeps to its log: the client gets the counts by role.
func clientDetail(s *Server, route *routing.Route, err error) string {
	var sel *topology.SelectionError
	if !errors.As(err, &sel) {
		return err.Error()
	}
	if s.log != nil {
		s.log.Warn("server selection failed", "route", route.Name, "error", err)
	}
	return sel.ClientMessage()
}

// upstreamAuthFailure reports whether the upstream refused the route's
// credentials (code 18), or a pass-through secret cannot work there (its
// salt differs): on this request's own connection attempt, on
// another's that cleared the pool it waited in, or as the reason the
// servers selection gave up on are Unknown.
func upstreamAuthFailure(err error, sel **topology.SelectionError, cleared **pool.PoolClearedError) bool {
	refused := func(err error) bool {
		var ae *upstream.AuthError
		return errors.As(err, &ae) && (ae.AuthenticationFailed() || errors.Is(ae, upstream.ErrPassThroughMismatch))
	}
	switch {
	case refused(err):
		return true
	case errors.As(err, cleared) && (*cleared).Cause != nil:
		return refused((*cleared).Cause)
	case errors.As(err, sel) && len((*sel).Servers) > 0:
		for _, st := range (*sel).Servers {
			if !refused(st.Err) {
				return false
			}
		}
		return true
	}
	return false
}

// isConnectError reports whether err is a failure to establish an upstream
// connection (as opposed to one failing mid-request).
func isConnectError(err error) bool {
	var pe *pool.ConnectionError
	var ue *upstream.ConnectError
	return errors.As(err, &pe) || errors.As(err, &ue)
}

// stateChangeError describes an upstream reply with a state-change code for
// the topology's error handling, with the reply's topologyVersion when it
// has one (an error older than the server's current description is
// ignored).
func stateChangeError(code int32, body bsoncore.Document) error {
	e := &upstream.CommandError{Code: code}
	if v, err := body.LookupErr("errmsg"); err == nil {
		e.Message, _ = v.StringValueOK()
	}
	if v, err := body.LookupErr("topologyVersion"); err == nil {
		if d, ok := v.DocumentOK(); ok {
			e.TopologyVersion = upstream.ParseTopologyVersion(d)
		}
	}
	return e
}
