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
//   - with Options.InMemory, a tiny in-memory insert / find / getMore /
//     killCursors / drop engine with per-server cursor ids, and transaction
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
// Timing model: one goroutine per connection reads a request, answers it and
// only then reads the next one, like a real server. Waits (Reply.Delay,
// blockConnection, awaitable hello) end early when the client closes its
// socket or the server is closed, so Close never waits for a long block.
package fakemongo
