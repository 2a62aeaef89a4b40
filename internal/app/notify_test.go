package app

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/sdnotify"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakesystemd"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// Under systemd (Options.Notify): nothing before Start; READY=1 once the
// listener serves; STATUS= with clients, pools and routes every
// StatusInterval; RELOADING=1 (with MONOTONIC_USEC) then READY=1 around a
// reload, from Reload and from the admin reload command, failed or not;
// STOPPING=1 when the drain starts; nothing once closed.
func TestSystemdNotifications(t *testing.T) {
	up := fakemongo.Start(t, fakemongo.Options{})
	sock := fakesystemd.Listen(t, false)
	n, err := sdnotify.New(sock.Addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "mb.toml")
	write := func(maxClients int, extra string) {
		t.Helper()
		body := fmt.Sprintf("[mongobouncer]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nmax_client_conn = %d\n%s\n[databases.\"*\"]\nconnection_string = %q\n", maxClients, extra, up.URI())
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(50, "")
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewWithOptions(cfg, Options{Notify: n, StatusInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeApp(a) })
	sock.None(t, 200*time.Millisecond)

	a.Start()
	m, _ := sock.Expect(t, 5*time.Second)
	status, _ := m.Get("STATUS")
	if !m.Has("READY=1") || !regexp.MustCompile(`^clients 0/50, pools 1, routes [01]/1 ready$`).MatchString(status) {
		t.Fatalf("first notification %q, want READY=1 with the status", m.Text)
	}
	// The listener serves as soon as READY=1 is out: no retry.
	c, err := net.DialTimeout("tcp", a.Addrs()[0].String(), 2*time.Second)
	if err != nil {
		t.Fatalf("dial right after READY=1: %v", err)
	}
	defer c.Close()
	pingOn(t, c)

	// The periodic status counts the client.
	waitStatus(t, sock, "clients 1/50, pools 1, routes 1/1 ready")

	reload := func(how func() error, wantErr bool) fakesystemd.Message {
		t.Helper()
		if err := how(); (err != nil) != wantErr {
			t.Fatalf("reload: %v, want an error: %v", err, wantErr)
		}
		m, _ := sock.Expect(t, 5*time.Second)
		st, _ := m.Get("STATUS")
		us, _ := m.Get("MONOTONIC_USEC")
		if !m.Has("RELOADING=1") || us == "" || !strings.HasSuffix(st, ", reloading") {
			t.Fatalf("notification %q, want RELOADING=1, MONOTONIC_USEC= and a status saying reloading", m.Text)
		}
		m, _ = sock.Expect(t, 5*time.Second)
		if !m.Has("READY=1") {
			t.Fatalf("notification %q after RELOADING=1, want READY=1", m.Text)
		}
		return m
	}
	write(60, "")
	if m := reload(a.Reload, false); !m.Has("STATUS=clients 1/60, pools 1, routes 1/1 ready") {
		t.Fatalf("after the reload: %q, want the new max_client_conn in the status", m.Text)
	}
	// A reload that fails still ends with READY=1: the running
	// configuration is served. The status says so until one succeeds.
	write(70, "max_pool = 3\n")
	adminReload := func() error {
		resp, err := http.Post("http://"+a.AdminAddr().String()+"/admin/reload", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("admin reload: %s", resp.Status)
		}
		return nil
	}
	if m := reload(adminReload, true); !m.Has("STATUS=clients 1/60, pools 1, routes 1/1 ready, last reload failed") {
		t.Fatalf("after a failed reload: %q, want the running max_client_conn and the failure", m.Text)
	}
	waitStatus(t, sock, "clients 1/60, pools 1, routes 1/1 ready, last reload failed")
	write(80, "")
	if m := reload(adminReload, false); !m.Has("STATUS=clients 1/80, pools 1, routes 1/1 ready") {
		t.Fatalf("after a good reload: %q", m.Text)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.GracefulClose(ctx); err != nil {
		t.Fatal(err)
	}
	m, _ = sock.Expect(t, time.Second)
	if m.Text != "STOPPING=1\nSTATUS=clients 1/80, pools 1, routes 1/1 ready, draining" {
		t.Fatalf("at shutdown: %q, want STOPPING=1 with a draining status", m.Text)
	}
	// Periodic statuses sent during the drain (every 50 ms here) are
	// queued already, since GracefulClose has returned; each says
	// draining. After them, the periodic status has stopped with the App.
	for {
		m, err := sock.Next(20 * time.Millisecond)
		if err != nil {
			break
		}
		if !m.StatusOnly() || !strings.HasSuffix(m.Text, ", draining") {
			t.Fatalf("during the drain: %q, want only statuses saying draining", m.Text)
		}
	}
	sock.None(t, 300*time.Millisecond)
}

// A reload during the drain (the admin reload command is still served)
// sends no READY=1: systemd would take the service for running again.
func TestReloadWhileDrainingIsNotReady(t *testing.T) {
	up := fakemongo.Start(t, fakemongo.Options{})
	release := make(chan struct{})
	up.Handle("ping", func(req *fakemongo.Request) fakemongo.Reply {
		select {
		case <-release:
		case <-time.After(30 * time.Second):
		}
		return up.Builtin(req)
	})
	sock := fakesystemd.Listen(t, false)
	n, err := sdnotify.New(sock.Addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "mb.toml")
	body := fmt.Sprintf("[mongobouncer]\nlisten = \"127.0.0.1:0\"\n[databases.\"*\"]\nconnection_string = %q\n", up.URI())
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewWithOptions(cfg, Options{Notify: n, StatusInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeApp(a) })
	a.Start()
	if m, _ := sock.Expect(t, 5*time.Second); !m.Has("READY=1") {
		t.Fatalf("at start: %q", m.Text)
	}
	// A request in flight holds the drain open.
	c := pingInFlight(t, a, up)
	closed := startGracefulClose(a)
	if m, _ := sock.Expect(t, 5*time.Second); !m.Has("STOPPING=1") {
		t.Fatalf("at shutdown: %q", m.Text)
	}
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	if m, _ := sock.Expect(t, 5*time.Second); !m.Has("RELOADING=1") {
		t.Fatalf("reload: %q", m.Text)
	}
	m, err := sock.Next(5 * time.Second)
	if err != nil || m.Text != "STATUS=clients 1/10000, pools 1, routes 1/1 ready, draining" {
		t.Fatalf("after a reload during the drain: %q (%v), want the status alone", m.Text, err)
	}
	close(release)
	if _, err := wire.ReadMessage(c, nil, wire.DefaultMaxMessageSize); err != nil {
		t.Fatalf("the request in flight: %v", err)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}

// Without Options.Notify nothing is sent and Reload still works.
func TestNoNotifierReloads(t *testing.T) {
	up := fakemongo.Start(t, fakemongo.Options{})
	a, _ := fileApp(t, up.URI())
	a.Start()
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	closeApp(a)
}

// waitStatus waits for a STATUS= update equal to want.
func waitStatus(t *testing.T, sock *fakesystemd.Socket, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var seen []string
	for time.Now().Before(deadline) {
		m, err := sock.Next(time.Until(deadline))
		if err != nil {
			break
		}
		if m.Text == "STATUS="+want {
			return
		}
		seen = append(seen, m.Text)
	}
	t.Fatalf("no STATUS=%s; saw %q", want, seen)
}

// pingOn runs one ping through c, a connection the caller keeps.
func pingOn(t *testing.T, c net.Conn) {
	t.Helper()
	body, err := bson.Marshal(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "test"}})
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(wire.AppendMsg(nil, 1, 0, 0, body)); err != nil {
		t.Fatal(err)
	}
	if _, err := wire.ReadMessage(c, nil, wire.DefaultMaxMessageSize); err != nil {
		t.Fatal(err)
	}
}
