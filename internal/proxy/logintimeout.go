package proxy

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
// has logged in, is governed by client_idle_timeout only. A client's
// goroutine enforces the rule with read deadlines (readWait, set by read);
// the event loop's idle sweeper enforces it for the clients the loop holds
// (loopClient.loginExpired).

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/auth"
)

// Reasons a client is closed by client_login_timeout, as logged and as
// LoginTimeoutObserver hears them (a bounded set: metric labels).
const (
	// LoginTimeoutFirstMessage: no whole first message in time.
	LoginTimeoutFirstMessage = "first_message"
	// LoginTimeoutTLSHandshake: the TLS handshake did not end in time.
	LoginTimeoutTLSHandshake = "tls_handshake"
	// LoginTimeoutNotLoggedIn: not logged in, and silent that long.
	LoginTimeoutNotLoggedIn = "not_logged_in"
	// LoginTimeoutSASL: a SASL conversation did not finish in time.
	LoginTimeoutSASL = "sasl_conversation"
	// LoginTimeoutPartialMessage: a message begun was not whole in time.
	LoginTimeoutPartialMessage = "partial_message"
)

// LoginTimeoutObserver is implemented by an Observer that counts the
// clients client_login_timeout closes; reason is one of the
// LoginTimeout* constants.
type LoginTimeoutObserver interface {
	ClientLoginTimeout(reason string)
}

// errLoginTimeout ends a client closed by client_login_timeout. It wraps
// errClientGone: the close was logged already.
var errLoginTimeout = fmt.Errorf("client_login_timeout: %w", errClientGone)

// SetLoginTimeout changes client_login_timeout live (configuration
// reload), for connected clients too; 0 turns it off. The loop's sweeper
// reads it at each sweep; a client's goroutine at each wait for a message,
// and again when its read deadline passes (so a longer timeout holds at
// once). A shorter one must not wait for the deadlines set under the
// longer: the goroutines waiting under the login rule are woken to set
// theirs again, and the sweeper to sweep at the new one's pace.
func (s *Server) SetLoginTimeout(d time.Duration) {
	d = max(d, 0)
	old := time.Duration(s.loginTimeout.Swap(int64(d)))
	if d == 0 || old != 0 && d >= old {
		return
	}
	select {
	case s.sweepKick <- struct{}{}:
	default:
	}
	for _, c := range s.snapshot() {
		if !c.login.clock.armed.Load() {
			continue
		}
		c.expireRead()
	}
}

// LoginTimeouts returns how many clients client_login_timeout closed.
func (s *Server) LoginTimeouts() uint64 { return s.loginTimeouts.Load() }

// loginClock is what the login rule remembers of a client. Owned by whoever
// serves the client, like the reads, but armed.
type loginClock struct {
	// armed is set while the client's goroutine waits for a message under
	// the login rule: SetLoginTimeout wakes it.
	armed atomic.Bool
	// started is set once a whole message has arrived.
	started bool
	// conv is the SASL conversation convAt is the start of: a saslStart
	// (or a hello's speculativeAuthenticate) replaces c.login.conv.
	conv   *auth.Conversation
	convAt time.Time
	// msgAt is when the last whole message arrived, kept only while the
	// client has not logged in (auth on).
	msgAt time.Time
	// partAt (monoNow) is when the loop saw the first bytes of the message
	// now in the read window, 0 when it holds no partial message.
	partAt time.Duration
}

// noteMessage records that a whole message arrived, ending the wait w.
func (c *client) noteMessage(w *readWait) {
	if w.armed {
		c.login.clock.armed.Store(false)
	}
	c.login.clock.started = true
	if c.preLogin() {
		c.login.clock.msgAt = time.Now()
	}
}

// noteConv records the start of a conversation begun since the last call:
// the message that began it is the last one read.
func (lg *login) noteConv() {
	if lg.conv != lg.clock.conv {
		lg.clock.conv = lg.conv
		lg.clock.convAt = lg.clock.msgAt
	}
}

