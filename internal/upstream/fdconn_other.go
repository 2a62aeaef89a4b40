//go:build !linux

package upstream

import "net"

// detach keeps nc as it is where there is no event loop to hand it to.
func detach(nc net.Conn) (net.Conn, bool) { return nil, false }
