package metrics

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if a goroutine (a real pool's
// maintenance or establishment goroutine, a load goroutine) outlives them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
