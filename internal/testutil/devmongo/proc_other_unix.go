//go:build unix && !linux

package devmongo

import "os/exec"

func setPdeathsig(*exec.Cmd) {}
