package sdnotify

import (
	"errors"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/testutil/fakesystemd"
	"github.com/mongobouncer/mongobouncer/internal/testutil/logbuf"
)

// Each notification reaches the socket as one datagram with exactly the
// assignments systemd expects, from this process (NotifyAccess=main), on a
// socket path and on an abstract name alike.
func TestDatagrams(t *testing.T) {
	for _, abstract := range []bool{false, true} {
		t.Run(map[bool]string{false: "path", true: "abstract"}[abstract], func(t *testing.T) {
			if abstract && runtime.GOOS != "linux" {
				t.Skip("abstract sockets are Linux's")
			}
			sock := fakesystemd.Listen(t, abstract)
			if abstract != strings.HasPrefix(sock.Addr, "@") {
				t.Fatalf("precondition: socket %q", sock.Addr)
			}
			t.Setenv(EnvSocket, sock.Addr)
			n := FromEnv(nil)
			if n == nil || n.Socket() != sock.Addr {
				t.Fatalf("FromEnv with %s=%q: %v", EnvSocket, sock.Addr, n)
			}
			next := func() fakesystemd.Message {
				t.Helper()
				m, err := sock.Next(5 * time.Second)
				if err != nil {
					t.Fatal(err)
				}
				if runtime.GOOS == "linux" && m.PID != os.Getpid() {
					t.Errorf("%q sent by pid %d, want %d", m.Text, m.PID, os.Getpid())
				}
				return m
			}
			for _, tc := range []struct {
				send func() error
				want string
			}{
				{func() error { return n.Ready("clients 0/10, pools 1, routes 1/1 ready") }, "READY=1\nSTATUS=clients 0/10, pools 1, routes 1/1 ready"},
				{func() error { return n.Ready("") }, "READY=1"},
				{func() error { return n.Status("clients 3/10") }, "STATUS=clients 3/10"},
				{func() error { return n.Stopping("draining") }, "STOPPING=1\nSTATUS=draining"},
				{func() error { return n.Send("A=1", "B=2") }, "A=1\nB=2"},
			} {
				if err := tc.send(); err != nil {
					t.Fatal(err)
				}
				if m := next(); m.Text != tc.want {
					t.Errorf("datagram %q, want %q", m.Text, tc.want)
				}
			}

			before, _ := monotonicUsec()
			if err := n.Reloading("reloading"); err != nil {
				t.Fatal(err)
			}
			after, _ := monotonicUsec()
			m := next()
			lines := strings.Split(m.Text, "\n")
			if runtime.GOOS != "linux" {
				if m.Text != "RELOADING=1\nSTATUS=reloading" {
					t.Fatalf("datagram %q", m.Text)
				}
				return
			}
			if len(lines) != 3 || lines[0] != "RELOADING=1" || !strings.HasPrefix(lines[1], "MONOTONIC_USEC=") || lines[2] != "STATUS=reloading" {
				t.Fatalf("datagram %q, want RELOADING=1, MONOTONIC_USEC=..., STATUS=reloading", m.Text)
			}
			us, err := strconv.ParseUint(strings.TrimPrefix(lines[1], "MONOTONIC_USEC="), 10, 64)
			if err != nil || us < before || us > after {
				t.Fatalf("MONOTONIC_USEC=%d (%v), want within [%d, %d]", us, err, before, after)
			}
		})
	}
}

// MONOTONIC_USEC is CLOCK_MONOTONIC, the clock since boot, which never
// runs ahead of the uptime (CLOCK_BOOTTIME, which also counts suspend).
func TestMonotonicIsSinceBoot(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("Linux only")
	}
	us, ok := monotonicUsec()
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		t.Skip(err)
	}
	up, err := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	if err != nil {
		t.Fatal(err)
	}
	if !ok || us == 0 || float64(us) > up*1e6+20_000 {
		t.Fatalf("monotonic %d µs (ok %v), uptime %.2f s", us, ok, up)
	}
}

// Without NOTIFY_SOCKET there is no Notifier, and the nil one sends
// nothing without failing; an address systemd's sd_notify would take but
// this package cannot (vsock) or a relative path gives none either.
func TestOff(t *testing.T) {
	t.Setenv(EnvSocket, "")
	os.Unsetenv(EnvSocket)
	var log logbuf.Buffer
	if n := FromEnv(nil); n != nil {
		t.Fatalf("FromEnv without %s: %v", EnvSocket, n)
	}
	var n *Notifier
	for _, err := range []error{n.Ready("x"), n.Reloading("x"), n.Stopping("x"), n.Status("x"), n.Send("A=1")} {
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, bad := range []string{"vsock:2:1234", "relative/notify"} {
		if _, err := New(bad, nil); !errors.Is(err, ErrUnsupportedSocket) {
			t.Errorf("New(%q): %v, want ErrUnsupportedSocket", bad, err)
		}
		t.Setenv(EnvSocket, bad)
		if n := FromEnv(debugLogger(&log)); n != nil {
			t.Errorf("FromEnv with %q: %v", bad, n)
		}
	}
	if !strings.Contains(log.String(), "systemd notifications off") {
		t.Errorf("an unusable NOTIFY_SOCKET is not logged: %q", log.String())
	}
}

// A service manager that stops reading cannot hold a sender past
// WriteTimeout, and the failure is logged at warn once, then at debug.
func TestNeverBlocks(t *testing.T) {
	sock := fakesystemd.Listen(t, false)
	var log logbuf.Buffer
	n, err := New(sock.Addr, debugLogger(&log))
	if err != nil {
		t.Fatal(err)
	}
	// Nothing reads: the socket's queue fills, then each send times out.
	var failures int
	for i := 0; failures < 3; i++ {
		if i > 100_000 {
			t.Fatal("the receive queue never filled")
		}
		start := time.Now()
		err := n.Status("clients 1/10")
		if took := time.Since(start); took > WriteTimeout+2*time.Second {
			t.Fatalf("send %d took %v", i, took)
		}
		if err != nil {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Fatalf("send %d: %v, want a timeout", i, err)
			}
			failures++
		}
	}
	if got := strings.Count(log.String(), "level=WARN"); got != 1 {
		t.Errorf("%d warnings for 3 failures, want 1: %s", got, log.String())
	}
	if got := strings.Count(log.String(), "level=DEBUG"); got != 2 {
		t.Errorf("%d debug lines for the 2 later failures, want 2: %s", got, log.String())
	}
}

// A socket that is gone fails at once.
func TestSocketGone(t *testing.T) {
	n, err := New(t.TempDir()+"/none", nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := n.Ready(""); err == nil || time.Since(start) > time.Second {
		t.Fatalf("Ready to a missing socket: %v after %v", err, time.Since(start))
	}
}

// STATUS= stays one line of valid UTF-8 within MaxStatus bytes.
func TestCleanStatus(t *testing.T) {
	long := strings.Repeat("é", MaxStatus) // 2 bytes each
	for _, tc := range []struct{ in, want string }{
		{"clients 1/10", "clients 1/10"},
		{"a\nREADY=1\r\nb\rc", "a READY=1 b c"},
		{"bad \xff byte", "bad ? byte"},
		{long, long[:MaxStatus]},
		{"x" + long, "x" + long[:MaxStatus-2]},
	} {
		if got := CleanStatus(tc.in); got != tc.want {
			t.Errorf("CleanStatus(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func debugLogger(b *logbuf.Buffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}
