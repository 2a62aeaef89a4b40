package proxy

import (
	"net"
	"time"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Observer hears what the proxy does, for metrics. Its methods are called
// on the request path, from many goroutines at once: they must be fast, must
// not block and should not allocate.
type Observer interface {
	// ClientConnected and ClientDisconnected bracket each accepted client.
	ClientConnected()
	ClientDisconnected()
	// Request reports one forwarded request after its reply (the last of an
	// exhaust stream) was sent, or after it failed. command is a known
	// command name or "other", so label cardinality stays bounded. bytesIn
	// counts bytes from the client, bytesOut bytes to it. d runs from the
	// request's arrival to the end of its reply. ok is false when the client
	// got an error reply (from the upstream or from mongobouncer).
	Request(route, command string, bytesIn, bytesOut int, d time.Duration, ok bool)
	// UpstreamError reports an error code: one the upstream replied with
	// (ok: 0), or the one mongobouncer answered with because the upstream
	// could not be reached or failed mid-request (6, 89, 9001).
	UpstreamError(route string, code int32)
}

// AdminHandler answers the admin commands sent to the virtual
// "mongobouncer" database. peer is the client's address, so the handler can
// refuse peers that are not allowed. The reply is a command reply body.
type AdminHandler interface {
	HandleAdmin(peer net.Addr, body bsoncore.Document) bsoncore.Document
}

// AdminDatabase is the virtual database whose commands go to the
// AdminHandler instead of an upstream.
const AdminDatabase = "mongobouncer"

// nopObserver is used when Options.Observer is nil.
type nopObserver struct{}

func (nopObserver) ClientConnected()                                      {}
func (nopObserver) ClientDisconnected()                                   {}
func (nopObserver) Request(string, string, int, int, time.Duration, bool) {}
func (nopObserver) UpstreamError(string, int32)                           {}
