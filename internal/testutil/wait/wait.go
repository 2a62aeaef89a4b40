// Package wait is the tests' polling helper: one loop for every package
// that waits for a condition another goroutine or process brings about.
package wait

import (
	"testing"
	"time"
)

// Until polls cond every interval until it holds, and fails the test with
// "timed out waiting for what" once timeout has passed without it.
func Until(t testing.TB, what string, timeout, interval time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(interval)
	}
}
