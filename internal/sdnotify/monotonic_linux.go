// The clock systemd compares MONOTONIC_USEC= with: CLOCK_MONOTONIC.

package sdnotify

import (
	"syscall"
	"unsafe"
)

// clockMonotonic is CLOCK_MONOTONIC in <time.h>.
const clockMonotonic = 1

// monotonicUsec reads CLOCK_MONOTONIC in microseconds. time.Now's
// monotonic reading is relative to the process, not the boot, so it cannot
// stand in.
func monotonicUsec() (uint64, bool) {
	var ts syscall.Timespec
	if _, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockMonotonic, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		return 0, false
	}
	return uint64(ts.Sec)*1_000_000 + uint64(ts.Nsec)/1000, true
}
