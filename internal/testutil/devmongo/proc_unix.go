//go:build unix

package devmongo

import (
	"os"
	"os/exec"
	"syscall"
)

func interrupt(p *os.Process) error { return p.Signal(syscall.SIGTERM) }

// lockFile takes an exclusive flock so that parallel test binaries (go test
// runs packages concurrently) build devmongo once.
func lockFile(path string) (func(), error) {
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
