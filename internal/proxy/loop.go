package proxy

// loopState says who owns a client's socket: its goroutine or the event
// loop (loop_linux.go).
type loopState uint8

const (
	lsGoroutine loopState = iota // the client's goroutine reads and writes c.nc
	lsIdle                       // the loop owns the client; no request in flight
	lsWaiting                    // the request waits in the pool's queue (CheckOutFunc)
	lsUpstream                   // the loop sent a request and waits for the reply
	lsClosed                     // finished
)

// snapshot returns the connected clients.
func (s *Server) snapshot() []*client {
	s.clientsMu.Lock()
	defer s.clientsMu.Unlock()
	cs := make([]*client, 0, len(s.clients))
	for c := range s.clients {
		cs = append(cs, c)
	}
	return cs
}

// LoopIO values: Options.LoopIO.
const (
	// LoopIOAuto uses io_uring where the kernel allows it, epoll elsewhere.
	LoopIOAuto = ""
	// LoopIOEpoll uses epoll and read system calls.
	LoopIOEpoll = "epoll"
	// LoopIOUring requires io_uring: New starts the loop at once and fails
	// where the ring cannot start (a kernel that refuses io_uring, or a
	// locked-memory limit), rather than running epoll.
	LoopIOUring = "io_uring"
)
