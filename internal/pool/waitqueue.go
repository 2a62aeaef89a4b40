package pool

import (
	"sync"
	"sync/atomic"
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
// fields except ch, timer, pool and expiry are guarded by Pool.mu. Whoever moves a
// waiter to waiterDone on its behalf sets conn or err and sends exactly one token on
// ch; the waiter itself may also finish (timeout) without a token.
//
// A waiter of CheckOutFunc has no goroutine: fn takes the place of ch, and expiry, a
// timer whose function is the waiter's own expire, the place of the waiting
// goroutine's timeout.
type waiter struct {
	prev, next *waiter
	state      waiterState
	start      instant // checkout start, for durations
	pending    *Conn   // when waiterBound
	conn       *Conn   // result
	err        error   // result
	ch         chan struct{}
	timer      *time.Timer // reused WaitQueueTimeout timer (owned by the waiting goroutine)

	fn     func(*Conn, error)   // CheckOutFunc's callback; nil for CheckOut
	pool   atomic.Pointer[Pool] // CheckOutFunc: the pool, for expire (waiters are shared by pools)
	expiry *time.Timer          // CheckOutFunc: reused WaitQueueTimeout timer running expire
	armed  bool                 // expiry was started for this use
}

var waiterPool = sync.Pool{New: func() any { return &waiter{ch: make(chan struct{}, 1)} }}

func getWaiter() *waiter { return waiterPool.Get().(*waiter) }

// putWaiter recycles w. The caller guarantees nobody references it any more: it is
// out of the queue, not bound, and its channel token (if any) has been received.
func putWaiter(w *waiter) {
	if w.timer != nil {
		w.timer.Stop()
	}
	w.prev, w.next, w.pending, w.conn, w.err = nil, nil, nil, nil, nil
	w.fn, w.armed = nil, false
	w.pool.Store(nil)
	w.state = waiterFree
	w.start = 0
	waiterPool.Put(w)
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
