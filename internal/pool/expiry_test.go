package pool_test

// The wait queue's one expiry timer (waitqueue.go): deadlines that do not grow
// along the queue, and a queue whose front leaves before its deadline.

import (
	"errors"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/pool"
)

// A waiter queued after a SetLimits that shortened WaitQueueTimeout has an
// earlier deadline than the waiter in front of it: it must time out at its own
// deadline, and the one in front must not.
func TestWaitQueueTimeoutShortenedBehindLongerDeadline(t *testing.T) {
	o := pool.DefaultOptions()
	o.MaxPoolSize = 1
	o.WaitQueueTimeout = 2 * time.Second
	p, rec := newTestPool(t, &mockConnector{}, o)
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	held, err := p.CheckOut(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	front := newResult()
	if _, queued, err := p.CheckOutFunc(front.done); !queued || err != nil {
		t.Fatal(queued, err)
	}
	short := 40 * time.Millisecond
	if err := p.SetLimits(pool.Limits{MaxPoolSize: 1, MaxConnecting: 2, WaitQueueTimeout: short}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = p.CheckOut(ctxT(t)) // blocks until its own deadline
	waited := time.Since(start)
	var wqt *pool.WaitQueueTimeoutError
	if !errors.As(err, &wqt) || !wqt.Timeout() {
		t.Fatalf("second waiter: %v", err)
	}
	if waited < short || waited > time.Second {
		t.Fatalf("second waiter timed out after %v, want %v (not the front's 2s)", waited, short)
	}
	if front.count() != 0 {
		t.Fatal("the front waiter ended with the second one's deadline")
	}
	if err := p.CheckIn(held); err != nil {
		t.Fatal(err)
	}
	c, err := front.wait(t)
	if err != nil || c == nil {
		t.Fatalf("front waiter: %v, %v", c, err)
	}
	if err := p.CheckIn(c); err != nil {
		t.Fatal(err)
	}
	rec.checkInvariants(t)
}

// Waiters served before their deadline leave the timer armed for a deadline
// nobody has; the waiters behind them still time out at theirs, each no sooner
// than WaitQueueTimeout after it began.
func TestWaitQueueTimeoutAfterFrontServed(t *testing.T) {
	o := pool.DefaultOptions()
	o.MaxPoolSize = 1
	o.WaitQueueTimeout = 60 * time.Millisecond
	p, rec := newTestPool(t, &mockConnector{}, o)
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	held, err := p.CheckOut(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	first := newResult()
	if _, queued, err := p.CheckOutFunc(first.done); !queued || err != nil {
		t.Fatal(queued, err)
	}
	time.Sleep(20 * time.Millisecond)
	second := newResult()
	secondStart := time.Now()
	if _, queued, err := p.CheckOutFunc(second.done); !queued || err != nil {
		t.Fatal(queued, err)
	}
	if err := p.CheckIn(held); err != nil { // serves first, before its deadline
		t.Fatal(err)
	}
	c, err := first.wait(t)
	if err != nil {
		t.Fatal(err)
	}
	_, err = second.wait(t)
	waited := time.Since(secondStart)
	if !errors.As(err, new(*pool.WaitQueueTimeoutError)) || waited < o.WaitQueueTimeout {
		t.Fatalf("second: %v after %v", err, waited)
	}
	if first.count() != 1 || second.count() != 1 {
		t.Fatalf("callbacks %d, %d", first.count(), second.count())
	}
	if err := p.CheckIn(c); err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.Waiters != 0 {
		t.Fatalf("waiters left: %+v", s.Counts)
	}
	rec.checkInvariants(t)
}
