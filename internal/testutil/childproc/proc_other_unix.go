//go:build unix && !linux

package childproc

import "os/exec"

func setPdeathsig(*exec.Cmd) {}
