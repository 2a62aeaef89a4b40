package evloop

// Which driver serves an endpoint on a loop that has both (IOAdaptive, the
// default where io_uring is allowed): epoll while the load is light,
// io_uring once it is not.
//
// Why (docs/performance.md, issue 30 item 5): with one request at a time
// there is nothing to batch, and io_uring costs more per request than
// epoll: a thread sleeping in io_uring_enter is woken to run the receive as
// task work, where epoll's thread wakes from epoll_wait and makes one read.
// At one client the epoll loop's added latency and CPU per request are
// HAProxy's (whose loop is the same), and io_uring's are higher, with or
// without the spin (spin_linux.go), which buys latency with CPU. Under load
// io_uring is the cheaper driver: one io_uring_enter submits a batch of
// receives and sends and collects a batch of completions, where epoll makes
// a read per socket and a write per send. No single choice is best at both
// ends, and a pooler's load moves (a sidecar idles most of the day), so the
// loop measures its load and moves endpoints between the drivers as it
// changes, rather than deciding once at startup.
//
// The loop has as many epoll threads as io_uring threads, the ones idle
// while the others serve: epoll alone can use every core, so a load the
// measure below misjudges (a proxy saturated by requests that spend little
// time out) costs efficiency, never capacity.
//
// The load is the mean number of requests out at the upstreams over a
// window: the time requests spent between SendRequest and EndReply, summed
// over the window, divided by its length (Little's law). The engine
// measures it itself, so it needs nothing from its user. One client's
// requests, one at a time, give under 1 (its request spends part of each
// round trip in the client and in the proxy: 0.6 against the load tool's
// stub upstream), four such clients about 2, ten over a pool of ten 4 to
// 7, a hundred over that pool 9 to 10. From hiLoad up the loop serves on
// io_uring, from loLoad down on epoll; between the marks nothing changes, the hysteresis that
// keeps a load near one mark from moving endpoints back and forth. A
// window in which no request ended keeps the choice until one ends it: an
// idle loop's choice costs nothing either way.
//
// An endpoint moves only where it has nothing in flight on either driver:
// when its user asks for its next request (Endpoint.RecvRequest) and no
// receive is armed for it. Its descriptor leaves one driver's registration
// (detachClient: out of the epoll set, or out of its ring thread's count)
// and joins the other's; bytes already in the socket are read by the new
// driver's first receive. Upstream connections are the pool's, shared by
// endpoints of both drivers: each has an io_uring registration (a
// duplicate descriptor, which costs nothing while no receive is armed) and
// is in the epoll set only while an endpoint served by epoll uses it
// (adapter.use), so that replies to requests sent on io_uring never wake
// the epoll thread.

import (
	"sync/atomic"
	"time"
)

const (
	// adaptWindow is the span the load is measured over: hundreds of
	// requests at the rates where the choice matters, and a change of load
	// is followed within a fraction of a second.
	adaptWindow = 100 * time.Millisecond
	// hiLoad and loLoad, in thousandths of a request out: io_uring from
	// three requests out on average, epoll again from one and a half
	// down. The gap is twice the scatter of a steady load's windows.
	hiLoad = 3000
	loLoad = 1500
)

// adapter is a loop's choice between its two drivers. Every field is an
// atomic: any thread reads the choice, and whichever ends a request
// rolls the window.
type adapter struct {
	lite  *epollDriver
	heavy *ringDriver
	// onHeavy is the choice: io_uring when set.
	onHeavy atomic.Bool
	// busy is the time (ns) requests of this window spent out; start is
	// the window's start (monoNow).
	busy  atomic.Int64
	start atomic.Int64
	// load is the last window's load, in thousandths; moves counts
	// endpoints moved between the drivers, switches the choice's changes.
	load     atomic.Int64
	moves    atomic.Uint64
	switches atomic.Uint64
}

// pick is the driver an endpoint should be served by now.
func (a *adapter) pick() driver {
	if a.onHeavy.Load() {
		return a.heavy
	}
	return a.lite
}

// ended adds a request's time out (from sentAt to now) and, once the
// window has passed, ends it: the load decides the choice.
func (a *adapter) ended(sentAt, now time.Duration) {
	a.busy.Add(int64(now - sentAt))
	s := a.start.Load()
	span := int64(now) - s
	if span < int64(adaptWindow) || !a.start.CompareAndSwap(s, int64(now)) {
		return
	}
	load := a.busy.Swap(0) * 1000 / span
	a.load.Store(load)
	switch heavy := a.onHeavy.Load(); {
	case !heavy && load >= hiLoad:
		a.onHeavy.Store(true)
		a.switches.Add(1)
	case heavy && load <= loLoad:
		a.onHeavy.Store(false)
		a.switches.Add(1)
	}
}

// use readies upstream u for a request of endpoint ep, served by d: in
// ep's epoll set when d is epoll (join), out of every set otherwise. The
// caller has u checked out, so no other endpoint uses it meanwhile.
func (a *adapter) use(d driver, u *Upstream, ep *Endpoint) error {
	if d == driver(a.lite) {
		return a.lite.join(u, ep)
	}
	a.lite.leave(u)
	return nil
}

// move serves the endpoint by driver to from now on, when it can leave its
// driver now (no receive armed); it holds Mu, state Idle. A registration
// that fails on epoll (epoll_ctl) leaves it on io_uring, whose cannot; an
// error means neither took it back, and the endpoint has no socket left.
func (ep *Endpoint) move(to driver) error {
	from := ep.lp.drv
	fd, ok := from.detachClient(ep)
	if !ok {
		return nil
	}
	reg, err := to.attachClient(ep, fd)
	if err != nil {
		to = from
		if reg, err = from.attachClient(ep, fd); err != nil {
			ep.reg = nil
			closeFds(fd)
			return err
		}
	}
	ep.reg, ep.lp.drv = reg, to
	reg.entered()
	ep.lp.l.adapt.moves.Add(1)
	return nil
}

// Adaptive reports the choice of a loop on IOAdaptive; ok is false on a
// loop of one driver.
func (l *Loop) Adaptive() (s AdaptiveStats, ok bool) {
	a := l.adapt
	if a == nil {
		return s, false
	}
	return AdaptiveStats{OnIOUring: a.onHeavy.Load(), Load: float64(a.load.Load()) / 1000,
		Switches: a.switches.Load(), Moves: a.moves.Load()}, true
}
