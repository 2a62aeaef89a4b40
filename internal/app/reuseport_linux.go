// Listening sockets with SO_REUSEPORT (so_reuseport): a new mongobouncer
// binds the addresses the old one still holds, so an upgrade on one host
// refuses no connection (docs/operations.md).

package app

import (
	"context"
	"log/slog"
	"net"
	"os"
	"strings"
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

// migrateReqPath is the sysctl that decides whether the kernel moves the
// connections queued on a closing listener to another one of its
// SO_REUSEPORT group (1) or resets them (0). A variable for tests.
var migrateReqPath = "/proc/sys/net/ipv4/tcp_migrate_req"

// warnMigrateReq warns, with so_reuseport, when the kernel will reset the
// connections queued on this process's listeners as it shuts down
// (measured by TestSoReuseportUpgrade).
func warnMigrateReq(log *slog.Logger) {
	b, err := os.ReadFile(migrateReqPath)
	switch {
	case err != nil:
		log.Warn("so_reuseport: net.ipv4.tcp_migrate_req unreadable (Linux before 5.14?): connections queued on a listener when this process shuts down will be reset", "error", err)
	case strings.TrimSpace(string(b)) != "1":
		log.Warn("so_reuseport: net.ipv4.tcp_migrate_req is not 1: connections queued on a listener when this process shuts down will be reset; set it (examples/99-mongobouncer.conf)", "tcp_migrate_req", strings.TrimSpace(string(b)))
	}
}
