// Package proxy is the client-facing side of mongobouncer: it accepts
// driver connections, answers the handshake as a mongos, and forwards every
// other command to an upstream connection lent by the route's pool,
// according to the route's pool mode.
//
// # Files, one role each
//
//   - server.go: listeners, the client set, advertised limits, shutdown.
//   - client.go: a client's life and the reads of its messages.
//   - conn.go: the client's connection (socket, buffers, what its hello
//     agreed on): its owner's only.
//   - reply.go: the one reply writer on the connection (our framing, the
//     legacy translation, compression, protocol errors and refusals).
//   - dispatch.go: what each message gets (handshake, admin, forward).
//   - admit.go: admit, the one verdict on each request for both I/O models
//     (refuse, answer, forward, or leave it to the loop), and the bounds on
//     a client that has not logged in.
//   - exchange.go: the request state machine, every decision of a forwarded
//     request, written once.
//   - relay.go: its goroutine driver (blocking I/O).
//   - loop_client_linux.go: its event-loop driver (non-blocking I/O), the
//     client's endpoint and handler in the engine (internal/evloop, which
//     moves the bytes over epoll or io_uring and knows nothing of MongoDB).
//   - loop_server_linux.go: the server's side of the loop: starting the
//     engine, the idle sweeper, stopping it.
//   - session.go: transactions across client connections (the server's
//     txnOwners), a client's clean-up (open transactions aborted upstream).
//     The session itself (pins, open transactions, phase: what other
//     clients and the admin read, under its lock) is internal/session's,
//     with a load-balanced client's cursors across a drain.
//   - auth.go: the login (identity, conversation) and the glue of client
//     logins (the steps are internal/auth's Login); logintimeout.go: a
//     goroutine's reads under client_login_timeout; userlimit.go:
//     max_user_client_conn's refusal (the rules are internal/gate's).
//   - hello.go: a client's hello read and answered on its socket, the
//     awaitable wait and stream (the protocol is internal/hello's).
//   - route.go, errors.go: the routing table (the routes themselves, with
//     their affinity maps, are internal/routing's) and which commands are
//     reads; upstream failures as error replies (package command reads
//     commands and replies and builds the error documents).
//
// A client is thus split by owner: its conn (socket, buffers) and the
// exchange, its owner's only; its loopClient (the loop's side, with the
// read window, under the endpoint's Mu); its session (internal/session,
// under its Mu, "sessMu"); its login.
// The exchange holds no client: it is given the server, the session and
// the login, and the request's command as a parameter.
//
// # Ownership
//
// A client is served by exactly one owner at a time: its goroutine
// (c.lc.State == lsGoroutine) or the event loop (any other state), and the
// owner alone reads its socket and touches the fields without a "guarded
// by" comment (the read window c.lc.Win, the exchange x, msg, nextID, the
// buffers). Hand-overs between them happen under the client's endpoint
// lock, c.lc.Mu ("ownMu" below). On the loop, whichever loop thread holds
// it acts for the client; the engine's per-socket state is guarded by that
// same lock (internal/evloop's doc says where not).
//
// An upstream connection belongs to its pool, and between checkout and
// check-in to the exchange that holds it (or to the client that pins it).
// The loop borrows its socket through syscall.RawConn
// (evloop.Loop.AttachUpstream), and names the client whose request is out
// on it until its reply ends (evloop.Endpoint.EndReply).
//
// # Lock order
//
// Locks are taken in this order, outermost first; none is held across
// network I/O except ownMu, which the loop holds across its non-blocking
// calls.
//
//  1. loopClient.Mu, "ownMu" (a client's event-loop ownership: its
//     evloop.Endpoint's lock).
//  2. session.Session.Mu, "sessMu" (c.sess: a client's pins, open
//     transactions and phase; internal/session takes it, and nothing else
//     while it holds it: pins it takes are checked in after). Another
//     client's sessMu is never taken while one is held: a transaction ended
//     through another client is handed over after the first is released.
//     Server.clientsMu comes before sessMu (SHOW CLIENTS, the drain check)
//     and is never taken under it.
//  3. The topology's server lock and the pool's lock (checkout, check-in).
//     The pool calls a CheckOutFunc callback under its lock; the callback
//     only takes the next locks.
//  4. The engine's leaves (evloop: the ready list, the io_uring arm
//     queues, the drivers' tables, and Flusher.mu: evloop/linger_linux.go).
//  5. Metrics (the Observer), which take no lock of ours.
//
// Server.txnMu, routing.Route.gateMu, the affinity maps' locks, Server.loopsMu,
// topology.UserSecrets' per-user lock (a pass-through user's secret) and hello.State.mu (the
// topologyVersion of hello replies) are leaves: nothing else is taken
// while one is held.
//
// # Panics
//
// A panic while serving one client ends that client only (recover.go,
// recover_linux.go): it is logged at error level with its stack, counted
// (Server.Panics, PanicObserver: mongobouncer_panics_total{path}), the
// upstream connection the interrupted request held is closed (its state
// is unknown: never pooled, never kept pinned), and the client is
// finished, which finalizes the server's accounting of it (wg, the client
// count, the set), so Shutdown does not wait for it. The recovery points:
//
//   - path "goroutine": deferred at the top of each goroutine that serves
//     a client (serve, run, loopClient.write's writer, the refusal over
//     max_client_conn). That covers dispatch, logins and the admin
//     commands, which run there. No lock of the client's is held at that
//     point; the recovery takes ownMu to learn who owns the client, and
//     finishes it as finish does (cleanup, open transactions aborted).
//   - path "loop": loopClient.Recover, the evloop.Handler's, deferred by
//     each engine function that takes a client's ownMu on behalf of the
//     loop (and by loopClient.enter once the loop owns the client), after its
//     deferred unlock, so the recovery runs under ownMu and the unlock
//     follows. It ends the client whatever its loop
//     state: a request out on an upstream connection has it closed (the
//     loop's registration keeps the client and its reply buffer reachable
//     until an io_uring receive still in flight completes); a checkout
//     still queued is given back, unused, when it is delivered
//     (Resumed); a client already handed to a goroutine has its
//     connection closed, which ends it there. The loop thread then goes on
//     with its other clients.
//
// The lock rule: a client's sessMu and ownMu are unlocked by a defer in
// the function that locks them, right after the Lock, everywhere in the
// package (lockrule_test.go checks it). A panic in a critical section so
// unlocks on its way up, before the recovery runs, which therefore never
// finds a lock its own goroutine left held, and takes the client's locks
// with a plain Lock: a lock it finds held is another goroutine's, for a
// critical section of a few lines without blocking I/O, and the recovery
// waits for it. The holder is never inferred (a lock held "too long" taken
// for the panicking frame's): unlocking another goroutine's lock makes
// that goroutine's own Unlock a fatal error, which ends the process.
// Critical sections in a loop, or that end in the middle of a function,
// are small functions of their own (the defers are open-coded: a few
// instructions).
//
// Not recovered: panics in the loop threads' own code (no one client's),
// where a process that went on with a thread in an unknown state would be
// worse off than one that stops; in the closes of loop clients by the
// idle sweeper and Server.Close, which parse nothing; and in the checkout
// callbacks (loopClient.delivered, checkOutDone's), which run on the pool's
// caller under its lock and only post the result. The goroutines the loop
// starts for a client run recovered code: run, Resume, upstreamReady.
// The HTTP admin server's handlers have net/http's own recovery.
package proxy
