// Package fakemongo is a scripted fake mongod / mongos for tests and benchmarks.
//
// FerretDB, the project's real development upstream, has no transactions,
// replica sets, fail points, exhaust streams or multiple mongos, so the pool
// and proxy tests need a server whose behaviour each test controls. The fake
// speaks the real wire protocol (OP_MSG, OP_COMPRESSED, and OP_QUERY/OP_REPLY
// for the legacy first hello), so the official Go driver can talk to it.
//
// What a Server does on its own:
//
//   - hello / isMaster / ismaster (OP_MSG or OP_QUERY) shaped by Options:
//     standalone, replica-set member or mongos; wire versions, size limits,
//     logicalSessionTimeoutMinutes, connectionId, serviceId for load-balanced
//     clients, compression negotiation, and optionally topologyVersion with
//     awaitable (and exhaust-streamed) hello;
//   - ping, buildInfo, endSessions, configureFailPoint ("failCommand");
//   - with Options.Users, logins as mongod does them (auth.go): SCRAM-SHA-1
//     and SCRAM-SHA-256 (short or long conversation, speculativeAuthenticate
//     and saslSupportedMechs in hello, code 18 for a wrong password),
//     MONGODB-X509 from the TLS peer certificate (Options.TLSConfig), and
//     connectionStatus; other commands then need a logged-in connection;
//   - with Options.InMemory, a tiny in-memory insert / update / delete /
//     find / getMore / killCursors / drop engine (equality filters; update
//     by replacement or top-level $set) with per-server cursor ids, and transaction
//     bookkeeping (startTransaction, commitTransaction, abortTransaction) whose
//     state tests read through Server.Transactions.
//
// Everything else answers CommandNotFound (59) unless a test registers a
// Handler with Server.Handle. Handlers decide, per command, which documents
// to send, whether to stream them as an exhaust reply, to delay, to send
// nothing, to close the connection or to kill the whole server.
//
// Fail points (the failCommand fail point of real servers) are set over the
// wire with configureFailPoint or from Go with Server.SetFailPoint. They are
// checked before handlers and built-in commands, as on a real server.
//
// The request path reuses per-connection buffers: a ping round trip does not
// allocate on the server side (see BenchmarkPingRoundTrip), so the load tool
// can use the fake as a "fast upstream".
//
// Typical use:
//
//	s := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos, InMemory: true})
//	s.Handle("find", func(req *fakemongo.Request) fakemongo.Reply {
//		if req.AppName == "slow" {
//			r := s.Builtin(req)
//			r.Delay = time.Second
//			return r
//		}
//		return s.Builtin(req)
//	})
//	s.SetFailPoint(fakemongo.FailPoint{Mode: fakemongo.FailTimes, Times: 1,
//		FailCommands: []string{"hello"}, ErrorCode: 91, AppName: "pool-test"})
//	client := connect(s.URI()) // mongodb://127.0.0.1:port/?directConnection=true
//	...
//	if s.Requests("abortTransaction") != 1 { ... }
//
// Replica sets: StartReplicaSet starts N members on loopback that answer
// hello as one set (setName, hosts, arbiters, me, primary, electionId,
// setVersion, lastWrite, tags, hidden, topologyVersion) and that a test
// scripts with StepDown, Elect, Reconfig, RemoveMember, Kill, Revive and
// Failover. Every state change bumps each live member's topologyVersion,
// which answers awaitable hellos at once, so a streaming monitor hears of
// it immediately; a primary that loses the role has its own raised in the
// same step, so its "not primary" replies are never older than a hello
// that said primary. A killed member whose connections are still closing
// answers nothing (a dead process sends no error).
// The members share one store: replication is instantaneous and an
// acknowledged write is never lost. As on mongod 4.4+:
//
//   - a write (insert, update, delete, findAndModify, DDL, anything in a
//     transaction, commit/abortTransaction) on a non-primary fails with
//     NotWritablePrimary (10107, "not primary"), labelled
//     RetryableWriteError for retryable writes and commit/abort and
//     TransientTransactionError inside a transaction; an unacknowledged
//     one (moreToCome) closes the connection instead;
//   - a read (find, aggregate, count, ...) on a secondary needs a
//     $readPreference whose mode is not primary, else
//     NotPrimaryNoSecondaryOk (13435); an arbiter answers
//     NotPrimaryOrSecondary (13436); getMore, killCursors, hello, ping and
//     the like run in any state;
//   - a stepdown (StepDown, Elect of another member, Failover) interrupts
//     the writes in flight on the old primary with
//     InterruptedDueToReplStateChange (11602, same labels) and keeps their
//     connections open, lets reads in flight finish, and aborts the
//     transactions in progress, as mongod does since 4.2 (earlier versions
//     closed every connection). A write is "in flight" while it waits (a
//     blockConnection fail point, a handler's Reply.Delay); a write whose
//     handler is running when the stepdown lands completes normally. A
//     write delayed by Reply.Delay after its handler ran Builtin is applied
//     and still answered 11602, like a real write interrupted while it
//     waits for its write concern: its retry is deduplicated (below);
//   - retryable inserts, updates and deletes are remembered by (lsid,
//     txnNumber), so a retry on the new primary answers the first result
//     instead of writing twice;
//   - every state-change error (10107, 11602, 13435, 13436) carries the
//     member's topologyVersion, the one its hello reports at that moment,
//     so SDAM's rule that an error not newer than what the monitor heard
//     is ignored gets exercised;
//   - cursor ids stay per member and per process life.
//
// Each member's find replies carry ServedByField (its address) and its
// request counters (Member.Requests) sum over its lives, so a test knows
// which member served what. PauseReplication makes a secondary lag.
//
//	rs := fakemongo.StartReplicaSet(t, fakemongo.ReplicaSetOptions{ElectionDelay: 200 * time.Millisecond})
//	client := connect(rs.SeedURI(0)) // mongodb://<member 0>/?replicaSet=rs0
//	go rs.Failover()                 // step member 0 down, elect member 1 after the delay
//	...
//	if rs.Member(0).Requests("find") != 0 { ... }
//
// Timing model: one goroutine per connection reads a request, answers it and
// only then reads the next one, like a real server. Waits (Reply.Delay,
// blockConnection, awaitable hello) end early when the client closes its
// socket or the server is closed, so Close never waits for a long block.
package fakemongo
