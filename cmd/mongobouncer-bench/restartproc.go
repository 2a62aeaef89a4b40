// The processes of a restart measurement (restart.go): mongobouncer
// instances started from a binary given on the command line, each on a
// configuration file written here, stopped with SIGTERM and waited for;
// their readiness read from /readyz; and the private network namespace
// that lets the upgrade scenario set net.ipv4.tcp_migrate_req without
// touching the host's.

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/testutil/childproc"
)

// Bounds of the process handling.
const (
	// readyTimeout bounds the wait for a started mongobouncer's /readyz.
	readyTimeout = 30 * time.Second
	// exitGrace is what a SIGTERMed mongobouncer gets beyond its
	// shutdown_timeout before it is killed.
	exitGrace = 15 * time.Second
	// defaultShutdownTimeout is mongobouncer's own default.
	defaultShutdownTimeout = 30 * time.Second
)

// bouncerConfig is one mongobouncer's configuration file.
type bouncerConfig struct {
	listen, admin, upstream string
	reusePort               bool
	// shutdownTimeout and shutdownDelay are written when not 0.
	shutdownTimeout, shutdownDelay time.Duration
	// eventLoop is written as event_loop when "true" or "false"; ""
	// leaves mongobouncer's default.
	eventLoop string
}

// text is the TOML file.
func (c bouncerConfig) text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Written by mongobouncer-bench restart.\n[mongobouncer]\nlisten = %q\nadmin_listen = %q\nlog_level = \"warn\"\n",
		c.listen, c.admin)
	if c.reusePort {
		b.WriteString("so_reuseport = true\n")
	}
	if c.shutdownTimeout > 0 {
		fmt.Fprintf(&b, "shutdown_timeout = %q\n", c.shutdownTimeout.String())
	}
	if c.shutdownDelay > 0 {
		fmt.Fprintf(&b, "shutdown_delay = %q\n", c.shutdownDelay.String())
	}
	if c.eventLoop != "" {
		fmt.Fprintf(&b, "event_loop = %s\n", c.eventLoop)
	}
	fmt.Fprintf(&b, "\n[databases.\"*\"]\nconnection_string = %q\n", c.upstream)
	return b.String()
}

// bouncer is one running mongobouncer process.
type bouncer struct {
	name  string
	cmd   *exec.Cmd
	admin string
	// exited is closed once the process has been reaped; waitErr is set
	// before.
	exited  chan struct{}
	waitErr error
	out     *childproc.TailBuffer
}

// startBouncer starts bin --config cfgPath. Its output is kept (the last
// 8 KiB, for errors) and copied to log when not nil.
func startBouncer(bin, name, cfgPath, admin string, log io.Writer) (*bouncer, error) {
	b := &bouncer{name: name, admin: admin, exited: make(chan struct{}), out: &childproc.TailBuffer{Max: 8 << 10}}
	b.cmd = exec.Command(bin, "--config", cfgPath)
	var w io.Writer = b.out
	if log != nil {
		w = io.MultiWriter(b.out, prefixWriter{w: log, prefix: name + ": "})
	}
	b.cmd.Stdout, b.cmd.Stderr = w, w
	childproc.SetProcAttr(b.cmd) // killed with this process
	if err := b.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	go func() {
		b.waitErr = b.cmd.Wait()
		close(b.exited)
	}()
	return b, nil
}

func (b *bouncer) pid() int { return b.cmd.Process.Pid }

