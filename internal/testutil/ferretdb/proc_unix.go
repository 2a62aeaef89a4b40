//go:build unix

package ferretdb

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
)

// lockFile takes an exclusive flock, so that test binaries running at the
// same time build FerretDB once.
func lockFile(path string) (func(), error) {
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

func setProcAttr(cmd *exec.Cmd) { setPdeathsig(cmd) }
