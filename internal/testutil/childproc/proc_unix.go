//go:build unix

package childproc

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
)

// LockFile takes an exclusive flock on path (creating it and its directory),
// so that test binaries running at the same time (go test runs packages
// concurrently) build a child's binary once. The returned func unlocks.
func LockFile(path string) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

// SetProcAttr prepares cmd so that the child dies with the test binary
// where the platform allows it.
func SetProcAttr(cmd *exec.Cmd) { setPdeathsig(cmd) }
