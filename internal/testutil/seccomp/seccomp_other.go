//go:build !linux || !(amd64 || arm64)

package seccomp

import "testing"

// Supported reports whether RefuseIOUring can run here.
const Supported = false

// RefuseIOUring skips the test: there is no seccomp (or no io_uring) here.
func RefuseIOUring(t *testing.T) bool {
	t.Skip("seccomp filters are installed on linux/amd64 and linux/arm64 only")
	return false
}

// RefuseLargeIOUring skips the test: there is no seccomp (or no io_uring)
// here.
func RefuseLargeIOUring(t *testing.T, maxEntries uint32) bool {
	t.Skip("seccomp filters are installed on linux/amd64 and linux/arm64 only")
	return false
}