// deadline returns when the login rule closes a client (connected then,
// logging in to s) waiting from now for its next message, and why; zero
// when the rule does not apply.
func (lg *login) deadline(s *Server, connected, now time.Time, timeout time.Duration) (time.Time, string) {
	switch {
	case timeout <= 0:
		return time.Time{}, ""
	case !lg.clock.started:
		return connected.Add(timeout), LoginTimeoutFirstMessage
	case !lg.pending(s):
		return time.Time{}, ""
	case lg.conv != nil && !lg.clock.convAt.IsZero():
		return lg.clock.convAt.Add(timeout), LoginTimeoutSASL
	}
	return now.Add(timeout), LoginTimeoutNotLoggedIn
}

// readWait is the deadline of one read: the wait for a message, then the
// wait for the rest of one begun.
type readWait struct {
	armed    bool          // lt.armed was set for this wait
	timeout  time.Duration // client_login_timeout in force
	since    time.Time     // when the wait began (zero: no deadline needed then)
	partAt   time.Time     // when the message began, zero before
	deadline time.Time     // the deadline set, zero for none
	byLogin  bool          // deadline is the login rule's, not client_idle_timeout's
	why      string        // the login reason of deadline
}

// armRead sets the read deadline of the wait for the client's next
// message: client_idle_timeout's and the login rule's, whichever is first.
func (c *client) armRead() readWait {
	var w readWait
	if !c.login.clock.started || c.preLogin() {
		// Before the timeout is read: a SetLoginTimeout after this sees
		// armed and wakes the read (see armDeadline).
		c.login.clock.armed.Store(true)
		w.armed = true
	}
	c.armDeadline(&w)
	return w
}

// armDeadline sets w's deadline from the timeouts in force now. For an
// armed wait it reads the login timeout again after setting the deadline:
// a SetLoginTimeout in between may have found the read not started, and
// woken nothing.
func (c *client) armDeadline(w *readWait) {
	for {
		w.timeout = time.Duration(c.s.loginTimeout.Load())
		c.computeDeadline(w)
		c.setDeadline(w.deadline)
		if !w.armed || time.Duration(c.s.loginTimeout.Load()) == w.timeout {
			return
		}
	}
}

// computeDeadline computes w.deadline from w.timeout and the client's
// client_idle_timeout: for the wait for a message, the idle timeout's and
// the login rule's, whichever is first; for the rest of a message begun,
// client_login_timeout (or client_idle_timeout if shorter) from its first
// byte, or the login rule's deadline if first.
func (c *client) computeDeadline(w *readWait) {
	idle := c.idleTimeout()
	needLogin := w.timeout > 0 && (!c.login.clock.started || c.preLogin())
	w.deadline, w.byLogin, w.why = time.Time{}, false, ""
	if w.since.IsZero() && (idle > 0 || needLogin || !w.partAt.IsZero()) {
		w.since = time.Now()
	}
	if w.partAt.IsZero() {
		if idle > 0 {
			w.deadline = w.since.Add(idle)
		}
	} else {
		bound, byLogin := w.timeout, true
		if idle > 0 && (bound <= 0 || idle < bound) {
			bound, byLogin = idle, false
		}
		if bound > 0 {
			w.deadline, w.byLogin = w.partAt.Add(bound), byLogin
			if byLogin {
				w.why = LoginTimeoutPartialMessage
			}
		}
	}
	if needLogin {
		c.login.noteConv()
		login, why := c.login.deadline(c.s, c.connected, w.since, w.timeout)
		if !login.IsZero() && (w.deadline.IsZero() || !login.After(w.deadline)) {
			w.deadline, w.byLogin, w.why = login, true, why
		}
	}
}

// partialDeadline bounds the rest of a message whose first bytes have
// arrived (computeDeadline). Repeated calls for one message do nothing.
func (c *client) partialDeadline(w *readWait) {
	if !w.partAt.IsZero() {
		return
	}
	w.partAt = time.Now()
	c.armDeadline(w)
}

