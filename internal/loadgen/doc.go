// Package loadgen drives load at a MongoDB-speaking address and measures it,
// so that mongobouncer can be compared with a direct connection on the same
// machine in the same run.
//
// The project's machines are small (2 cores) and noisy, so absolute numbers
// mean little: Compare runs the same workload against a direct and a proxied
// address in several short alternating rounds and reports ratios
// (proxied/direct throughput, added latency). The generator shares the CPU
// with what it measures, so its own hot loop (the "ping" workload) reuses
// every buffer and allocates nothing per operation.
//
// Workloads:
//   - "ping": N clients, each with its own TCP connection, send a hello and
//     then raw OP_MSG {ping: 1, $db: "admin"} in a closed loop.
//   - "driver": N goroutines share one official Go driver client and run a
//     mix of insertOne / findOne / updateOne on a throw-away collection.
//   - "find-insert": the same, with 80 % findOne by _id of documents seeded
//     before the run and 20 % insertOne (the demo's workload).
//
// References (compared with direct traffic like mongobouncer): the
// project's copy-only relays (ListenRelay) and HAProxy in TCP mode
// (StartHAProxy, on a configuration written by HAProxyConfig). Clients may
// come from several loopback source addresses (Config.SourceAddrs), so that
// one address's ephemeral ports do not bound their number.
//
// Every run is bounded by both a duration and a maximum operation count, and
// stops early when its context is cancelled. Operations that complete during
// the warm-up are excluded from the throughput and latency figures.
//
// ProbeIdle measures what an idle client connection costs a process: it
// opens K connections that each complete a hello and then stay silent, and
// reports the change in the target process's resident set size.
package loadgen
