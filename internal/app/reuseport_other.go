//go:build !linux

// so_reuseport is Linux only: config validation refuses it elsewhere, so
// listen never sees reuseport true here.

package app

import (
	"errors"
	"log/slog"
	"net"
)

func warnMigrateReq(*slog.Logger) {}

func listen(network, address string, reuseport bool) (net.Listener, error) {
	if reuseport && network != "unix" {
		return nil, errors.New("so_reuseport: supported on Linux only")
	}
	return net.Listen(network, address)
}
