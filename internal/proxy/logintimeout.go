package proxy

// client_login_timeout applied to a client's goroutine: its reads wait
// under a deadline (readWait) that the rule's computation (gate.Wait,
// gate.Clock) gives, and a reload that shortens the timeout wakes them.
// The event loop's idle sweeper asks the same rule for the clients it holds
// (loopClient.loginExpired).

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/gate"
)

// LoginTimeoutObserver is implemented by an Observer that counts the
// clients client_login_timeout closes; reason is one of gate's Timeout*
// constants.
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
		if !c.login.clock.Armed.Load() {
			continue
		}
		c.lc.expireRead()
	}
}

// LoginTimeouts returns how many clients client_login_timeout closed.
func (s *Server) LoginTimeouts() uint64 { return s.loginTimeouts.Load() }

// loginTimedOut logs (on the client's log) and counts a client closed by
// client_login_timeout.
func (s *Server) loginTimedOut(log *slog.Logger, reason string, waited, timeout time.Duration) {
	s.loginTimeouts.Add(1)
	if o, ok := s.opts.Observer.(LoginTimeoutObserver); ok {
		o.ClientLoginTimeout(reason)
	}
	log.Info("client closed: client_login_timeout", "reason", reason,
		"waited", waited.Round(time.Millisecond), "client_login_timeout", timeout)
}

// readWait is one read of a client's goroutine under its deadline: the
// wait for a message, then the wait for the rest of one begun. It holds
// what the deadline uses: the server's timeouts, the socket it is set on,
// the client's login, and the client's log for a close.
type readWait struct {
	gate.Wait
	s   *Server
	cn  *conn
	lg  *login
	log *slog.Logger
}

// startRead sets the read deadline of the wait for a client's next
// message on cn: client_idle_timeout's (idle) and the login rule's,
// whichever is first.
func startRead(s *Server, cn *conn, lg *login, log *slog.Logger, idle time.Duration) readWait {
	w := readWait{s: s, cn: cn, lg: lg, log: log}
	if !lg.clock.Started || lg.pending(s) {
		// Before the timeout is read: a SetLoginTimeout after this sees
		// Armed and wakes the read (see arm).
		lg.clock.Armed.Store(true)
		w.Armed = true
	}
	w.arm(idle)
	return w
}

// arm sets the deadline from the timeouts in force now. For an armed wait
// it reads the login timeout again after setting the deadline: a
// SetLoginTimeout in between may have found the read not started, and
// woken nothing.
func (w *readWait) arm(idle time.Duration) {
	for {
		w.Timeout = time.Duration(w.s.loginTimeout.Load())
		w.Compute(time.Now(), idle, &w.lg.clock, w.lg.pending(w.s), w.lg.Conv)
		w.cn.setDeadline(w.Deadline)
		if !w.Armed || time.Duration(w.s.loginTimeout.Load()) == w.Timeout {
			return
		}
	}
}

// partial bounds the rest of a message whose first bytes have arrived
// (gate.Wait.Compute). Repeated calls for one message do nothing.
func (w *readWait) partial(idle time.Duration) {
	if !w.PartAt.IsZero() {
		return
	}
	w.PartAt = time.Now()
	w.arm(idle)
}

// stillWaiting reports, for the error that ended a read, whether the wait
// goes on: the read deadline passed, but under the timeouts in force now
// (idle; a reload changed them, or SetLoginTimeout woke the read) the
// wait's deadline is later, or there is none.
func (w *readWait) stillWaiting(err error, idle time.Duration) bool {
	if !isTimeout(err) {
		return false
	}
	w.arm(idle)
	if w.Deadline.IsZero() {
		// Cleared for sure: a deadline set by SetLoginTimeout's wake-up
		// is not in cn.deadline, and would end the next read at once.
		_ = w.cn.nc.SetReadDeadline(time.Time{})
		return true
	}
	return time.Now().Before(w.Deadline)
}

// failed turns the error that ended a read into the client's end: a
// deadline of the login rule is logged and counted.
func (w *readWait) failed(err error) error {
	if w.Armed {
		w.lg.clock.Armed.Store(false)
	}
	if !w.ByLogin || !isTimeout(err) {
		return errClientGone
	}
	w.s.loginTimedOut(w.log, w.Why, w.Waited(time.Now(), &w.lg.clock), w.Timeout)
	return errLoginTimeout
}

// done records that a whole message arrived, ending the wait.
func (w *readWait) done() {
	if w.Armed {
		w.lg.clock.Armed.Store(false)
	}
	w.lg.clock.Message(time.Now(), w.lg.pending(w.s))
}

// isTimeout reports whether err is a read deadline's.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// loginExpired reports why the login rule closes a client the loop holds
// idle at now (monoNow), "" when it does not; waited is how long. Holding
// the endpoint's Mu, state lsIdle.
func (lc *loopClient) loginExpired(now time.Duration, timeout time.Duration) (reason string, waited time.Duration) {
	lg := &lc.c.login
	return lg.clock.Expired(lg.pending(lc.c.s), lg.Conv, lc.Win.Hi > lc.Win.Lo, now, lc.lastActive, time.Now(), timeout)
}

// expireRead makes the pending read of a client its goroutine owns return
// now, under the endpoint's Mu (the loop may own it instead).
func (lc *loopClient) expireRead() {
	lc.Mu.Lock()
	defer lc.Mu.Unlock()
	if nc := lc.c.nc; lc.State == lsGoroutine && nc != nil {
		_ = nc.SetReadDeadline(time.Now())
	}
}
