// The sender's credentials, which systemd uses for NotifyAccess=main.

package fakesystemd

import (
	"net"
	"syscall"
)

// passCred asks the kernel to attach each sender's credentials.
func passCred(c *net.UnixConn) {
	if rc, err := c.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_PASSCRED, 1)
		})
	}
}

// credPID is the sender's process ID from a datagram's control data.
func credPID(oob []byte) int {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return 0
	}
	for _, m := range msgs {
		if cred, err := syscall.ParseUnixCredentials(&m); err == nil {
			return int(cred.Pid)
		}
	}
	return 0
}
