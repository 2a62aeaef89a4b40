package proxy

// The client connection's addresses for its logins: the lookup cache bounds the
// lookups one client address starts, and a user's
// authenticationRestrictions are checked against them.

import (
	"context"

	"github.com/mongobouncer/mongobouncer/internal/auth"
)

// authContext carries the client's addresses (auth.WithPeer): its remote
// address, and the local address it connected to (the listener's when
// the connection has none to give, as a listener on one address).
func (cn *conn) authContext() context.Context {
	local := cn.listener
	if cn.nc != nil {
		if a := cn.nc.LocalAddr(); a != nil {
			local = a.String()
		}
	}
	return auth.WithPeer(context.Background(), auth.Peer{Remote: cn.remote, Local: local})
}