// waitReady polls /readyz on b's admin address, a new connection each
// time, until b itself (the Mongobouncer-Pid header: with so_reuseport
// another process may answer) says 200, b exits, ctx ends or
// readyTimeout passes.
func (b *bouncer) waitReady(ctx context.Context) error {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	defer client.CloseIdleConnections()
	want := strconv.Itoa(b.pid())
	deadline := time.Now().Add(readyTimeout)
	last := "no answer"
	for time.Now().Before(deadline) {
		select {
		case <-b.exited:
			return fmt.Errorf("%s exited before it was ready (%v): %s", b.name, b.waitErr, strings.TrimSpace(b.out.String()))
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		resp, err := client.Get("http://" + b.admin + "/readyz")
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && resp.Header.Get("Mongobouncer-Pid") == want {
				return nil
			}
			last = fmt.Sprintf("%d from pid %s: %s", resp.StatusCode, resp.Header.Get("Mongobouncer-Pid"), strings.TrimSpace(string(body)))
		} else {
			last = err.Error()
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s (pid %d) not ready after %v: last /readyz: %s", b.name, b.pid(), readyTimeout, last)
}

// terminate sends SIGTERM and waits up to limit for the exit, then kills.
// It returns the exit code (-1 for a signal), how long the exit took and
// whether the process had to be killed.
func (b *bouncer) terminate(limit time.Duration) (code int, took time.Duration, killed bool) {
	start := time.Now()
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-b.exited:
	case <-t.C:
		_ = b.cmd.Process.Kill()
		<-b.exited
		killed = true
	}
	return b.cmd.ProcessState.ExitCode(), time.Since(start), killed
}

// kill ends b at once if it still runs (cleanup after a failure).
func (b *bouncer) kill() {
	select {
	case <-b.exited:
		return
	default:
	}
	_ = b.cmd.Process.Kill()
	select {
	case <-b.exited:
	case <-time.After(5 * time.Second):
	}
}

// writeConfig writes c as name.toml in dir.
func writeConfig(dir, name string, c bouncerConfig) (string, error) {
	p := filepath.Join(dir, name+".toml")
	return p, os.WriteFile(p, []byte(c.text()), 0o600)
}

// freeAddr returns a loopback address whose port is free now.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// prefixWriter prefixes each write (a log line, as children write them)
// with the child's name.
type prefixWriter struct {
	w      io.Writer
	prefix string
}

func (p prefixWriter) Write(b []byte) (int, error) {
	if _, err := io.WriteString(p.w, p.prefix+string(b)); err != nil {
		return 0, err
	}
	return len(b), nil
}

// netnsEnv marks this process as the bench re-run in a network namespace
// of its own; its value is the net.ipv4.tcp_migrate_req to set there.
const netnsEnv = "MONGOBOUNCER_BENCH_NETNS_MIGRATE_REQ"

// migratePath is the sysctl's file.
const migratePath = "/proc/sys/net/ipv4/tcp_migrate_req"

// reexecInNetns runs this command again under `unshare -n` (a network
// namespace of its own, with only loopback: every child inherits it) with
// tcp_migrate_req set to migrate there, and returns its exit status. It
// needs root.
func reexecInNetns(ctx context.Context, args []string, migrate string, stdout, stderr io.Writer) (int, error) {
	if os.Geteuid() != 0 {
		return 0, errors.New("-tcp-migrate-req 0 or 1 needs root, for a network namespace of its own (unshare -n)")
	}
	if _, err := os.Stat(migratePath); err != nil {
		return 0, fmt.Errorf("kernel without net.ipv4.tcp_migrate_req (Linux 5.14 or later): %w", err)
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return 0, err
	}
	self, err := os.Executable()
	if err != nil {
		return 0, err
	}
	cmd := exec.CommandContext(ctx, unshare, append([]string{"-n", "--", self, "restart"}, args...)...)
	cmd.Env = append(os.Environ(), netnsEnv+"="+migrate)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	childproc.SetProcAttr(cmd)
	cmd.WaitDelay = 5 * time.Second
	err = cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), nil
	}
	return 0, err
}

// enterNetns finishes setting up the namespace reexecInNetns made:
// loopback up, tcp_migrate_req set.
func enterNetns(migrate string) error {
	if out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		return fmt.Errorf("ip link set lo up: %v: %s", err, out)
	}
	return os.WriteFile(migratePath, []byte(migrate), 0)
}

// migrateSetting describes where the run happens and its tcp_migrate_req.
func migrateSetting() string {
	b, err := os.ReadFile(migratePath)
	v := strings.TrimSpace(string(b))
	if err != nil {
		v = "unavailable"
	}
	if os.Getenv(netnsEnv) != "" {
		return "netns, tcp_migrate_req=" + v
	}
	return "host, tcp_migrate_req=" + v
}
