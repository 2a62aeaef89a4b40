package proxy

// Lingering at close, proxy's policy: from Server.Close on, a client's
// socket is handed to the engine's Flusher (evloop/linger_linux.go) before
// its own descriptors are closed, so that the replies still queued in it
// reach a client that reads slowly; Close waits for them (Flusher.Await).

import (
	"github.com/mongobouncer/mongobouncer/internal/clienttls"
	"github.com/mongobouncer/mongobouncer/internal/evloop"
)

// flusher holds the client sockets Server.Close lets their replies out of.
type flusher = evloop.Flusher

// lingerOnClose hands a duplicate of the client's socket to s.flush when
// the server is closing, before its own descriptors are closed. It holds
// the endpoint's Mu.
func (c *client) lingerOnClose() {
	lc := &c.lc
	if lc.lingered || !c.s.closing.Load() {
		return
	}
	lc.lingered = true
	switch {
	case lc.Fd() >= 0:
		c.s.flush.LingerFd(lc.Fd())
	case c.nc != nil:
		nc := c.nc
		if t, ok := nc.(*clienttls.Conn); ok {
			nc = t.Raw()
		}
		c.s.flush.LingerConn(nc)
	}
}
