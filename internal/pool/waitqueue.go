package pool

import (
	"sync"
	"time"
)

// waiterState tracks a checkout that could not be served at once.
type waiterState uint8

const (
	waiterFree   waiterState = iota // not in use (in waiterPool)
	waiterQueued                    // in the wait queue
	waiterBound                     // out of the queue; a pending connection is being established for it
	waiterDone                      // has its result (conn or err)
)

// waiter is one checkout in the wait queue, in the spirit of net/http's wantConn. All
// fields except ch are guarded by Pool.mu. Whoever moves a waiter to waiterDone on
// its behalf sets conn or err and sends exactly one token on ch, or for a waiter of
// CheckOutFunc (which has no goroutine) calls fn instead.
//
// A waiter has no timer of its own: its WaitQueueTimeout is a deadline, kept by
// the pool's one expiry timer (expireWaiters).
type waiter struct {
	prev, next *waiter
	state      waiterState
	start      instant // checkout start, for durations
	deadline   instant // when WaitQueueTimeout fails it while queued; 0: never
	pending    *Conn   // when waiterBound
	conn       *Conn   // result
	err        error   // result
	ch         chan struct{}

	fn func(*Conn, error) // CheckOutFunc's callback; nil for CheckOut
}

var waiterPool = sync.Pool{New: func() any { return &waiter{ch: make(chan struct{}, 1)} }}

func getWaiter() *waiter { return waiterPool.Get().(*waiter) }

// putWaiter recycles w. The caller guarantees nobody references it any more: it is
// out of the queue, not bound, and its channel token (if any) has been received.
func putWaiter(w *waiter) {
	w.prev, w.next, w.pending, w.conn, w.err = nil, nil, nil, nil, nil
	w.fn = nil
	w.state = waiterFree
	w.start, w.deadline = 0, 0
	waiterPool.Put(w)
}

// enqueueLocked puts w, which began waiting at w.start, at the back of the queue,
// with its WaitQueueTimeout as a deadline.
//
// One timer serves the whole queue, armed for the earliest deadline. Every waiter
// gets the same WaitQueueTimeout (until SetLimits changes it), so deadlines grow
// along the queue, and a newcomer's is almost never the earliest: it then costs
// no timer operation at all. A per-waiter timer cost a Reset and a Stop on the
// runtime's timer heap per wait, as much as the rest of the hand-off.
func (p *Pool) enqueueLocked(w *waiter) {
	w.state = waiterQueued
	if wqt := p.opts.WaitQueueTimeout; wqt > 0 {
		w.deadline = w.start + instant(wqt)
		p.armExpiryLocked(w.deadline, w.start)
	}
	p.queue.pushBack(w)
}

// armExpiryLocked makes sure the expiry timer fires by deadline; now is the
// current instant.
func (p *Pool) armExpiryLocked(deadline, now instant) {
	if p.expiryAt != 0 && p.expiryAt <= deadline {
		return
	}
	p.expiryAt = deadline
	d := deadline.sub(now)
	if p.expiry == nil {
		p.expiry = time.AfterFunc(d, p.expireWaiters)
		return
	}
	p.expiry.Reset(d)
}

// expireWaiters is the expiry timer's function: it fails every queued waiter whose
// deadline has passed, in queue order, and arms the timer for the earliest
// deadline left. A waiter that left the queue (served, bound to a pending
// connection, gave up) is not in the queue to be found, so a timer that fires for
// a deadline nobody has any more costs one walk of the queue and nothing else.
func (p *Pool) expireWaiters() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.expiryAt = 0
	if p.state == StateClosed {
		return
	}
	now := monoNow()
	var next instant
	expired := false
	for w := p.queue.front(); w != nil; {
		nw := w.next
		switch {
		case w.deadline == 0:
		case w.deadline <= now:
			p.failWaiterLocked(w, ReasonTimeout, p.timeoutErrLocked(nil, w.start))
			expired = true
		case next == 0 || w.deadline < next:
			next = w.deadline
		}
		w = nw
	}
	if next != 0 {
		p.armExpiryLocked(next, now)
	}
	if expired {
		p.dispatchLocked()
	}
}

// waitQueue is an intrusive FIFO of waiters with O(1) removal from anywhere (a
// timed-out waiter leaves at once, as the spec requires). Guarded by Pool.mu.
type waitQueue struct {
	head, tail *waiter
	n          int
}

func (q *waitQueue) front() *waiter { return q.head }

func (q *waitQueue) pushBack(w *waiter) {
	w.prev, w.next = q.tail, nil
	if q.tail != nil {
		q.tail.next = w
	} else {
		q.head = w
	}
	q.tail = w
	q.n++
}

func (q *waitQueue) remove(w *waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		q.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		q.tail = w.prev
	}
	w.prev, w.next = nil, nil
	q.n--
}

// detach empties the queue and returns its former head; the waiters stay linked
// through next, in order.
func (q *waitQueue) detach() *waiter {
	h := q.head
	*q = waitQueue{}
	return h
}
