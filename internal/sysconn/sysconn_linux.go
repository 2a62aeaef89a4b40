package sysconn

import (
	"errors"
	"net"
	"syscall"
)

// ErrNoDescriptor is returned for a net.Conn that has no descriptor.
var ErrNoDescriptor = errors.New("sysconn: connection has no descriptor")

// Dup returns a close-on-exec duplicate of nc's descriptor. It shares the
// open file description, so it is non-blocking as Go made the original.
// nc stays open: closing it takes the original out of Go's netpoller and
// leaves the socket to the duplicate.
func Dup(nc net.Conn) (int, error) {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return -1, ErrNoDescriptor
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return -1, err
	}
	fd := -1
	var derr error
	if err := rc.Control(func(s uintptr) { fd, derr = DupFd(int(s)) }); err != nil {
		return -1, err
	}
	return fd, derr
}

// DupFd duplicates fd, close-on-exec; under ForkLock so that no child
// process started meanwhile inherits the copy.
func DupFd(fd int) (int, error) {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	d, err := syscall.Dup(fd)
	if err == nil {
		syscall.CloseOnExec(d)
	}
	return d, err
}
