//go:build unix

package app

import (
	"fmt"
	"log/slog"
	"syscall"
)

// RaiseFileLimit raises the soft RLIMIT_NOFILE to the hard limit and
// returns the soft limit before and after. Go's runtime already does this
// at start on most systems (and restores the original for child
// processes); doing it here as well makes it independent of that, and
// gives the figure the startup log and the fd budget need.
func RaiseFileLimit() (before, after uint64, err error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, 0, fmt.Errorf("getrlimit NOFILE: %w", err)
	}
	before = uint64(lim.Cur)
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return before, before, fmt.Errorf("setrlimit NOFILE to %d: %w", lim.Max, err)
		}
	}
	return before, uint64(lim.Cur), nil
}

// raiseFileLimit is RaiseFileLimit with its outcome logged; it returns the
// soft limit in force (0 when it cannot be read).
func raiseFileLimit(log *slog.Logger) uint64 {
	before, after, err := RaiseFileLimit()
	if err != nil {
		log.Warn("could not raise the open-file limit", "soft_limit", before, "error", err)
		return before
	}
	log.Info("open-file limit", "soft_before", before, "soft_after", after)
	return after
}
