//go:build !linux

package loadgen

import (
	"errors"
	"fmt"
	"net"
	"os/exec"
	"time"
)

// errNoProc explains why the idle probe cannot run here.
var errNoProc = fmt.Errorf("loadgen: idle probe needs Linux /proc: %w", errors.ErrUnsupported)

// RaiseFileLimit is implemented on Linux only; elsewhere it returns an
// error matching errors.ErrUnsupported.
func RaiseFileLimit() (uint64, error) { return 0, errNoProc }

func openFDs() (int, error) { return 0, errNoProc }

func readRSS(int) (int64, error) { return 0, errNoProc }

func peerClosed(net.Conn) (bool, error) { return false, errNoProc }

// ProcessCPUTime is implemented on Linux only; elsewhere it returns an
// error matching errors.ErrUnsupported.
func ProcessCPUTime(int) (time.Duration, error) { return 0, errNoProc }

func machineCPU() (steal, total uint64, err error) { return 0, 0, errNoProc }

// killWithParent does nothing here: only Linux has a parent-death signal.
func killWithParent(*exec.Cmd) {}
