package pool

import (
	"context"
	"syscall"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Connector establishes upstream connections for a pool: dial, handshake, auth.
//
// The pool never calls Connect while holding its mutex, so a slow Connector delays only
// the checkout that is waiting for that particular connection.
type Connector interface {
	// Connect returns an established connection to address. It must return promptly once ctx is
	// cancelled (a clear interrupts pending connections this way). id is the pool's connection ID.
	Connect(ctx context.Context, address string, id int64) (Upstream, error)
}

// Upstream is the established network connection that a pooled *Conn wraps.
//
// The pool itself only closes it. The other methods are what the proxy relays client
// traffic with (internal/upstream.Conn implements them all), so that a checked-out
// connection is used without a type assertion. A test double that the pool alone uses
// may embed a nil Upstream and implement Close only.
type Upstream interface {
	// Close closes the network connection. It may be called concurrently with a read or
	// write in progress (to interrupt it) and must not block for long.
	Close() error

	// Address is the address the connection was dialled with.
	Address() string
	// WriteMessage writes one whole wire message, compressed when agreed.
	WriteMessage(msg []byte) error
	// ReadMessage reads one whole message into buf (grown when too small),
	// decompressed, bounded by MaxMessageSize.
	ReadMessage(buf []byte) ([]byte, error)
	// Buffered counts bytes read from the socket and not yet returned by
	// ReadMessage: after a whole exchange, a reply nobody asked for.
	Buffered() int
	// MaxMessageSize bounds the messages the server may send.
	MaxMessageSize() int
	// RoundTrip runs one command of mongobouncer's own (an abort, for
	// example) and returns its reply body.
	RoundTrip(ctx context.Context, db string, cmd bsoncore.Document) (bsoncore.Document, error)
	// Fence makes sure nothing is left to read after a request sent with
	// moreToCome (request ID after), dropping a reply to it.
	Fence(ctx context.Context, after int32) error
	// Stray reports whether a reply to responseTo answers an earlier
	// moreToCome request whose reply the fence did not see, and forgets it.
	Stray(responseTo int32) bool
	// AwaitsStray reports whether such a request with ID id is
	// remembered: a request sent with that ID would be ambiguous.
	AwaitsStray(id int32) bool
	// RawConn returns the socket for non-blocking I/O of whole exchanges,
	// when nothing (TLS, compression, buffered input) stands between the
	// socket and the messages; ok is false otherwise.
	RawConn() (rc syscall.RawConn, ok bool)
	// IOError wraps an error of I/O done on RawConn as the connection's own
	// I/O errors are wrapped.
	IOError(op string, err error) error
	// Attachment and SetAttachment keep the user's per-connection state
	// (the event loop's registration of the socket).
	Attachment() any
	SetAttachment(v any)
}

// ServiceIDer is implemented by Upstreams established in load-balancer mode.
type ServiceIDer interface {
	// ServiceID returns the serviceId the load balancer's backend reported in its
	// handshake reply, and whether it reported one.
	ServiceID() (bson.ObjectID, bool)
}
