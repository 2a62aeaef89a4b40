package proxy

// The name of the I/O driver a started event loop runs on, for
// Server.LoopIO: read from the driver itself, so that what the startup
// line says is what runs, never a prediction of it.

// loopDriverName names l's driver: "io_uring" or "epoll"; "off" for no
// loop.
func loopDriverName(l *loops) string {
	if l == nil {
		return LoopIOOff
	}
	switch l.drv.(type) {
	case *ringDriver:
		return string(LoopIOUring)
	case *epollDriver:
		return string(LoopIOEpoll)
	}
	return LoopIOOff
}
