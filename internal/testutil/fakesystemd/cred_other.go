//go:build !linux

// Credentials are passed this way on Linux only.

package fakesystemd

import "net"

func passCred(*net.UnixConn) {}

func credPID([]byte) int { return 0 }
