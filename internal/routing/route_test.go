package routing

// The pause gate, the live settings, and the table's checks and lookups.

import (
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/config"
)

// A paused route holds WaitGate until Resume, or until stop closes.
func TestPauseGate(t *testing.T) {
	r := &Route{Name: "r"}
	if !r.WaitGate(nil) {
		t.Fatal("an open gate refused")
	}
	r.Pause()
	r.Pause() // twice is once
	if !r.Paused() {
		t.Fatal("not paused after Pause")
	}
	done := make(chan bool, 1)
	go func() { done <- r.WaitGate(nil) }()
	select {
	case <-done:
		t.Fatal("WaitGate returned while paused")
	case <-time.After(50 * time.Millisecond):
	}
	r.Resume()
	select {
	case ok := <-done:
		if !ok {
			t.Fatal("WaitGate refused after Resume")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitGate still waiting after Resume")
	}
	if r.Paused() {
		t.Fatal("paused after Resume")
	}
	r.Pause()
	stop := make(chan struct{})
	close(stop)
	if r.WaitGate(stop) {
		t.Fatal("WaitGate let a request through a paused route at shutdown")
	}
}

// The pool mode and the limits are the configured ones until changed live;
// "" is transaction, and a mode config does not define changes nothing.
func TestLiveSettings(t *testing.T) {
	r := testRoute(t, nil)
	if m := r.PoolMode(); m != config.PoolModeTransaction {
		t.Fatalf(`Mode "": PoolMode %q`, m)
	}
	r.SetPoolMode(config.PoolModeSession)
	r.SetPoolMode("sessions")
	if m := r.PoolMode(); m != config.PoolModeSession {
		t.Fatalf("PoolMode %q, want session kept", m)
	}
	r.SetClientLimits(time.Minute, 1024)
	if r.IdleLimit() != time.Minute || r.MessageLimit() != 1024 {
		t.Fatalf("limits %v %d", r.IdleLimit(), r.MessageLimit())
	}
	if r.NoLoop() {
		t.Fatal("noLoop before SetNoLoop")
	}
	r.SetNoLoop()
	if !r.NoLoop() {
		t.Fatal("SetNoLoop not kept")
	}
}

// NewTable refuses what cannot route, keeps a carried-over route's state,
// and finds a database's route, else the catch-all.
func TestTable(t *testing.T) {
	a, b := testRoute(t, nil), testRoute(t, nil)
	a.Name, b.Name = "a", "*"
	for name, routes := range map[string][]*Route{
		"none":        nil,
		"nil route":   {nil},
		"no topology": {{Name: "x"}},
		"twice":       {a, a},
		"bad mode":    {{Name: "x", Topology: a.Topology, Mode: "sessions"}},
	} {
		if _, err := NewTable(routes, 1, 1); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	a.SetPoolMode(config.PoolModeStatement)
	cursors := a.Cursors()
	tb, err := NewTable([]*Route{a, b}, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	if a.PoolMode() != config.PoolModeStatement || a.Cursors() != cursors {
		t.Fatal("a route carried over into a new table lost its live state")
	}
	if tb.For([]byte("a")) != a || tb.For([]byte("other")) != b || tb.Named("*") != b || tb.Named("other") != nil {
		t.Fatal("lookups")
	}
	if len(tb.All()) != 2 {
		t.Fatalf("All: %d routes", len(tb.All()))
	}
}

// A route of one server remembers no cursor or transaction (every command
// goes to that server anyway); one that may have several remembers each
// until it is forgotten.
func TestRouteAffinity(t *testing.T) {
	one := testRoute(t, nil)
	if one.Multi() {
		t.Fatal("a single host is Multi")
	}
	one.SetCursorServer(7, nil)
	one.SetTxnServer(TxnKey{Txn: 1}, nil)
	if one.Cursors().Len() != 0 || one.txns.Len() != 0 {
		t.Fatal("a route of one server remembered affinity")
	}

	multi := multiRoute(t)
	srv := multi.Topology.Servers()[0]
	key := TxnKey{LSID: [16]byte{1}, Txn: 3}
	multi.SetCursorServer(7, srv)
	multi.SetTxnServer(key, srv)
	if multi.CursorServer(7) != srv || multi.TxnServer(key) != srv {
		t.Fatal("affinity not remembered")
	}
	if multi.CursorServer(8) != nil || multi.TxnServer(TxnKey{Txn: 3}) != nil {
		t.Fatal("affinity for what was never opened")
	}
	multi.ForgetCursor(7)
	multi.ForgetTxn(key)
	if multi.CursorServer(7) != nil || multi.TxnServer(key) != nil {
		t.Fatal("affinity kept after it was forgotten")
	}
}
