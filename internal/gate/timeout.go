// Package gate holds the rules a client connection passes before and at its
// login, over plain values (times, sizes, names), with no socket and no
// proxy type: client_login_timeout's deadlines (Clock, Wait),
// max_user_client_conn's count (Users), and the pre-login limits and
// answers (ReadLimit, PreLoginAnswered, BuildInfo). internal/proxy applies
// them to its clients.
package gate

// client_login_timeout: how long a client may hold a connection without
// having proved anything. Without it, an unauthenticated socket that sends
// nothing lives for ever, and max_client_conn such sockets lock every real
// client out.
//
// The rule is about silence, not age: a driver's monitoring connection
// never logs in (SDAM) and sends a hello every heartbeat, and closing it
// makes the driver mark the server Unknown and clear its pools. So:
//   - a client must send its first whole message within the timeout of
//     connecting (a TLS client's handshake counts towards it);
//   - with client authentication on, a client that has not logged in
//     must send a whole message at least every timeout, and a SASL
//     conversation must finish within the timeout of its saslStart;
//   - a message whose first byte has arrived must be whole within the
//     timeout (slowloris), whoever sends it.
//
// After its first message, a client with authentication off, or one that
// has logged in, is governed by client_idle_timeout only. Here the rule is
// computation: given what a client has done and when, the deadline of its
// next read (Wait.Compute, for a client's goroutine) or whether it has
// timed out (Clock.Expired, for the event loop's idle sweeper).

import (
	"sync/atomic"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/auth"
)

// Reasons a client is closed by client_login_timeout, as logged and as
// observers hear them (a bounded set: metric labels).
const (
	// TimeoutFirstMessage: no whole first message in time.
	TimeoutFirstMessage = "first_message"
	// TimeoutTLSHandshake: the TLS handshake did not end in time.
	TimeoutTLSHandshake = "tls_handshake"
	// TimeoutNotLoggedIn: not logged in, and silent that long.
	TimeoutNotLoggedIn = "not_logged_in"
	// TimeoutSASL: a SASL conversation did not finish in time.
	TimeoutSASL = "sasl_conversation"
	// TimeoutPartialMessage: a message begun was not whole in time.
	TimeoutPartialMessage = "partial_message"
)

// Clock is what the login rule remembers of one client. Owned by whoever
// serves the client, except Armed.
type Clock struct {
	// Armed is set while the client's goroutine waits for a message under
	// the login rule: a shorter timeout set live wakes it (atomic).
	Armed atomic.Bool
	// Connected is when the client connected (set once, at accept).
	Connected time.Time
	// Started is set once a whole message has arrived.
	Started bool
	// conv is the SASL conversation ConvAt is the start of: a saslStart
	// (or a hello's speculativeAuthenticate) replaces the client's.
	conv   *auth.Conversation
	ConvAt time.Time
	// MsgAt is when the last whole message arrived, kept only while the
	// client has not logged in (authentication on).
	MsgAt time.Time
	// PartAt (a monotonic reading, see Expired) is when the loop saw the
	// first bytes of the message now in the read window, 0 when it holds
	// no partial message.
	PartAt time.Duration
}

// Message records that a whole message arrived at now; pending says the
// client must still log in.
func (k *Clock) Message(now time.Time, pending bool) {
	k.Started = true
	if pending {
		k.MsgAt = now
	}
}

// NoteConv records the start of conv, the client's conversation, if it
// began since the last call: the message that began it is the last one
// read (MsgAt).
func (k *Clock) NoteConv(conv *auth.Conversation) {
	if conv != k.conv {
		k.conv, k.ConvAt = conv, k.MsgAt
	}
}

// LoggedIn ends the rule's watch of conversations: a logged-in client
// keeps no finished conversation for the connection's life.
func (k *Clock) LoggedIn() { k.conv, k.ConvAt = nil, time.Time{} }

// NotePartial records, as the loop waits for more of the client's bytes
// at now (monotonic), whether the read window holds the start of a
// message (pending bytes) and since when.
func (k *Clock) NotePartial(pending int, now time.Duration) {
	switch {
	case pending == 0:
		k.PartAt = 0
	case k.PartAt == 0:
		k.PartAt = now
	}
}

