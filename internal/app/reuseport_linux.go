// Listening sockets with SO_REUSEPORT (so_reuseport): a new mongobouncer
// binds the addresses the old one still holds, so an upgrade on one host
// refuses no connection (docs/operations.md).

package app

import (
	"context"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// listen binds network/address, with SO_REUSEPORT set before bind when
// reuseport is true and the network is TCP (a Unix socket's path cannot be
// shared).
func listen(network, address string, reuseport bool) (net.Listener, error) {
	if !reuseport || network == "unix" {
		return net.Listen(network, address)
	}
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		}); err != nil {
			return err
		}
		if serr != nil {
			return &net.OpError{Op: "setsockopt SO_REUSEPORT", Net: network, Err: serr}
		}
		return nil
	}}
	return lc.Listen(context.Background(), network, address)
}
