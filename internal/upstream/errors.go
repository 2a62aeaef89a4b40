package upstream

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
)

// Sentinel errors for handshake replies that are well formed but unusable.
// They arrive wrapped in a *ConnectError.
var (
	// ErrWireVersion reports an upstream whose maxWireVersion is below 6: it
	// cannot speak OP_MSG, which is all mongobouncer sends.
	ErrWireVersion = errors.New("upstream: server too old (maxWireVersion < 6, no OP_MSG)")
	// ErrNoServiceID reports a hello reply without serviceId from an upstream
	// dialled in load-balanced mode.
	ErrNoServiceID = errors.New("upstream: load-balanced hello reply has no serviceId")
	// ErrBadReply reports a reply that is valid on the wire but not a usable
	// answer: wrong responseTo, an exhaust flag nobody asked for, a
	// missing or malformed field. The connection is out of step and must be
	// discarded, so it also comes wrapped in a *NetworkError.
	ErrBadReply = errors.New("upstream: unexpected reply")
	// ErrClosed reports I/O on a Conn after Close.
	ErrClosed = errors.New("upstream: connection closed")
)

// ConnectError reports a failure to establish an upstream connection: the
// dial, the TLS handshake, hello, or authentication. It unwraps to the cause,
// which may be a *NetworkError, a *CommandError (the server refused hello or
// authentication), ErrWireVersion, ErrNoServiceID, or a context error when the
// caller's context ended or ConnectTimeout elapsed.
type ConnectError struct {
	// Addr is the address that was passed to Connect.
	Addr string
	// Stage is the step that failed: "dial", "tls", "hello" or "auth".
	Stage string
	// Err is the cause.
	Err error
}

// Error implements error.
func (e *ConnectError) Error() string {
	return "upstream: connect to " + e.Addr + " (" + e.Stage + "): " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *ConnectError) Unwrap() error { return e.Err }

// NetworkError reports a failure of the connection itself: an I/O error, a
// timeout, EOF, or a reply that cannot be framed or parsed. After one, the
// connection's stream position is unknown and it must be discarded. It
// unwraps to the cause, so errors.Is(err, os.ErrDeadlineExceeded),
// errors.Is(err, io.EOF) and errors.Is(err, wire.ErrMessageTooLarge) work.
type NetworkError struct {
	// Addr is the upstream address.
	Addr string
	// Op is what was being done: "dial", "tls", "write" or "read".
	Op string
	// Err is the cause.
	Err error
}

// Error implements error.
func (e *NetworkError) Error() string {
	return "upstream: " + e.Op + " " + e.Addr + ": " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *NetworkError) Unwrap() error { return e.Err }

// Timeout reports whether the cause is a timeout, so that a *NetworkError
// satisfies the net.Error convention.
func (e *NetworkError) Timeout() bool {
	var ne net.Error
	return errors.As(e.Err, &ne) && ne.Timeout()
}

// IsNetworkError reports whether err means the upstream connection failed (as
// opposed to the server answering with an error, a *CommandError). The
// connection that produced it must be closed and not reused.
func IsNetworkError(err error) bool {
	var ne *NetworkError
	return errors.As(err, &ne)
}

// CommandError is a reply with ok:0 to a command sent with RoundTrip. The
// connection is still in step and usable.
type CommandError struct {
	// Code is the server's error code (0 if it sent none).
	Code int32
	// CodeName is the server's name for Code, e.g. "ShutdownInProgress".
	CodeName string
	// Message is errmsg.
	Message string
	// Labels are the errorLabels, e.g. "RetryableWriteError".
	Labels []string
	// TopologyVersion is the reply's topologyVersion, nil if it had none:
	// SDAM ignores a state-change error older than what it knows.
	TopologyVersion *TopologyVersion
}

// Error implements error.
func (e *CommandError) Error() string {
	s := "upstream: command failed: (" + strconv.Itoa(int(e.Code))
	if e.CodeName != "" {
		s += " " + e.CodeName
	}
	s += ")"
	if e.Message != "" {
		s += " " + e.Message
	}
	return s
}

// HasLabel reports whether the server attached the error label l.
func (e *CommandError) HasLabel(l string) bool { return slices.Contains(e.Labels, l) }

// connectError builds a *ConnectError, making the caller's context the
// primary cause when it has ended: an I/O error seen after the context
// closed the connection is only a symptom.
func connectError(addr, stage string, ctxErr, err error) error {
	if ctxErr != nil && !errors.Is(err, ctxErr) {
		err = fmt.Errorf("%w (%w)", ctxErr, err)
	}
	return &ConnectError{Addr: addr, Stage: stage, Err: err}
}
