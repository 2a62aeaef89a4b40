//go:build !unix

package app

import "log/slog"

// RaiseFileLimit does nothing where RLIMIT_NOFILE does not exist.
func RaiseFileLimit() (before, after uint64, err error) { return 0, 0, nil }

// raiseFileLimit returns 0: no limit known, none checked.
func raiseFileLimit(*slog.Logger) uint64 { return 0 }
