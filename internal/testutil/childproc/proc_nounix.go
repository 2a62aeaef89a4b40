//go:build !unix

package childproc

import "os/exec"

// LockFile does nothing where there is no flock.
func LockFile(string) (func(), error) { return func() {}, nil }

// SetProcAttr does nothing where there is no parent-death signal.
func SetProcAttr(*exec.Cmd) {}
