package pool_test

// The wait queue's one expiry timer (waitqueue.go): deadlines that do not grow
// along the queue, and a queue whose front leaves before its deadline.

import (
	"errors"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/pool"
)

// heldWithWaiter returns a ready pool of one connection with
// WaitQueueTimeout wqt, that connection checked out (held), and a
// checkout queued behind it.
func heldWithWaiter(t *testing.T, wqt time.Duration) (*pool.Pool, *recorder, *pool.Conn, *result) {
	t.Helper()
	o := pool.DefaultOptions()
	o.MaxPoolSize = 1
	o.WaitQueueTimeout = wqt
	p, rec := newTestPool(t, &mockConnector{}, o)
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	held, err := p.CheckOut(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	w := newResult()
	if _, queued, err := p.CheckOutFunc(w.done); !queued || err != nil {
		t.Fatal(queued, err)
	}
	return p, rec, held, w
}

// A waiter queued after a SetLimits that shortened WaitQueueTimeout has an
// earlier deadline than the waiter in front of it: it must time out at its own
// deadline, and the one in front must not.
func TestWaitQueueTimeoutShortenedBehindLongerDeadline(t *testing.T) {
	p, rec, held, front := heldWithWaiter(t, 2*time.Second)
	var err error
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
	const wqt = 60 * time.Millisecond
	p, rec, held, first := heldWithWaiter(t, wqt)
	var err error
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
	if !errors.As(err, new(*pool.WaitQueueTimeoutError)) || waited < wqt {
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
