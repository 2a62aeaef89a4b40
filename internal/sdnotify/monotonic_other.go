//go:build !linux

// systemd runs on Linux only: elsewhere there is no MONOTONIC_USEC=.

package sdnotify

func monotonicUsec() (uint64, bool) { return 0, false }
