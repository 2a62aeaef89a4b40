package routing

// Every test leaves no goroutine behind (the topologies the tests start
// are closed by their cleanups).

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
