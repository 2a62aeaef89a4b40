package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/sdnotify"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakesystemd"
	"github.com/mongobouncer/mongobouncer/internal/testutil/logbuf"
)

// Started as systemd starts a Type=notify service (NOTIFY_SOCKET set, an
// abstract socket on Linux), mongobouncer sends from its own pid: READY=1
// once its listener takes clients, RELOADING=1 and READY=1 around a SIGHUP
// reload and around the admin reload command, and STOPPING=1 on SIGTERM,
// each with a STATUS= of clients, pools and routes.
func TestSystemdNotify(t *testing.T) {
	up := fakemongo.Start(t, fakemongo.Options{})
	sock := fakesystemd.Listen(t, runtime.GOOS == "linux")
	t.Setenv(sdnotify.EnvSocket, sock.Addr)
	listen := filepath.Join(t.TempDir(), "mb.sock")
	path := filepath.Join(t.TempDir(), "mb.toml")
	cfg := fmt.Sprintf("[mongobouncer]\nlisten = %q\nmax_client_conn = 100\n\n[databases.\"*\"]\nconnection_string = %q\n", listen, up.URI())
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errb logbuf.Buffer
	done := make(chan int, 1)
	go func() { done <- run([]string{"--config", path}, &out, &errb, nil) }()

	expect := func(what string, check func(m fakesystemd.Message) bool) fakesystemd.Message {
		t.Helper()
		m, _ := sock.Expect(t, 10*time.Second)
		if runtime.GOOS == "linux" && m.PID != os.Getpid() {
			t.Errorf("%q from pid %d, not the main pid %d", m.Text, m.PID, os.Getpid())
		}
		if !check(m) {
			t.Fatalf("notification %q, want %s; stderr %s", m.Text, what, errb.String())
		}
		return m
	}
	expect("READY=1", func(m fakesystemd.Message) bool {
		st, _ := m.Get("STATUS")
		return m.Has("READY=1") && strings.HasPrefix(st, "clients 0/100, pools 1, routes ")
	})
	// READY=1 means the listener is there: one dial, no retry.
	c, err := net.Dial("unix", listen)
	if err != nil {
		t.Fatalf("dial right after READY=1: %v", err)
	}
	defer c.Close()
	adminCommand(t, c, bson.D{{Key: "showPools", Value: 1}})

	reloaded := func(how string) {
		t.Helper()
		expect("RELOADING=1 after "+how, func(m fakesystemd.Message) bool {
			us, _ := m.Get("MONOTONIC_USEC")
			return m.Has("RELOADING=1") && us != ""
		})
		expect("READY=1 after "+how, func(m fakesystemd.Message) bool {
			// The route is ready once the monitor has found the upstream,
			// which a loaded machine may not have done by the first reload.
			return m.Has("READY=1") && (m.Has("STATUS=clients 1/100, pools 1, routes 1/1 ready") ||
				m.Has("STATUS=clients 1/100, pools 1, routes 0/1 ready"))
		})
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	reloaded("SIGHUP")
	if r := adminCommand(t, c, bson.D{{Key: "reload", Value: 1}}); okValue(r) != 1 {
		t.Fatalf("reload command: %v", r)
	}
	reloaded("the reload command")

	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	expect("STOPPING=1 with a draining status", func(m fakesystemd.Message) bool {
		return m.Text == "STOPPING=1\nSTATUS=clients 1/100, pools 1, routes 1/1 ready, draining" ||
			m.Text == "STOPPING=1\nSTATUS=clients 1/100, pools 1, routes 0/1 ready, draining"
	})
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d; stderr %s", code, errb.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("did not stop")
	}
}
