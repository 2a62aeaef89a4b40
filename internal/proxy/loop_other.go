//go:build !linux

package proxy

import (
	"context"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/evloop"
)

// EventLoopSupported reports whether this platform has the event loop;
// elsewhere every client is served by its goroutine.
const EventLoopSupported = false

// loopClient is the event-loop state of a client; here only the endpoint
// (its lock, state and read window) and the state that finish uses.
type loopClient struct {
	evloop.Endpoint
	c *client
	// lastActive is never set without the loop; logintimeout.go's
	// loopClient.loginExpired, shared with Linux, reads it.
	lastActive time.Duration
}

func (lc *loopClient) init(c *client) { lc.c = c }

func (lc *loopClient) enter() bool { return false }

func (lc *loopClient) forget() {}

func (c *client) disconnect() {
	c.lc.Mu.Lock()
	defer c.lc.Mu.Unlock()
	if c.nc != nil {
		_ = c.nc.Close()
	}
}

func (s *Server) awaitLoopSends(context.Context) error { return nil }

func (s *Server) stopLoops() {}

func (s *Server) loopAdaptive() (evloop.AdaptiveStats, bool) { return evloop.AdaptiveStats{}, false }

func (s *Server) startLoops() (*loops, error) { return nil, nil }

// loops is the event loop, which never starts here.
type loops struct{}

// releaseOwned ends a client whose goroutine panicked after finish had
// closed it (recover.go), holding ownMu.
func (lc *loopClient) releaseOwned() {
	if lc.State == lsClosed {
		lc.c.finalizeOnce()
	}
}
