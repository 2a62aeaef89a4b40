package app

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// writeStarRoute writes a configuration file at path with one "*" route to
// uri, listening on a free port.
func writeStarRoute(t *testing.T, path, uri string) {
	t.Helper()
	body := fmt.Sprintf("[mongobouncer]\nlisten = \"127.0.0.1:0\"\n[databases.\"*\"]\nconnection_string = %q\n", uri)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

// fileApp builds an App from a "*" route to uri written to a file, so that
// Reload re-reads it; it returns the file's path. The caller starts and
// closes the App.
func fileApp(t *testing.T, uri string) (*App, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "mb.toml")
	writeStarRoute(t, path, uri)
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return a, path
}

// A pause racing a reload that replaces its route lands on the route now
// configured, never on the one that left the table: that one's gate no
// resume reaches (resume acts on the table), so a request that chose the
// route before the switch would wait there until shutdown, and the route
// now configured would run unpaused. The hook holds the pause between
// finding its routes and acting on them while the reload runs.
func TestPauseRacingReloadPausesTheRouteNowConfigured(t *testing.T) {
	up1 := fakemongo.Start(t, fakemongo.Options{})
	up2 := fakemongo.Start(t, fakemongo.Options{})
	a, path := fileApp(t, up1.URI())
	t.Cleanup(func() { closeApp(a) })
	a.Start()
	old := a.server.Route("*")

	writeStarRoute(t, path, up2.URI()) // a new upstream: the reload replaces the route
	reloaded := make(chan error, 1)
	testHookSetGate = func() {
		go func() { reloaded <- a.Reload() }()
		// Long enough for the reload to run through, unless the pause
		// holds it back.
		select {
		case err := <-reloaded:
			reloaded <- err
		case <-time.After(300 * time.Millisecond):
		}
	}
	defer func() { testHookSetGate = nil }()
	if err := a.Pause("*"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-reloaded:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("reload did not end")
	}
	now := a.server.Route("*")
	if now == old {
		t.Fatal("the reload did not replace the route")
	}
	if !now.Paused() {
		t.Error("the route now configured is not paused")
	}
	if old.Paused() {
		t.Error("the replaced route was left paused, out of every resume's reach")
	}
}

// A reload that reaches apply once the App has closed its routes (an
// admin reload still running when the admin listener's shutdown gave up on
// it, or queued behind another on reloadMu) changes nothing: it would
// otherwise build every route anew, and their topologies (monitors, pools,
// SRV polling) would run on after Close, which nothing closes.
func TestReloadAfterCloseBuildsNothing(t *testing.T) {
	up := fakemongo.Start(t, fakemongo.Options{})
	a, _ := fileApp(t, up.URI())
	a.Start()
	closeApp(a)
	if err := a.Reload(); !errors.Is(err, ErrClosed) {
		t.Errorf("reload after Close: %v, want ErrClosed", err)
	}
	if ts := a.Topologies(); len(ts) != 0 {
		for _, tp := range ts {
			tp.Close()
		}
		t.Fatalf("reload after Close built %d topologies that nothing closes", len(ts))
	}
}
