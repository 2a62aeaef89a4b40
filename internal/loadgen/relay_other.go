//go:build !linux

package loadgen

import "net"

// epollLoops is RelayEpoll's engine, which needs Linux.
type epollLoops struct{}

func startEpollLoops() (*epollLoops, error) { return nil, ErrRelayUnsupported }

func (*epollLoops) add(c, u net.Conn) error {
	_ = c.Close()
	_ = u.Close()
	return ErrRelayUnsupported
}

func (*epollLoops) stop() {}

// uringLoops is RelayUring's engine, which needs Linux.
type uringLoops = epollLoops

func startUringLoops() (*uringLoops, error) { return nil, ErrRelayUnsupported }