// stillWaiting reports, for the error that ended a read, whether the wait
// goes on: the read deadline passed, but under the timeouts in force now
// (a reload changed them, or SetLoginTimeout woke the read) the wait's
// deadline is later, or there is none.
func (c *client) stillWaiting(w *readWait, err error) bool {
	if !isTimeout(err) {
		return false
	}
	c.armDeadline(w)
	if w.deadline.IsZero() {
		// Cleared for sure: a deadline set by SetLoginTimeout's wake-up
		// is not in c.deadline, and would end the next read at once.
		_ = c.nc.SetReadDeadline(time.Time{})
		return true
	}
	return time.Now().Before(w.deadline)
}

// readFailed turns the error that ended a read into the client's end: a
// deadline of the login rule is logged and counted.
func (c *client) readFailed(w *readWait, err error) error {
	if w.armed {
		c.login.clock.armed.Store(false)
	}
	if !w.byLogin || !isTimeout(err) {
		return errClientGone
	}
	var waited time.Duration
	switch w.why {
	case LoginTimeoutFirstMessage:
		waited = time.Since(c.connected)
	case LoginTimeoutSASL:
		waited = time.Since(c.login.clock.convAt)
	case LoginTimeoutPartialMessage:
		waited = time.Since(w.partAt)
	default:
		waited = time.Since(w.since)
	}
	c.loginTimedOut(w.why, waited, w.timeout)
	return errLoginTimeout
}

// isTimeout reports whether err is a read deadline's.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// loginTimedOut logs and counts a client closed by client_login_timeout.
func (c *client) loginTimedOut(reason string, waited, timeout time.Duration) {
	c.s.loginTimeouts.Add(1)
	if o, ok := c.s.opts.Observer.(LoginTimeoutObserver); ok {
		o.ClientLoginTimeout(reason)
	}
	c.log.Info("client closed: client_login_timeout", "reason", reason,
		"waited", waited.Round(time.Millisecond), "client_login_timeout", timeout)
}

// loginExpired reports why the login rule closes a client the loop holds
// idle at now (monoNow), "" when it does not; waited is how long. Holding
// ownMu, state lsIdle.
func (lc *loopClient) loginExpired(now time.Duration, timeout time.Duration) (reason string, waited time.Duration) {
	c := lc.c
	if timeout <= 0 {
		return "", 0
	}
	if at := c.login.clock.partAt; at > 0 && c.lc.Win.Hi > c.lc.Win.Lo && now-at > timeout {
		return LoginTimeoutPartialMessage, now - at
	}
	switch {
	case !c.login.clock.started:
		// The goroutine reads a client's first message; kept for safety.
		if d := time.Since(c.connected); d > timeout {
			return LoginTimeoutFirstMessage, d
		}
	case !c.preLogin():
	case c.login.conv != nil && !c.login.clock.convAt.IsZero():
		if d := time.Since(c.login.clock.convAt); d > timeout {
			return LoginTimeoutSASL, d
		}
	default:
		if d := now - c.lc.lastActive; d > timeout {
			return LoginTimeoutNotLoggedIn, d
		}
	}
	return "", 0
}

// notePartial records, as the loop waits for more of the client's bytes,
// whether the read window holds the start of a message (pending bytes)
// and since when.
func (k *loginClock) notePartial(pending int) {
	switch {
	case pending == 0:
		k.partAt = 0
	case k.partAt == 0:
		k.partAt = monoNow()
	}
}

// expireRead makes the pending read of a client its goroutine owns return
// now, under ownMu (the loop may own it instead).
func (c *client) expireRead() {
	c.lc.Mu.Lock()
	defer c.lc.Mu.Unlock()
	if c.lc.State == lsGoroutine && c.nc != nil {
		_ = c.nc.SetReadDeadline(time.Now())
	}
}