// Deadline returns when the login rule closes a client waiting from now
// for its next message, and why; zero when the rule does not apply.
// pending says the client must still log in, conv is its conversation in
// progress (nil for none).
func (k *Clock) Deadline(pending bool, conv *auth.Conversation, now time.Time, timeout time.Duration) (time.Time, string) {
	switch {
	case timeout <= 0:
		return time.Time{}, ""
	case !k.Started:
		return k.Connected.Add(timeout), TimeoutFirstMessage
	case !pending:
		return time.Time{}, ""
	case conv != nil && !k.ConvAt.IsZero():
		return k.ConvAt.Add(timeout), TimeoutSASL
	}
	return now.Add(timeout), TimeoutNotLoggedIn
}

// Expired reports why the login rule closes a client the loop holds idle,
// "" when it does not, and how long it waited. now and lastActive (when
// its last request ended) are monotonic readings on PartAt's clock, wall
// the wall clock; partial says the read window holds bytes.
func (k *Clock) Expired(pending bool, conv *auth.Conversation, partial bool, now, lastActive time.Duration, wall time.Time, timeout time.Duration) (reason string, waited time.Duration) {
	if timeout <= 0 {
		return "", 0
	}
	if at := k.PartAt; at > 0 && partial && now-at > timeout {
		return TimeoutPartialMessage, now - at
	}
	switch {
	case !k.Started:
		// The goroutine reads a client's first message; kept for safety.
		if d := wall.Sub(k.Connected); d > timeout {
			return TimeoutFirstMessage, d
		}
	case !pending:
	case conv != nil && !k.ConvAt.IsZero():
		if d := wall.Sub(k.ConvAt); d > timeout {
			return TimeoutSASL, d
		}
	default:
		if d := now - lastActive; d > timeout {
			return TimeoutNotLoggedIn, d
		}
	}
	return "", 0
}

// Wait is the deadline of one read on a client's goroutine: the wait for a
// message, then the wait for the rest of one begun.
type Wait struct {
	Armed    bool          // Clock.Armed was set for this wait
	Timeout  time.Duration // client_login_timeout in force
	Since    time.Time     // when the wait began (zero: no deadline needed then)
	PartAt   time.Time     // when the message began, zero before
	Deadline time.Time     // the deadline computed, zero for none
	ByLogin  bool          // Deadline is the login rule's, not client_idle_timeout's
	Why      string        // the login reason of Deadline
}

// Compute computes w.Deadline at now from w.Timeout and idle (the
// client's client_idle_timeout, 0 for none): for the wait for a message,
// the idle timeout's and the login rule's, whichever is first; for the
// rest of a message begun, client_login_timeout (or the idle timeout if
// shorter) from its first byte, or the login rule's deadline if first.
// pending and conv are the client's login state, as for Deadline.
func (w *Wait) Compute(now time.Time, idle time.Duration, k *Clock, pending bool, conv *auth.Conversation) {
	needLogin := w.Timeout > 0 && (!k.Started || pending)
	w.Deadline, w.ByLogin, w.Why = time.Time{}, false, ""
	if w.Since.IsZero() && (idle > 0 || needLogin || !w.PartAt.IsZero()) {
		w.Since = now
	}
	if w.PartAt.IsZero() {
		if idle > 0 {
			w.Deadline = w.Since.Add(idle)
		}
	} else {
		bound, byLogin := w.Timeout, true
		if idle > 0 && (bound <= 0 || idle < bound) {
			bound, byLogin = idle, false
		}
		if bound > 0 {
			w.Deadline, w.ByLogin = w.PartAt.Add(bound), byLogin
			if byLogin {
				w.Why = TimeoutPartialMessage
			}
		}
	}
	if needLogin {
		k.NoteConv(conv)
		login, why := k.Deadline(pending, conv, w.Since, w.Timeout)
		if !login.IsZero() && (w.Deadline.IsZero() || !login.After(w.Deadline)) {
			w.Deadline, w.ByLogin, w.Why = login, true, why
		}
	}
}

// Waited returns how long the client waited at now when w's login
// deadline closed it: from what its reason counts from.
func (w *Wait) Waited(now time.Time, k *Clock) time.Duration {
	switch w.Why {
	case TimeoutFirstMessage:
		return now.Sub(k.Connected)
	case TimeoutSASL:
		return now.Sub(k.ConvAt)
	case TimeoutPartialMessage:
		return now.Sub(w.PartAt)
	}
	return now.Sub(w.Since)
}
