package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// spawned is a fast fake upstream in this process and a real mongobouncer
// process in front of it: the setup for measuring proxied against direct
// traffic on one machine in one run.
type spawned struct {
	fake    *fakemongo.Server
	cmd     *exec.Cmd
	exited  chan error
	direct  string
	proxied string
}

// spawn starts the fake upstream and bin as mongobouncer in statement mode
// with a pool of poolSize.
func spawn(bin string, poolSize int, mode string) (*spawned, error) {
	fake, err := fakemongo.Listen("127.0.0.1:0", fakemongo.Options{})
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fake.Close()
		return nil, err
	}
	listen := l.Addr().String()
	l.Close()
	cmd := exec.Command(bin, "--listen", listen, "--upstream", fake.URI(), "--pool-mode", mode,
		"--max-pool-size", strconv.Itoa(poolSize), "--max-client-conn", "0", "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		fake.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	s := &spawned{fake: fake, cmd: cmd, exited: make(chan error, 1), direct: fake.Addr(), proxied: listen}
	go func() { s.exited <- cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case err := <-s.exited:
			fake.Close()
			return nil, fmt.Errorf("%s exited at start: %v", bin, err)
		default:
		}
		if c, err := net.DialTimeout("tcp", listen, 200*time.Millisecond); err == nil {
			c.Close()
			return s, nil
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, errors.New("mongobouncer did not start listening within 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *spawned) pid() int { return s.cmd.Process.Pid }

// stop terminates mongobouncer (SIGTERM, then SIGKILL after 15s) and the
// fake upstream.
func (s *spawned) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(15 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
	s.fake.Close()
}

// cpuTime returns the user+system CPU time consumed so far by process pid,
// from /proc/PID/stat (in clock ticks of 1/100 s on Linux).
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may contain spaces; fields after its
	// closing parenthesis are plain.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("malformed /proc stat")
	}
	f := strings.Fields(s[i+1:])
	// utime and stime are fields 14 and 15, i.e. 11 and 12 after ')'.
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, errors.New("malformed /proc stat times")
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}
