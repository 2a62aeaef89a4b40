//go:build linux && (amd64 || arm64)

package seccomp

import (
	"context"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// childEnv marks the child process RefuseIOUring starts.
const childEnv = "MONGOBOUNCER_TEST_SECCOMP_CHILD"

// maxEntriesEnv carries RefuseLargeIOUring's limit to the child; absent,
// every io_uring_setup fails.
const maxEntriesEnv = "MONGOBOUNCER_TEST_SECCOMP_MAX_ENTRIES"

// childTimeout bounds the child process.
const childTimeout = 3 * time.Minute

// Supported reports whether RefuseIOUring can run here.
const Supported = true

// io_uring_setup has the same number on every architecture (the unified
// table of syscalls added since 5.x).
const sysIOUringSetup = 425

// Classic BPF and seccomp constants (linux/filter.h, linux/seccomp.h).
const (
	bpfLdWAbs       = 0x20 // BPF_LD | BPF_W | BPF_ABS
	bpfJeqK         = 0x15 // BPF_JMP | BPF_JEQ | BPF_K
	bpfJgtK         = 0x25 // BPF_JMP | BPF_JGT | BPF_K
	bpfRetK         = 0x06 // BPF_RET | BPF_K
	retAllow        = 0x7fff0000
	retErrno        = 0x00050000
	modeFilter      = 1
	flagTSync       = 1
	prSetNoNewPrivs = 38

	offNr   = 0  // seccomp_data.nr
	offArch = 4  // seccomp_data.arch
	offArg0 = 16 // seccomp_data.args[0], its low 32 bits (little endian: amd64, arm64)
)

type sockFilter struct {
	code uint16
	jt   uint8
	jf   uint8
	k    uint32
}

type sockFprog struct {
	len    uint16
	filter *sockFilter
}

// RefuseIOUring runs the calling test again, alone, in a child process in
// which io_uring_setup fails with EPERM, and reports whether the caller
// is that child. The parent gets false and passes or fails with the
// child's result; the child gets true and goes on with the test:
//
//	if !seccomp.RefuseIOUring(t) {
//		return
//	}
func RefuseIOUring(t *testing.T) bool {
	t.Helper()
	return inChild(t, "", "refuses io_uring")
}

// RefuseLargeIOUring is RefuseIOUring for a kernel that allows a small
// ring but not a large one: io_uring_setup fails with EPERM when asked for
// more than maxEntries entries. A probe with a tiny ring (uring.Supported)
// then succeeds while the event loop's rings fail, as a memory limit on
// the rings can make a real kernel do.
func RefuseLargeIOUring(t *testing.T, maxEntries uint32) bool {
	t.Helper()
	return inChild(t, strconv.FormatUint(uint64(maxEntries), 10), "refuses io_uring rings over "+strconv.FormatUint(uint64(maxEntries), 10)+" entries")
}

// inChild runs the calling test again in a child process with the filter
// (maxEntries "" for every io_uring_setup), or installs it when the
// caller is that child.
func inChild(t *testing.T, maxEntries, what string) bool {
	t.Helper()
	if os.Getenv(childEnv) == t.Name() {
		if err := install(os.Getenv(maxEntriesEnv)); err != nil {
			t.Fatalf("installing the seccomp filter: %v", err)
		}
		return true
	}
	// A child that hangs fails the test rather than wedging it.
	ctx, cancel := context.WithTimeout(context.Background(), childTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+regexp.QuoteMeta(t.Name())+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), childEnv+"="+t.Name(), maxEntriesEnv+"="+maxEntries)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: "+t.Name()) {
		t.Fatalf("in a process that %s: %v\n%s", what, err, out)
	}
	t.Logf("passed in a process that %s", what)
	return false
}

// install adds to every thread of the process, for good, a filter under
// which io_uring_setup fails with EPERM: always when maxEntries is "",
// else when asked for more entries than it says.
func install(maxEntries string) error {
	prog := []sockFilter{
		{code: bpfLdWAbs, k: offArch},
		{code: bpfJeqK, k: auditArch, jt: 0, jf: 3}, // another ABI: allow
		{code: bpfLdWAbs, k: offNr},
		{code: bpfJeqK, k: sysIOUringSetup, jt: 0, jf: 1},
		{code: bpfRetK, k: retErrno | uint32(syscall.EPERM)},
		{code: bpfRetK, k: retAllow},
	}
	if maxEntries != "" {
		n, err := strconv.ParseUint(maxEntries, 10, 32)
		if err != nil {
			return err
		}
		prog = []sockFilter{
			{code: bpfLdWAbs, k: offArch},
			{code: bpfJeqK, k: auditArch, jt: 0, jf: 5}, // another ABI: allow
			{code: bpfLdWAbs, k: offNr},
			{code: bpfJeqK, k: sysIOUringSetup, jt: 0, jf: 3},
			{code: bpfLdWAbs, k: offArg0},
			{code: bpfJgtK, k: uint32(n), jt: 0, jf: 1},
			{code: bpfRetK, k: retErrno | uint32(syscall.EPERM)},
			{code: bpfRetK, k: retAllow},
		}
	}
	fprog := sockFprog{len: uint16(len(prog)), filter: &prog[0]}
	// no_new_privs is a thread's attribute; TSYNC gives it, with the
	// filter, to every other thread of the process.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if _, _, errno := syscall.RawSyscall6(syscall.SYS_PRCTL, prSetNoNewPrivs, 1, 0, 0, 0, 0); errno != 0 {
		return errno
	}
	r, _, errno := syscall.RawSyscall(sysSeccomp, modeFilter, flagTSync, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if errno != 0 {
		return errno
	}
	if r != 0 {
		return syscall.Errno(syscall.ESRCH) // a thread could not be synchronised
	}
	return nil
}
