package pool

import (
	"context"

	"go.mongodb.org/mongo-driver/v2/bson"
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
type Upstream interface {
	// Close closes the network connection. It may be called concurrently with a read or
	// write in progress (to interrupt it) and must not block for long.
	Close() error
}

// ServiceIDer is implemented by Upstreams established in load-balancer mode.
type ServiceIDer interface {
	// ServiceID returns the serviceId the load balancer's backend reported in its
	// handshake reply, and whether it reported one.
	ServiceID() (bson.ObjectID, bool)
}
