//go:build !unix

package ferretdb

import "os/exec"

func lockFile(string) (func(), error) { return func() {}, nil }

func setProcAttr(*exec.Cmd) {}
