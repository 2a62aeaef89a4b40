package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/loadgen"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// spawned is a fast fake upstream and a real mongobouncer in front of it,
// each in its own process as a mongod and a pooler would be, so that direct
// and proxied traffic both cross process boundaries the same way.
type spawned struct {
	fake, bouncer *child
	direct        string
	proxied       string
}

// child is a started process with its exit watched.
type child struct {
	cmd    *exec.Cmd
	exited chan error
}

func startChild(cmd *exec.Cmd) (*child, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, exited: make(chan error, 1)}
	go func() { c.exited <- cmd.Wait() }()
	return c, nil
}

// stop sends SIGTERM, then SIGKILL after 15s.
func (c *child) stop() {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(15 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
}

// fakeUpstreamFlag makes the bench binary serve a fake upstream instead of
// measuring (see serveFake); spawn runs it as a child process.
const fakeUpstreamFlag = "-serve-fake-upstream"

// serveFake runs a fake upstream on a free loopback port, prints its
// address on stdout, and serves until SIGTERM or SIGINT.
func serveFake() int {
	sig := notifyStop()
	fake, err := fakemongo.Listen("127.0.0.1:0", fakemongo.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake upstream:", err)
		return 1
	}
	return announceAndServe(fake.Addr(), sig, func() { fake.Close() })
}

// notifyStop subscribes to SIGTERM and SIGINT. A child calls it before it
// binds, so a stop signal sent as soon as its address is known is caught.
func notifyStop() <-chan os.Signal {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	return sig
}

// announceAndServe prints addr on stdout for the parent (startAnnouncing),
// then waits for a stop signal and calls stop.
func announceAndServe(addr string, sig <-chan os.Signal, stop func()) int {
	fmt.Println(addr)
	<-sig
	stop()
	return 0
}

// spawn starts the fake upstream process and bin as mongobouncer in front
// of it, with a pool of poolSize in the given mode.
func spawn(bin string, poolSize int, mode string, extra ...string) (*spawned, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	fake, direct, err := startAnnouncing(exec.Command(self, fakeUpstreamFlag))
	if err != nil {
		return nil, fmt.Errorf("start fake upstream: %w", err)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fake.stop()
		return nil, err
	}
	listen := l.Addr().String()
	l.Close()
	args := []string{"--listen", listen, "--upstream", "mongodb://" + direct + "/", "--pool-mode", mode,
		"--max-pool-size", strconv.Itoa(poolSize), "--max-client-conn", "0", "--log-level", "warn"}
	cmd := exec.Command(bin, append(args, extra...)...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	bouncer, err := startChild(cmd)
	if err != nil {
		fake.stop()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	s := &spawned{fake: fake, bouncer: bouncer, direct: direct, proxied: listen}
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case err := <-bouncer.exited:
			fake.stop()
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

func (s *spawned) pid() int { return s.bouncer.cmd.Process.Pid }

// stop terminates mongobouncer, then the fake upstream.
func (s *spawned) stop() {
	s.bouncer.stop()
	s.fake.stop()
}

// startAnnouncing starts cmd, a child that prints the address it serves on
// its first line of output, and returns it with that address.
func startAnnouncing(cmd *exec.Cmd) (*child, string, error) {
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	c, err := startChild(cmd)
	if err != nil {
		return nil, "", err
	}
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			line <- sc.Text()
		}
		close(line)
		_, _ = io.Copy(io.Discard, out) // never block the child on a full pipe
	}()
	var addr string
	select {
	case addr = <-line:
	case <-time.After(10 * time.Second):
	}
	if addr == "" {
		c.stop()
		return nil, "", errors.New("it did not print its address within 10s")
	}
	return c, addr, nil
}

// relayFlag makes the bench binary serve a reference relay (see
// serveRelay); -ref runs it as a child process: -serve-relay KIND UPSTREAM.
const relayFlag = "-serve-relay"

// serveRelay runs a reference relay of kind in front of upstream on a free
// loopback port, prints its address on stdout, and serves until SIGTERM or
// SIGINT.
func serveRelay(kind, upstream string) int {
	sig := notifyStop()
	r, err := loadgen.ListenRelay("127.0.0.1:0", upstream, loadgen.RelayKind(kind))
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		return 1
	}
	return announceAndServe(r.Addr(), sig, func() { _ = r.Close() })
}
