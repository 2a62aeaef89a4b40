package session

// Every test leaves no goroutine behind (the pools the tests make are
// closed by their cleanups).

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
