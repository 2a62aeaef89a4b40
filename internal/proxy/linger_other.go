//go:build !linux

package proxy

// Without Linux's socket lingering (linger_linux.go), a closed client's
// socket is closed at once.

import "context"

// flusher lingers nothing here: client sockets are closed at once.
type flusher struct{}

func (c *client) lingerOnClose() {}

func (f *flusher) Await(context.Context) error { return nil }
