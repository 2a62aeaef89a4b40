//go:build !unix

package devmongo

import (
	"os"
	"os/exec"
)

// Without SIGTERM, the only portable stop is a kill.
func interrupt(p *os.Process) error { return p.Kill() }

func lockFile(string) (func(), error) { return func() {}, nil }

func setProcAttr(*exec.Cmd) {}
