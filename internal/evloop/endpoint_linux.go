package evloop

// What the engine does with one endpoint: the calls its user makes
// (holding Mu), and the one place where an event of a driver meets the
// endpoint and is found still wanted, or not (wanted, and the three
// deliveries below it). A request goes out and its reply comes back so:
//
//	SendRequest(th, u, req, buf) ─► [fused send+receive | write, recvReply] ─► replied ─► Handler.ReplyReceived / Failed
//	RecvReply(th, buf)           ─► recvReply ─► replied (more of the same reply)
//	SendReply(th, msg) | Write   ─► [fused send+receive | write] ; RecvRequest ─► received ─► Handler.RequestReceived
//
// Ownership: an Endpoint belongs to its user's goroutine (Detached) or to
// the loop (any other state), and only the owner reads its socket. On the
// loop, whichever loop thread holds Mu acts for it. An Upstream belongs
// to its user (a pool); the loop borrows its socket through
// syscall.RawConn and registers it with the driver once. Upstream.owner
// names the endpoint whose request is out on it.

import (
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"

	"github.com/mongobouncer/mongobouncer/internal/sysconn"
)

// Upstream is the loop's registration of one upstream connection.
type Upstream struct {
	rc syscall.RawConn
	// owner is the endpoint whose request is out on the connection, nil
	// when the loop has nothing in flight on it.
	owner atomic.Pointer[Endpoint]
	// io is used by the owner only, under its Mu.
	io rawIO
	// l is the loop that registered the connection; ring and epoll are
	// its registrations with the loop's drivers, set once, before the
	// Upstream is returned (AttachUpstream).
	l     *Loop
	ring  *ringUp
	epoll *epollUp
}

// Attach registers the endpoint's socket, fd (a descriptor the loop owns
// from now on), with the loop, holding Mu. The endpoint stays Detached
// until its user hands it over (Enter).
func (l *Loop) Attach(ep *Endpoint, fd int) error {
	d := l.drv
	if l.adapt != nil {
		d = l.adapt.pick()
	}
	reg, err := d.attachClient(ep, fd)
	if err != nil {
		return err
	}
	ep.reg = reg
	ep.lp.l, ep.lp.drv = l, d
	return nil
}

// AttachConn attaches ep to l on a duplicate of nc's socket (nc stays its
// user's to close): the endpoint's user hands its goroutine's connection
// over. On failure nothing is left open.
func (l *Loop) AttachConn(ep *Endpoint, nc net.Conn) error {
	fd, err := sysconn.Dup(nc)
	if err != nil {
		return err
	}
	if err := l.Attach(ep, fd); err != nil {
		_ = syscall.Close(fd)
		return err
	}
	return nil
}

// Conn makes a net.Conn (in Go's netpoller) of a duplicate of ep's
// descriptor, for its user's goroutine to serve it again.
func (ep *Endpoint) Conn() (net.Conn, error) {
	d, err := sysconn.DupFd(ep.Fd())
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(d), "client")
	defer f.Close()
	return net.FileConn(f)
}

// Enter hands an attached endpoint from its user's goroutine to the loop,
// Idle, holding Mu: its socket may hold bytes whose readiness has passed,
// which the user serves next (it calls RecvRequest when it needs more).
func (ep *Endpoint) Enter() {
	ep.reg.entered()
	ep.State = Idle
}

// Fd is the loop's descriptor of the endpoint's socket, -1 when it has none.
func (ep *Endpoint) Fd() int {
	if ep.reg == nil {
		return -1
	}
	return ep.reg.fd()
}

// Stopped reports whether the endpoint's loop has stopped: nothing would
// receive its bytes.
func (ep *Endpoint) Stopped() bool { return ep.lp.l == nil || ep.lp.l.stopped.Load() }

// RecvRequest waits for more of the endpoint's next request, holding Mu,
// state Idle: the window is compacted, and Handler.RequestReceived runs
// when bytes come (maybe within this call), with ErrStopped when the loop
// has stopped.
func (ep *Endpoint) RecvRequest(th Thread) {
	ep.Win.Compact()
	if ep.Stopped() {
		ep.h.RequestReceived(th, ErrStopped)
		return
	}
	if a := ep.lp.l.adapt; a != nil {
		if d := a.pick(); d != ep.lp.drv {
			if err := ep.move(d); err != nil {
				ep.h.RequestReceived(th, err)
				return
			}
		}
	}
	ep.lp.drv.recvRequest(th, ep)
}

// SendRequest sends req on u, which the endpoint's user has checked out,
// and waits for the reply into buf (room at its start), holding Mu: the
// endpoint is AwaitReply on u from here until EndReply. req must stay
// untouched until the reply's first bytes come (it may be sent later, with
// the receive, in one submission). A failure reaches Handler.Failed.
func (ep *Endpoint) SendRequest(th Thread, u *Upstream, req, buf []byte) {
	ep.State = AwaitReply
	ep.lp.up, ep.lp.reply = u, buf
	u.owner.Store(ep)
	if a := ep.lp.l.adapt; a != nil {
		ep.lp.sentAt = monoNow()
		if err := a.use(ep.lp.drv, u, ep); err != nil {
			ep.h.Failed(th, "write", err)
			return
		}
	}
	if f, ok := ep.lp.drv.(fusedDriver); ok && !ep.Stopped() && f.sendRequest(th, ep, req) {
		return
	}
	n, err := u.io.writeVia(u.rc, req)
	if err == nil && n < len(req) {
		// A small request that does not fit the socket's send buffer: the
		// upstream has stopped reading.
		err = syscall.EAGAIN
	}
	if err != nil {
		ep.h.Failed(th, "write", err)
		return
	}
	ep.recvReply(th)
}

