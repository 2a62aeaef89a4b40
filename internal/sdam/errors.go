// The error rules as pure decisions: what an application error (SDAM
// "Error handling") or a failed monitor check (server monitoring "Error
// handling") does to a server, its pool and its monitor. The caller carries
// the decision out while holding the lock it applies descriptions under, so
// clearing a pool and marking the server Unknown happen together.

package sdam

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// ErrorKind is what went wrong on an application connection.
type ErrorKind int

// The kinds of application error the rules tell apart.
const (
	// NetworkError is a network error other than a timeout.
	NetworkError ErrorKind = iota + 1
	// NetworkTimeout is a read or write that timed out: it may be a slow
	// operation rather than a dead server.
	NetworkTimeout
	// CommandError is a reply with ok: 0, or a writeConcernError (see
	// CommandErrorFromReply).
	CommandError
)

// The server's error codes the rules know (numbers, never names: names
// change between releases).
var (
	// recoveringCodes are "node is recovering" errors.
	recoveringCodes = []int32{11600, 11602, 13436, 189, 91}
	// notWritablePrimaryCodes are "not writable primary" errors.
	notWritablePrimaryCodes = []int32{10107, 13435, 10058}
	// shutdownCodes are the "node is shutting down" subset of
	// recoveringCodes: only they clear the pool.
	shutdownCodes = []int32{11600, 91}
)

// AppError describes an error an application operation met on a pooled
// connection.
type AppError struct {
	Kind ErrorKind
	// HandshakeCompleted is false while the connection was being set up
	// (connect, hello, authentication), true once it served operations.
	HandshakeCompleted bool
	// SystemOverloaded: the error carries the SystemOverloadedError label.
	// CMAP's pool puts it on network errors and timeouts while
	// establishing a connection (backpressure, see ConnectFailure); such
	// errors change nothing.
	SystemOverloaded bool
	// Code (when HasCode) and Message are a CommandError's code and
	// errmsg; without a code the message decides (the legacy rule).
	Code    int32
	HasCode bool
	Message string
	// TopologyVersion is a state change error's topologyVersion, if any.
	TopologyVersion *TopologyVersion
	// Generation is the connection's pool generation, or for an error
	// before the handshake completed, the pool's generation when the
	// connection attempt started.
	Generation uint64
	// MaxWireVersion is the connection's server maxWireVersion. The
	// current rules do not consult it: the pre-4.2 rule (clear the pool on
	// every state change error) went with support for those servers
	// (MinSupportedWireVersion); it is kept for logging.
	MaxWireVersion int32
	// ServiceID is the connection's serviceId behind a load balancer.
	ServiceID *bson.ObjectID
	// Err is the error itself, stored in the Unknown description.
	Err error
}

// Stage is the step of establishing an application connection that
// failed.
type Stage int

// The steps of establishing a connection, in order.
const (
	// StageDial is the TCP (or Unix socket) connect.
	StageDial Stage = iota + 1
	// StageTLS is the TLS handshake.
	StageTLS
	// StageHello is the MongoDB handshake: the hello command and its reply.
	StageHello
	// StageAuth is authentication, after hello.
	StageAuth
)

// ConnectFailure returns the AppError for a failure to establish an
// application connection at stage, begun in pool generation generation.
// io says the connection itself failed (reset, EOF, or, with timeout, a
// read, write or connect that timed out) rather than being refused for a
// reason (a name that does not resolve, a certificate that does not
// verify, an unusable hello reply, failed authentication).
//
// It applies CMAP's backpressure rule: an I/O failure or timeout in the
// connect, the TLS handshake or hello is what an overloaded server's
// ingress limiter looks like, so the pool labels it SystemOverloadedError
// and HandleAppError leaves the server and its pool alone (the monitor,
// on its own connection, decides whether the server is gone). A failure
// in authentication, or one that is no I/O failure, carries no label:
// the server is marked Unknown and its pool cleared.
func ConnectFailure(stage Stage, io, timeout bool, generation uint64, err error) AppError {
	e := AppError{Kind: NetworkError, Generation: generation, Err: err}
	if io && timeout {
		e.Kind = NetworkTimeout
	}
	e.SystemOverloaded = io && stage >= StageDial && stage <= StageHello
	return e
}

// ErrorAction is what to do about an error. The zero value does nothing.
type ErrorAction struct {
	// Stale: the error came from a connection older than the pool's
	// generation, or its topologyVersion is not newer than the server's;
	// nothing else is set and no state may change.
	Stale bool
	// MarkUnknown: Apply Unknown to the topology (it carries the error and
	// the error's topologyVersion).
	MarkUnknown bool
	Unknown     ServerDescription
	// ClearPool: clear the server's pool (behind a load balancer, only the
	// connections of AppError.ServiceID), InterruptInUse with it closing
	// the connections in use too.
	ClearPool      bool
	InterruptInUse bool
	// RequestCheck: ask the monitor for an immediate check (the server is
	// up but not what we thought).
	RequestCheck bool
	// CancelCheck: cancel the monitor's check in progress; its connection
	// is likely as dead as the one that failed.
	CancelCheck bool
	// CheckAgainNow (failed checks only): start the next check at once
	// instead of after heartbeatFrequencyMS, to tell a blip from an outage.
	CheckAgainNow bool
}

