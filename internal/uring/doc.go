// Package uring is a minimal io_uring for event loops that own a thread:
// receives, reads and sends prepared in a batch and submitted, with the
// wait for their completions, in one system call. A Ring is created with
// IORING_SETUP_SINGLE_ISSUER and IORING_SETUP_DEFER_TASKRUN, so it must be
// created and used by one OS thread only (runtime.LockOSThread), and its
// completions are produced only while that thread is in Enter.
//
// It is Linux only; elsewhere New returns ErrUnsupported.
package uring

import "errors"

// ErrUnsupported is returned by New where io_uring cannot be used.
var ErrUnsupported = errors.New("uring: io_uring is not supported here")
