//go:build !linux

package uring

// Ring is io_uring's ring, which needs Linux.
type Ring struct{}

// New returns ErrUnsupported: io_uring needs Linux.
func New(entries uint32) (*Ring, error) { return nil, ErrUnsupported }

// Close does nothing.
func (r *Ring) Close() {}

// Recv does nothing.
func (r *Ring) Recv(fd int, b []byte, userData uint64, pollFirst bool) {}

// Read does nothing.
func (r *Ring) Read(fd int, b []byte, userData uint64) {}

// Send does nothing.
func (r *Ring) Send(fd int, b []byte, userData uint64, link bool) {}

// Enter does nothing.
func (r *Ring) Enter(wait uint32) error { return ErrUnsupported }

// Completions does nothing.
func (r *Ring) Completions(fn func(userData uint64, res int32)) {}

// Supported reports false: io_uring needs Linux.
func Supported() bool { return false }