// HandleAppError decides what the application error e does to the server
// currently described by current, in a topology of type tt whose pool for
// the server is at generation poolGeneration (SDAM's handleError).
func HandleAppError(current ServerDescription, tt TopologyType, poolGeneration uint64, e AppError) ErrorAction {
	if e.Generation < poolGeneration || CompareTopologyVersion(current.TopologyVersion, e.TopologyVersion) >= 0 {
		return ErrorAction{Stale: true}
	}
	if e.Kind == CommandError && isStateChange(e) {
		a := ErrorAction{RequestCheck: true}
		if tt != LoadBalanced {
			a.MarkUnknown, a.Unknown = true, UnknownServer(current.Address, e.err(), e.TopologyVersion)
		}
		a.ClearPool = e.HasCode && slices.Contains(shutdownCodes, e.Code)
		return a
	}
	if e.Kind == NetworkError || !e.HandshakeCompleted {
		if e.SystemOverloaded {
			return ErrorAction{}
		}
		if tt == LoadBalanced {
			// No description to change, and without a serviceId (the
			// handshake did not get that far) no pool to clear.
			return ErrorAction{ClearPool: e.ServiceID != nil}
		}
		return ErrorAction{
			MarkUnknown: true, Unknown: UnknownServer(current.Address, e.err(), nil),
			ClearPool: true, CancelCheck: true,
		}
	}
	// A timeout or an ordinary command error on an established connection:
	// the server is fine as far as we know.
	return ErrorAction{}
}

// CheckFailed decides what a failed monitor check of the server described
// by current does (server monitoring "Network or command error during
// server check"): the server becomes Unknown with err, its pool is cleared
// (interrupting connections in use after a timeout, which may be hung on a
// dead server), and if it was known before a network error the monitor
// checks again at once. A command error is a hello reply without ok: 1.
func CheckFailed(current ServerDescription, kind ErrorKind, err error) ErrorAction {
	return ErrorAction{
		MarkUnknown:    true,
		Unknown:        UnknownServer(current.Address, err, nil),
		ClearPool:      true,
		InterruptInUse: kind == NetworkTimeout,
		CheckAgainNow:  kind != CommandError && current.Type != Unknown,
	}
}

// err is the error to store in an Unknown description: e.Err, or one made
// from e when the caller gave none, so the description always says why.
func (e AppError) err() error {
	if e.Err != nil {
		return e.Err
	}
	switch e.Kind {
	case NetworkError:
		return errors.New("network error")
	case NetworkTimeout:
		return errors.New("network timeout")
	}
	if e.HasCode {
		return fmt.Errorf("command failed: %s (code %d)", e.Message, e.Code)
	}
	return fmt.Errorf("command failed: %s", e.Message)
}

// isStateChange reports a "not writable primary" or "node is recovering"
// error: by code when there is one, else by the legacy messages.
func isStateChange(e AppError) bool {
	if e.HasCode {
		return slices.Contains(recoveringCodes, e.Code) || slices.Contains(notWritablePrimaryCodes, e.Code)
	}
	return strings.Contains(e.Message, "not master") || strings.Contains(e.Message, "node is recovering")
}

// IsStateChangeError reports whether code (when hasCode) or message is a
// "not writable primary" or "node is recovering" error.
func IsStateChangeError(code int32, hasCode bool, message string) bool {
	return isStateChange(AppError{Code: code, HasCode: hasCode, Message: message})
}

// IsShutdownError reports whether code is a "node is shutting down" error.
func IsShutdownError(code int32) bool { return slices.Contains(shutdownCodes, code) }

// CommandErrorFromReply finds the error in a command reply the rules look
// at: the reply's own error when ok is not 1, else its writeConcernError.
// Errors inside writeErrors are never looked at (they concern documents,
// not the server). It returns false when the reply has neither, or is not
// a document; the caller fills in the connection's fields (Generation,
// HandshakeCompleted, ...) and Err.
func CommandErrorFromReply(reply bsoncore.Document) (AppError, bool) {
	if reply.Validate() != nil {
		return AppError{}, false
	}
	if ok, err := okValue("ok", reply.Lookup("ok")); err == nil && ok {
		wce, isDoc := reply.Lookup("writeConcernError").DocumentOK()
		if !isDoc {
			return AppError{}, false
		}
		return commandError(wce, reply), true
	}
	return commandError(reply, reply), true
}

// commandError reads code and errmsg from doc and the topologyVersion from
// the reply (a state change error puts it at the top level).
func commandError(doc, reply bsoncore.Document) AppError {
	e := AppError{Kind: CommandError}
	if v, err := doc.LookupErr("code"); err == nil {
		if c, err := int32Value("code", v); err == nil {
			e.Code, e.HasCode = c, true
		}
	}
	e.Message, _ = doc.Lookup("errmsg").StringValueOK()
	if v, err := reply.LookupErr("topologyVersion"); err == nil {
		e.TopologyVersion, _ = ParseTopologyVersion(v)
	}
	return e
}
