//go:build linux

package loadgen

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// RaiseFileLimit raises this process's RLIMIT_NOFILE soft limit to its hard
// limit and returns the new soft limit.
func RaiseFileLimit() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("loadgen: getrlimit: %w", err)
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return 0, fmt.Errorf("loadgen: setrlimit NOFILE to %d: %w", lim.Max, err)
		}
	}
	return lim.Cur, nil
}

// openFDs counts this process's open file descriptors.
func openFDs() (int, error) {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0, fmt.Errorf("loadgen: counting open descriptors: %w", err)
	}
	return len(ents), nil
}

// readRSS returns the VmRSS of pid in bytes.
func readRSS(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, fmt.Errorf("loadgen: reading RSS of pid %d: %w", pid, err)
	}
	return parseVmRSS(b)
}

// parseVmRSS extracts VmRSS (reported in kB) from /proc/PID/status.
func parseVmRSS(status []byte) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		line := sc.Bytes()
		rest, ok := bytes.CutPrefix(line, []byte("VmRSS:"))
		if !ok {
			continue
		}
		f := bytes.Fields(rest)
		if len(f) != 2 || string(f[1]) != "kB" {
			return 0, fmt.Errorf("loadgen: unexpected VmRSS line %q", line)
		}
		kb, err := strconv.ParseInt(string(f[0]), 10, 64)
		if err != nil || kb < 0 {
			return 0, fmt.Errorf("loadgen: unexpected VmRSS line %q", line)
		}
		return kb * 1024, nil
	}
	return 0, fmt.Errorf("loadgen: no VmRSS in status (kernel thread or zombie?)")
}

// peerClosed reports, without blocking or consuming data, whether the peer
// has closed (or reset) conn.
func peerClosed(conn net.Conn) (bool, error) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return false, fmt.Errorf("loadgen: %T has no raw socket", conn)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false, err
	}
	var closed bool
	err = raw.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, e := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case e == syscall.EAGAIN || e == syscall.EINTR:
			closed = false
		case e != nil:
			closed = true // reset or other socket error
		default:
			closed = n == 0
		}
		return true // never wait for readiness
	})
	return closed, err
}

// clockTick is the unit of utime and stime in /proc/PID/stat: USER_HZ,
// which Linux fixes at 100 for user space.
const clockTick = 10 * time.Millisecond

// ProcessCPUTime returns the user+system CPU time process pid (0: this
// process) has used so far, all threads included, with a resolution of
// 10ms.
func ProcessCPUTime(pid int) (time.Duration, error) {
	name := "self"
	if pid != 0 {
		name = strconv.Itoa(pid)
	}
	b, err := os.ReadFile("/proc/" + name + "/stat")
	if err != nil {
		return 0, fmt.Errorf("loadgen: reading CPU time of pid %d: %w", pid, err)
	}
	return parseStatCPU(string(b))
}

// parseStatCPU extracts utime+stime from the text of /proc/PID/stat.
func parseStatCPU(s string) (time.Duration, error) {
	// The command name (field 2) may contain spaces and parentheses;
	// the fields after its last closing parenthesis are plain.
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("loadgen: malformed /proc stat %.40q", s)
	}
	f := strings.Fields(s[i+1:])
	// utime and stime are fields 14 and 15, i.e. 11 and 12 after ')'.
	if len(f) < 13 {
		return 0, fmt.Errorf("loadgen: short /proc stat %.40q", s)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil || ut < 0 || st < 0 {
		return 0, fmt.Errorf("loadgen: malformed /proc stat times %q %q", f[11], f[12])
	}
	return time.Duration(ut+st) * clockTick, nil
}

// machineCPU returns the steal time and the total time of all CPUs so far,
// in clock ticks, from /proc/stat.
func machineCPU() (steal, total uint64, err error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, fmt.Errorf("loadgen: reading /proc/stat: %w", err)
	}
	return parseProcStat(b)
}

// parseProcStat extracts the steal and total times from the aggregate "cpu"
// line of /proc/stat: user nice system idle iowait irq softirq steal
// (guest and guest_nice follow; they are already counted in user and nice).
func parseProcStat(b []byte) (steal, total uint64, err error) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := bytes.Fields(line)
	if len(f) < 9 || string(f[0]) != "cpu" {
		return 0, 0, fmt.Errorf("loadgen: unexpected /proc/stat line %.60q", line)
	}
	for i, v := range f[1:9] {
		n, err := strconv.ParseUint(string(v), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("loadgen: unexpected /proc/stat line %.60q", line)
		}
		total += n
		if i == 7 {
			steal = n
		}
	}
	return steal, total, nil
}

// killWithParent makes the kernel kill cmd's process if this one dies
// without stopping it (a SIGKILL, a crash): a measurement leaves no
// HAProxy behind.
func killWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
