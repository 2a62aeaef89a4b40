package proxy

// How the panic recovery takes the client's locks (recover.go): it waits
// for another goroutine's critical section, never takes its lock over, and
// leaves none held when its own clean-up panics too.

import (
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A recovery that finds a lock of the client's held by another goroutine,
// for longer than a second even (a stalled holder: a log write to a
// blocked stderr, a descheduled thread), waits for it, and does not take
// it over: taken over, the recovery would go on, and unlock, under a lock
// another goroutine holds, and that holder's own Unlock would be the fatal
// "sync: unlock of unlocked mutex" (not recoverable), ending the process,
// not one client. Here a holder keeps sessMu 1.5 s while releaseAfterPanic,
// as a recovery runs it, needs it.
func TestRecoveryWaitsForALockAnotherGoroutineHolds(t *testing.T) {
	c := authClient(t)
	c.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	var returned atomic.Bool // releaseAfterPanic has returned
	var released atomic.Bool // set by the holder before its Unlock: the lock orders it before the recovery's Lock
	held := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.sess.Mu.Lock()
		close(held)
		time.Sleep(1500 * time.Millisecond)
		if returned.Load() {
			// The recovery went on under this lock and unlocked it: this
			// Unlock would be fatal. Leave it as the recovery left it.
			return
		}
		released.Store(true)
		c.sess.Mu.Unlock()
	}()
	<-held
	start := time.Now()
	c.x.releaseAfterPanic()
	returned.Store(true)
	took := time.Since(start)
	if !released.Load() {
		t.Errorf("the recovery went on after %v under sessMu while another goroutine still held it (it took over a lock no panicking frame held)", took.Round(time.Millisecond))
	}
	<-done
	if !c.sess.Mu.TryLock() {
		t.Fatal("sessMu is left held")
	}
	c.sess.Mu.Unlock()
}

// A goroutine's recovery that ends a client the loop's state says it does
// not own (releaseOwned, under ownMu) and panics there too leaves ownMu
// unlocked: afterPanic catches the second panic, and the client's next
// loop callback, or Server.Close, can still take the lock.
func TestPanicInReleaseOwnedLeavesOwnMuUnlocked(t *testing.T) {
	c := authClient(t)
	var logs strings.Builder // written by the goroutine, read after done
	c.log = slog.New(slog.NewTextHandler(&logs, nil))
	c.lc.State = lsClosed // finish closed it before the panic
	hook := func(at, _ string) {
		if at == "release-loop-owned" {
			panic("test panic in releaseOwned")
		}
	}
	testPanicHook.Store(&hook)
	t.Cleanup(func() { testPanicHook.Store(nil) })
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer c.recoverGoroutine()
		panic("test panic while serving")
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the recovery did not return")
	}
	if c.s.Panics() != 1 {
		t.Fatalf("Panics() = %d, want 1", c.s.Panics())
	}
	if !strings.Contains(logs.String(), "test panic in releaseOwned") {
		t.Fatalf("releaseOwned did not panic; log:\n%s", logs.String())
	}
	if !c.lc.Mu.TryLock() {
		t.Fatalf("ownMu is left held after a panic in the recovery; log:\n%s", logs.String())
	}
	c.lc.Mu.Unlock()
}
