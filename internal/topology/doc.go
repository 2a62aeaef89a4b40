// Package topology runs the upstream deployment of one route: it discovers
// its servers, monitors them, keeps a connection pool per server, and
// chooses which server serves each operation.
//
// The rules are internal/sdam's, a package of pure functions run against the
// official conformance suites; this package does the I/O and the
// concurrency around them:
//
//   - discovery.go: every new server description (a check, or an
//     application error) is applied to the SDAM topology description under
//     Topology.mu. Servers it adds get a pool (paused) and a monitor; servers
//     it removes have their monitor stopped and their pool closed; each
//     server's pool is made ready before the server is published as Usable
//     and cleared after it is published as Unknown. A new selection snapshot
//     is published, and one log line says what the topology changed from and
//     to. SetHosts applies an SRV poll to a mongos list.
//   - monitor.go, monitor_stream.go, rtt.go: one monitor goroutine per
//     server, on a dedicated connection that never comes from the pool (so a
//     saturated pool cannot delay failure detection), streaming awaitable
//     hellos where the server supports them (with a second connection for
//     round-trip times) and polling otherwise. A failed check marks the
//     server Unknown and clears its pool (a timeout also interrupts in-use
//     connections); a network error on a known server is checked again at
//     once.
//   - apperror.go: Server.HandleError applies SDAM's application error rules
//     (stale generations and topologyVersions ignored, state-change errors,
//     network errors, shutdown codes).
//   - select.go: SelectServer with Criteria. Writes, and reads without a read
//     preference, go to the writable servers (the primary, every mongos, a
//     load balancer, the server of a Single topology) through a lock-free,
//     allocation-free snapshot; a read preference selects among a replica
//     set's members as the server-selection specification says. With nothing
//     suitable, selection requests immediate checks and waits for the
//     topology to change, up to ServerSelectionTimeout: after a stepdown,
//     requests that need a primary wait for the new one.
//
// The lock order is written once, on Topology.
package topology
