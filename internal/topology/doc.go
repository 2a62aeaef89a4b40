// Package topology monitors the upstream servers of one route and chooses
// which server's pool serves each operation.
//
// A Topology owns one Server per configured host. Each Server has its own
// connection pool (internal/pool) and its own monitor goroutine. The monitor
// checks the server with hello over a dedicated connection that never comes
// from the pool, so a saturated pool cannot delay failure detection: that is
// the whole point of a separate monitoring connection.
//
// The behaviour follows the Server Discovery and Monitoring (SDAM) and Server
// Monitoring specifications where they apply to a proxy:
//
//   - A successful check records the hello reply, marks the server Usable and
//     marks its pool ready.
//   - A failed check closes the monitoring connection, marks the server
//     Unknown and clears its pool; a monitor timeout also interrupts in-use
//     connections. A network error on a server that was Usable is retried at
//     once, so a single dropped monitoring connection does not take the server
//     out of rotation for a whole heartbeat interval.
//   - Errors seen by application traffic are reported with Server.HandleError,
//     which applies SDAM's application error rules (generation check,
//     timeouts ignored, state-change errors).
//
// Selection is a function of the server descriptions (see selectable), so a
// replica-set policy can be added later without touching the monitors. Today
// a route is a standalone, a list of mongos, or a load balancer; a replica-set
// member that is not primary is never selected because writes sent to it
// would fail.
package topology
