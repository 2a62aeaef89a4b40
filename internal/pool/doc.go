// Package pool is mongobouncer's upstream connection pool: one Pool per upstream server,
// implementing the MongoDB Connection Monitoring and Pooling (CMAP) specification.
//
// A Pool hands each *Conn to exactly one owner at a time (CheckOut / CheckIn, or the
// scoped Use), bounds the number of connections (MaxPoolSize) and of concurrent
// establishments (MaxConnecting), serves waiters in strict arrival order, and can be
// paused (Clear), resumed (Ready) and closed (Close). Establishing a connection (dial,
// handshake, auth) is delegated to a Connector and never happens under the pool's mutex.
//
// Every observable state change is reported as an Event to the Pool's Monitor, in the
// order the changes happened; the spec's debug log messages are one such Monitor
// (NewLogMonitor). See docs/pool.md for the design and the spec-to-code map.
package pool
