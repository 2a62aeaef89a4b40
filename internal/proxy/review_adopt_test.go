package proxy

import (
	"io"
	"log/slog"
	"testing"
	"time"
)

// Review hazard: lockOrAdopt takes "still held after lockWait" for "left
// held by the panicking frame". A lock held that long by another goroutine
// (a stalled holder: a log write to a blocked stderr, a descheduled
// thread) is adopted too: the recovery then runs, and unlocks, under a
// lock another goroutine holds, and that holder's own Unlock is the fatal
// "sync: unlock of unlocked mutex" (not recoverable): the process, not
// one client, ends. Here a holder keeps sessMu 1.5 s; releaseRequest, as
// a recovery runs it, returns meanwhile having unlocked the holder's lock.
func TestReviewAdoptsLockHeldByAnotherGoroutine(t *testing.T) {
	c := authClient(t)
	c.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	held := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.sessMu.Lock()
		close(held)
		time.Sleep(1500 * time.Millisecond)
		// The holder would Unlock here: fatal after the adoption. The test
		// leaves it locked or unlocked as the recovery left it.
	}()
	<-held
	start := time.Now()
	c.releaseRequest()
	took := time.Since(start)
	select {
	case <-done:
	default:
		t.Errorf("the recovery went on after %v under sessMu while another goroutine still held it (it adopted a lock no panicking frame left held)", took.Round(time.Millisecond))
	}
	<-done
}
