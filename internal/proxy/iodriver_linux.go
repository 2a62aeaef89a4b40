package proxy

// The name of the I/O driver a started event loop runs on, for
// Server.LoopIO: read from the engine's loop itself (evloop.Loop.IO names
// the driver that started), so that what the startup line says is what
// runs, never a prediction of it.

import "github.com/mongobouncer/mongobouncer/internal/evloop"

// loopDriverName names l's driver: "io_uring", "epoll", or
// "epoll+io_uring" for both, chosen by load (event_loop_io = "auto"
// where io_uring is allowed); "off" for no loop.
func loopDriverName(l *loops) string {
	if l == nil {
		return LoopIOOff
	}
	switch l.IO() {
	case evloop.IOUring:
		return string(LoopIOUring)
	case evloop.IOEpoll:
		return string(LoopIOEpoll)
	case evloop.IOAdaptive:
		return evloop.IOAdaptive
	}
	return LoopIOOff
}
