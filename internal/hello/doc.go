// Package hello is the hello handshake as a mongos answers it, knowing no
// proxy type and no socket: a hello's fields and a mongos's refusals
// (request.go), the reply (reply.go: wire versions, the limits passed on
// from the upstreams, the compression agreement), and the awaitable-hello
// state of one process (state.go).
//
// The awaitable hello (the SDAM monitoring specification's "awaitable
// hello" and "streaming protocol", mongos 4.4+). Every hello reply carries
// the process's topologyVersion {processId, counter}. A hello with
// topologyVersion and maxAwaitTimeMS whose topologyVersion is ours waits
// until our counter moves or the wait ends (at most MaxAwait); another
// processId or an older counter is answered at once. With exhaustAllowed,
// the reply sets moreToCome and the next one follows at each change or
// wait (no sooner than MinStreamInterval) without a request, until a reply
// is an error (ok: 0) or the client is gone.
//
// The one change of a mongobouncer's topology is the start of its drain:
// the counter moves (Bump), every waiting hello returns at once, and every
// hello from then on is answered ShutdownInProgress (91) with the
// topologyVersion and the time left (Quiesce), as a mongos in quiesce mode
// answers: its drivers mark it Unknown and stop selecting it before their
// next request.
//
// Sockets, logins and error documents are the caller's: a refused hello is
// an *Error with the code a mongos answers it with, and the caller waits
// on its own goroutine (State.Wait, bounded, with its cancellation
// channels) and writes the replies.
package hello
