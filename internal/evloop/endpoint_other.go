//go:build !linux

package evloop

// Without the loop (not Linux) an Endpoint is only its lock, state and
// read window: its user's goroutine serves it throughout.

// registration is never made here.
type registration interface{}

// loopPart is empty here.
type loopPart struct{}
