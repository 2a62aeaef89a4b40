package proxy

// Upstream failures as clients see them: the error reply for a request
// that could not reach or finish at its upstream (codes and labels drivers
// retry on, details kept from clients that have not logged in), and the
// SDAM state-change errors of replies.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/routing"
	"github.com/mongobouncer/mongobouncer/internal/topology"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// Error codes of the synthetic replies. They come from the set drivers
// retry, and none of them is a "state change" code: those would make a
// driver mark mongobouncer unknown and drop its pool to us for what is an
// upstream problem.
const (
	codeHostUnreachable = 6
	codeNetworkTimeout  = 89
	codeSocketException = 9001
	// codeFailedToParse answers a request the proxy cannot read (a bad
	// $readPreference); it is not retryable.
	codeFailedToParse = 9
)

// errUpstreamProtocol marks a reply that breaks the wire protocol on one
// connection (a reply to another request, a bad checksum, a stream nobody
// allowed, bytes past the last reply): the connection is closed, but the
// server is neither marked unknown nor its pool cleared.
var errUpstreamProtocol = errors.New("upstream broke the wire protocol")

// upstreamError turns a failure to reach or use an upstream into an error
// reply that drivers retry, labelled for writes and transactions.
func (s *Server) upstreamError(route *routing.Route, err error, req *request, inTxn bool) bsoncore.Document {
	code, codeName := int32(codeSocketException), "SocketException"
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
		msg := fmt.Sprintf("mongobouncer: %v (route %q, command %s)", rpe, route.Name, req.name())
		return errorReply(codeFailedToParse, "FailedToParse", msg)
	case upstreamAuthFailure(err, &sel, &cleared):
		// The route's service user was refused: no retry can help until
		// the configuration is fixed, so the server's code 18, no labels.
		s.opts.Observer.UpstreamError(route.Name, upstream.CodeAuthenticationFailed)
		detail := clientDetail(s, route, err)
		msg := fmt.Sprintf("mongobouncer: authentication of route %q to its upstream failed (command %s): %s", route.Name, req.name(), detail)
		if route.PassThrough {
			msg = fmt.Sprintf("mongobouncer: route %q logs in upstream as each client's own user (SCRAM pass-through), and the upstream refused this user (command %s): %s", route.Name, req.name(), detail)
		}
		return errorReply(upstream.CodeAuthenticationFailed, "AuthenticationFailed", msg)
	case errors.Is(err, errNoPassThroughSecret):
		// Nothing to retry with: the client's login gave no usable secret.
		s.opts.Observer.UpstreamError(route.Name, upstream.CodeAuthenticationFailed)
		msg := fmt.Sprintf("mongobouncer: route %q logs in upstream as each client's own user (SCRAM pass-through), and cannot for this client (command %s): %v", route.Name, req.name(), err)
		return errorReply(upstream.CodeAuthenticationFailed, "AuthenticationFailed", msg)
	case errors.Is(err, errShuttingDown):
		code, codeName = 91, "ShutdownInProgress"
		what = "shutting down"
	case errors.Is(err, errRouteReplaced):
		code, codeName = codeHostUnreachable, "HostUnreachable"
		what = "the route was reconfigured while the request waited at its pause; retry"
	case errors.As(err, &sel):
		code, codeName = codeHostUnreachable, "HostUnreachable"
		what = "no upstream server available"
	case errors.As(err, &wq):
		code, codeName = codeNetworkTimeout, "NetworkTimeout"
		what = "timed out waiting for an upstream connection"
	case errors.As(err, &cleared):
		code, codeName = codeHostUnreachable, "HostUnreachable"
		what = "upstream pool was cleared"
	case errors.As(err, &closed):
		code, codeName = codeHostUnreachable, "HostUnreachable"
		what = "upstream pool is closed"
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		code, codeName = codeNetworkTimeout, "NetworkTimeout"
		what = "upstream timed out"
	case isConnectError(err):
		code, codeName = codeHostUnreachable, "HostUnreachable"
		what = "cannot connect to upstream"
	default:
		what = "upstream connection failed"
	}
	s.opts.Observer.UpstreamError(route.Name, code)
	msg := fmt.Sprintf("mongobouncer: %s (route %q, command %s): %s", what, route.Name, req.name(), clientDetail(s, route, err))
	doc := errorReply(code, codeName, msg, labelsFor(req, inTxn)...)
	if code == codeShutdownInProgress {
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

// labelsFor chooses the error labels that make drivers retry correctly.
func labelsFor(req *request, inTxn bool) []string {
	switch {
	case inTxn && req.info.kind == kindCommit:
		return []string{"RetryableWriteError", "UnknownTransactionCommitResult"}
	case inTxn && req.info.kind == kindAbort:
		return []string{"RetryableWriteError"}
	case inTxn:
		return []string{"TransientTransactionError"}
	case req.info.write:
		return []string{"RetryableWriteError"}
	}
	return nil
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

// Shutdown codes: a server that says it is shutting down.
const (
	codeShutdownInProgress    = 91
	codeInterruptedAtShutdown = 11600
)

// softenShutdown rewrites in place the shutdown codes (91
// ShutdownInProgress, 11600 InterruptedAtShutdown) of a relayed reply body,
// its own code and its writeConcernError's, to HostUnreachable (6), and
// reports whether it changed anything.
//
// A driver that receives a shutdown code clears its whole pool to the
// server that sent it, and that server is mongobouncer, which is not
// shutting down: one member is. HostUnreachable is retried the same way
// (reads by code, writes by the RetryableWriteError label the member
// added), without costing the application its connections to mongobouncer.
// The topology has already seen the original code. codeName and errmsg
// stay as the member wrote them (they say what happened; a shorter name
// would move every byte after it); drivers decide on the code.
func softenShutdown(body []byte) bool {
	return softenCodes(body, true)
}

// softenCodes does softenShutdown's work on one document; top says to look
// into a writeConcernError too.
func softenCodes(doc []byte, top bool) bool {
	if len(doc) < 5 {
		return false
	}
	changed := false
	rest := doc[4 : len(doc)-1]
	for len(rest) > 0 {
		el, next, ok := bsoncore.ReadElement(rest)
		if !ok {
			break
		}
		rest = next
		switch el.Key() {
		case "code":
			v := el.Value()
			if v.Type != bsoncore.TypeInt32 || len(v.Data) != 4 {
				continue
			}
			if c := int32(binary.LittleEndian.Uint32(v.Data)); c == codeShutdownInProgress || c == codeInterruptedAtShutdown {
				// v.Data aliases doc.
				binary.LittleEndian.PutUint32(v.Data, uint32(codeHostUnreachable))
				changed = true
			}
		case "writeConcernError":
			if d, ok := el.Value().DocumentOK(); ok && top {
				changed = softenCodes(d, false) || changed
			}
		}
	}
	return changed
}
