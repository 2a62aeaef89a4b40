package evloop

// The io_uring threads' spin counters (spin_linux.go), which the user
// keeps so that they outlive a loop; they build everywhere.

import "sync/atomic"

// SpinCounts counts the io_uring threads' spins: replies a spin caught,
// and spins that ended without one. The user keeps them, so that they
// outlive a loop.
type SpinCounts struct {
	Caught, Missed atomic.Uint64
}
