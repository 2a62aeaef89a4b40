//go:build !linux

package proxy

import "context"

// flusher lingers nothing here: client sockets are closed at once.
type flusher struct{}

func (c *client) lingerOnClose() {}

func (f *flusher) await(context.Context) error { return nil }
