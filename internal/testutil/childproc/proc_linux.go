//go:build linux

package childproc

import (
	"os/exec"
	"syscall"
)

// setPdeathsig makes the kernel kill the child if the test binary dies
// without running its cleanups (a test timeout's panic).
func setPdeathsig(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
