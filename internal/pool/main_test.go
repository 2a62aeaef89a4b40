package pool_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine (a pool's maintenance,
// establishment or socket-closing goroutine, a fake server's) outlives them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
