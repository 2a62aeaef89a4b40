//go:build !linux

package ferretdb

import "os/exec"

func setPdeathsig(*exec.Cmd) {}