// RecvReply waits for more of the reply into buf (room at its start),
// holding Mu, state AwaitReply.
func (ep *Endpoint) RecvReply(th Thread, buf []byte) {
	ep.lp.reply = buf
	ep.recvReply(th)
}

func (ep *Endpoint) recvReply(th Thread) {
	if ep.Stopped() {
		ep.h.Failed(th, "read", ErrStopped)
		return
	}
	ep.lp.drv.recvReply(th, ep)
}

// EndReply ends the request out on the endpoint's upstream (its reply is
// whole, or it failed), holding Mu: the upstream is the user's again, and
// the endpoint Busy until its user says otherwise.
func (ep *Endpoint) EndReply() {
	if u := ep.lp.up; u != nil {
		u.owner.Store(nil)
	}
	if ep.lp.sentAt != 0 {
		ep.lp.l.adapt.ended(ep.lp.sentAt, monoNow())
		ep.lp.sentAt = 0
	}
	ep.lp.up, ep.lp.reply = nil, nil
	ep.State = Busy
}

// SendReply sends msg to the endpoint and waits for its next request in
// one submission, when the driver can on thread th and the window is
// empty; it returns false, having done nothing, when it cannot, and the
// user writes msg (Write). The endpoint is Idle once it returns true. The
// user decides whether to try at all: a reply sent so is not known to
// have left when the call returns (a draining server waits for writes).
func (ep *Endpoint) SendReply(th Thread, msg []byte) bool {
	if ep.Stopped() || ep.Win.Len() > 0 {
		return false
	}
	f, ok := ep.lp.drv.(fusedDriver)
	if !ok || !f.sendReply(th, ep, msg) {
		return false
	}
	ep.State = Idle
	return true
}

// Write writes b to the endpoint's socket without blocking, holding Mu; it
// returns how much was written (EAGAIN when the socket took less).
func (ep *Endpoint) Write(b []byte) (int, error) { return writeFd(ep.reg.fd(), b) }

// Close releases the endpoint's registration and descriptor, holding Mu:
// at once, or once a receive in flight on it has ended. flush says to let
// the replies still in the socket out (the user's server is closing).
// The state is the user's to set.
func (ep *Endpoint) Close(flush bool) {
	if ep.reg != nil {
		ep.lp.drv.closeClient(ep, flush)
		ep.reg = nil
	}
}

// Shutdown shuts the endpoint's socket down, so that the receive or write
// in flight on it fails, holding Mu.
func (ep *Endpoint) Shutdown() {
	if fd := ep.Fd(); fd >= 0 {
		_ = syscall.Shutdown(fd, syscall.SHUT_RDWR)
	}
}

// Resume runs a posted result, v and err, under Mu (Loop.Post); the
// user calls it itself, with th nil, for a result the loop refused.
func (ep *Endpoint) Resume(th Thread, v any, err error) {
	ep.Mu.Lock()
	defer ep.Mu.Unlock()
	defer ep.h.Recover()
	ep.h.Resumed(th, v, err)
}

// AttachUpstream returns the loop's registration of the connection whose
// socket rc reaches.
func (l *Loop) AttachUpstream(rc syscall.RawConn) (*Upstream, error) {
	u := &Upstream{rc: rc, l: l}
	var err error
	if cerr := rc.Control(func(fd uintptr) {
		if err = l.drv.attachUpstream(u, int(fd)); err == nil && l.adapt != nil {
			err = l.adapt.lite.attachUpstream(u, int(fd))
		}
	}); cerr != nil {
		err = cerr
	}
	if err != nil {
		u.UpstreamClosed() // releases what was registered
		return nil, err
	}
	return u, nil
}

// UpstreamClosed is called by the connection's Close: a request in flight
// on it must fail, though the close may have dropped the event that would
// have woken the loop. Told twice, it does nothing the second time.
func (u *Upstream) UpstreamClosed() {
	if u.ring != nil {
		u.l.ringDrv().upstreamClosed(u)
	}
	if u.epoll != nil {
		u.l.epollDrv().upstreamClosed(u)
	}
}

// wanted is the one decision whether an event still concerns ep, holding
// Mu: a receive of the next request while ep is Idle, a reply's (u non-nil)
// while ep waits for the reply on u. Anything else is the leftover of a
// state ep has left (closed, handed back, a request that failed): dropped.
func (ep *Endpoint) wanted(d driver, u *Upstream) bool {
	if d != ep.lp.drv {
		// Left over from the driver that served the endpoint before
		// it moved (adapt_linux.go).
		return false
	}
	if u == nil {
		return ep.State == Idle
	}
	return ep.State == AwaitReply && ep.lp.up == u
}

// ready: the endpoint may have bytes (an epoll event, a receive asked of
// its home thread); if still wanted, its user serves it. Holding Mu.
func (ep *Endpoint) ready(d driver, th Thread) {
	if ep.wanted(d, nil) {
		ep.h.RequestReceived(th, nil)
	}
}

// received: n bytes of the next request came into the window's free end,
// or err. Holding Mu.
func (ep *Endpoint) received(d driver, th Thread, n int, err error) {
	if !ep.wanted(d, nil) {
		return
	}
	if err == nil && n <= 0 {
		err = io.EOF
	}
	if err == nil {
		ep.Win.Hi += n
	}
	ep.h.RequestReceived(th, err)
}

// replied: n bytes of the reply on u came into the reply buffer, or err
// in op. Holding Mu.
func (ep *Endpoint) replied(d driver, th Thread, u *Upstream, n int, op string, err error) {
	if !ep.wanted(d, u) {
		return
	}
	if err == nil && n <= 0 {
		err = io.EOF
	}
	if err != nil {
		ep.h.Failed(th, op, err)
		return
	}
	ep.h.ReplyReceived(th, n)
}
