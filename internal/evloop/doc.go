// Package evloop is mongobouncer's event-loop engine: a layer that moves
// bytes between sockets over a swappable I/O model (epoll, io_uring),
// knowing nothing of the protocol it carries nor of its user's types, in
// the shape of pgbouncer's sbuf.
//
// # Files, one role each
//
//   - endpoint.go: the contract: Endpoint (owner, state, read window),
//     Handler (what the engine calls back), Thread.
//   - window.go: the read window.
//   - endpoint_linux.go: the user's calls on an endpoint (attach its
//     socket, receive, send a request and wait for its reply, send a
//     reply, close, hand the socket back as a net.Conn), and the one
//     decision whether a driver's event is still wanted.
//   - loop_linux.go: the Loop, its ready list, the driver interface and
//     the optional fused one, and the raw read and write calls.
//   - epoll_linux.go, ring_linux.go: the two drivers; ringclose_linux.go
//     closes io_uring endpoints (or hands them to epoll); place_linux.go
//     places io_uring endpoints on the threads; spin_linux.go has a thread
//     wait awake for a lone fast reply (spin.go, its counters).
//   - adapt_linux.go: a loop of both drivers (IOAdaptive, the default
//     where io_uring is allowed): epoll at a light load, io_uring under
//     load, the endpoints moving between them (adapt.go, its report).
//   - linger_linux.go: Flusher, which keeps a socket its user closed
//     until the replies queued in it are out.
//   - diag_linux.go: what the user may read of the placement, for tests.
//
// # Contract
//
// The user (internal/proxy) owns the policy: which request goes where,
// what a reply means, when an endpoint closes and whether its replies are
// let out (passed to Endpoint.Close), and whether a reply may be sent in
// one submission with the next receive (it calls Endpoint.SendReply or
// not). The engine owns the mechanics: registrations, receives, the
// reading of readiness, and the decision, in one place (Endpoint.wanted),
// whether a completion still concerns the endpoint it names. Plain writes
// are not a driver's: they are the same non-blocking write on every model.
// The io_uring driver's fused send-and-receive is an optional interface
// (fusedDriver), found by type assertion.
//
// # Lock order
//
// Endpoint.Mu comes first: the engine calls every Handler method holding
// it, and takes the following under it: the pool's lock is the user's
// (taken under Mu, never the other way round); then Loop.readyMu,
// ringThread.qMu, epollDriver.tabMu, ringUp.mu and Flusher.mu, which are
// leaves.
//
// # Panics
//
// Every engine function that takes an endpoint's Mu on the loop's behalf
// defers Handler.Recover after the deferred unlock, so that a panic of the
// user's code ends that endpoint only, under Mu. Panics in the engine's
// own code are not recovered: a thread in an unknown state would be worse
// than a process that stops.
package evloop
