package session

// The session's rules on its own: when a pin stays and when it goes back,
// what SHOW CLIENTS reads, when a drain waits, and a load-balanced client's
// cursors. Connections come from a real pool over a connector that dials
// nothing, so a pin given back shows in the pool's in-use count.

import (
	"context"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/routing"
)

type nopUpstream struct{ pool.Upstream }

func (nopUpstream) Close() error { return nil }

type nopConnector struct{}

func (nopConnector) Connect(context.Context, string, int64) (pool.Upstream, error) {
	return nopUpstream{}, nil
}

// testPool is a ready pool whose connections dial nothing.
func testPool(t *testing.T) *pool.Pool {
	t.Helper()
	o := pool.DefaultOptions()
	o.MaintenanceInterval = -1
	p, err := pool.New("127.0.0.1:27017", nopConnector{}, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	if err := p.Ready(); err != nil {
		t.Fatal(err)
	}
	return p
}

func checkOut(t *testing.T, p *pool.Pool) *pool.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pc, err := p.CheckOut(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return pc
}

func inUse(p *pool.Pool) int { return int(p.Stats().InUse) }

func route(mode config.PoolMode) *routing.Route {
	r := &routing.Route{Name: "r"}
	r.SetPoolMode(mode)
	return r
}

var key = command.TxnKey{LSID: [16]byte{1}, Txn: 1}

// A transaction-mode pin stays while its transaction is open and the
// client between requests (SHOW CLIENTS: pinned), and goes back to the pool
// when the transaction ends through another client while this one is idle.
func TestTransactionPinGoesBackWhenTheTransactionEnds(t *testing.T) {
	p, r := testPool(t), route(config.PoolModeTransaction)
	var ss Session
	ss.Start(r)
	pc := checkOut(t, p)
	ss.SetPin(r, nil, pc)
	ss.SetOpen(key, r)
	if got := ss.State(); got != StateActive {
		t.Fatalf("state %v during the request, want active", got)
	}
	if !ss.Replying(r, pc, true) {
		t.Fatal("the pin of an open transaction was dropped at the reply")
	}
	if back := ss.Idle(); len(back) != 0 {
		t.Fatalf("Idle gave back %d pins of an open transaction", len(back))
	}
	if got := ss.State(); got != StatePinned {
		t.Fatalf("state %v idle with a pin, want pinned", got)
	}
	if !ss.Busy() || !ss.HasPinOrOpen() || ss.OpenRoute(key) != r || !ss.IsOpen(key) {
		t.Fatal("an open transaction is not seen")
	}
	ss.TxnEnded(key)
	if n := inUse(p); n != 0 {
		t.Fatalf("%d connections in use after the transaction ended, want the pin back", n)
	}
	if ss.HasPin() || ss.Busy() || ss.State() != StateIdle {
		t.Fatalf("pinned %v, busy %v, state %v after the end: want none, idle", ss.HasPin(), ss.Busy(), ss.State())
	}
	if ss.Requests() != 1 || ss.LastRoute() != r {
		t.Fatalf("requests %d, last route %v: want 1, r", ss.Requests(), ss.LastRoute())
	}
}

// A transaction that ends while the client is busy leaves its pin to the
// client's request, whose end (Idle) gives it back.
func TestTransactionEndedWhileBusyLeavesThePinToTheRequest(t *testing.T) {
	p, r := testPool(t), route(config.PoolModeTransaction)
	var ss Session
	ss.Start(r)
	pc := checkOut(t, p)
	ss.SetPin(r, nil, pc)
	ss.SetOpen(key, r)
	ss.TxnEnded(key)
	if _, ok := ss.Pinned(r); !ok {
		t.Fatal("the pin of a busy client was taken by the end of its transaction")
	}
	back := ss.Idle()
	if len(back) != 1 || back[0].Conn != pc {
		t.Fatalf("Idle gave back %v, want the pin", back)
	}
	CheckIn(back)
	if n := inUse(p); n != 0 {
		t.Fatalf("%d connections in use, want 0", n)
	}
}

// A session-mode pin stays for the client's life: through replies, the
// end of requests and of transactions, until TakePins.
func TestSessionPinStays(t *testing.T) {
	p, r := testPool(t), route(config.PoolModeSession)
	var ss Session
	ss.Start(r)
	pc := checkOut(t, p)
	ss.SetPin(r, nil, pc)
	ss.SetOpen(key, r)
	if !ss.Replying(r, pc, true) {
		t.Fatal("a session-mode pin was dropped at the reply")
	}
	ss.TxnEnded(key)
	if back := ss.Idle(); len(back) != 0 {
		t.Fatalf("Idle gave back %d session-mode pins", len(back))
	}
	if _, ok := ss.Pinned(r); !ok || inUse(p) != 1 {
		t.Fatal("the session-mode pin is gone")
	}
	CheckIn(ss.TakePins())
	if n := inUse(p); n != 0 || ss.HasPinSlots() {
		t.Fatalf("%d in use, slots %v after TakePins: want 0, none", n, ss.HasPinSlots())
	}
}

// A pin without a transaction goes back at the reply; a failed connection
// is unpinned whatever the mode.
func TestReplyAndFailureUnpin(t *testing.T) {
	p := testPool(t)
	tr, sr := route(config.PoolModeTransaction), route(config.PoolModeSession)
	var ss Session
	a, b := checkOut(t, p), checkOut(t, p)
	ss.SetPin(tr, nil, a)
	ss.SetPin(sr, nil, b)
	if ss.Replying(tr, a, true) {
		t.Fatal("a transaction-mode pin with no transaction open stayed at the reply")
	}
	ss.UnpinReplying(sr, b)
	if ss.HasPin() || ss.PinnedElsewhere(sr, nil) {
		t.Fatal("pins remain after the reply and the failure")
	}
	if ss.Phase() != PhaseReplying || ss.State() != StateActive {
		t.Fatalf("phase %v, state %v: want replying, active", ss.Phase(), ss.State())
	}
	CheckIn([]Pin{{Route: tr, Conn: a}, {Route: sr, Conn: b}})
}

// A reload's stale pins go back, unless a transaction still needs them.
func TestStalePinsSpareOpenTransactions(t *testing.T) {
	p := testPool(t)
	old1, old2 := route(config.PoolModeSession), route(config.PoolModeSession)
	var ss Session
	ss.SetPin(old1, nil, checkOut(t, p))
	ss.SetPin(old2, nil, checkOut(t, p))
	ss.SetOpen(key, old2)
	back := ss.TakeStalePins(func(*routing.Route) bool { return true })
	if len(back) != 1 || back[0].Route != old1 {
		t.Fatalf("stale pins %v, want old1's only", back)
	}
	CheckIn(back)
	if _, ok := ss.Pinned(old2); !ok || inUse(p) != 1 {
		t.Fatal("the pin of an open transaction was taken as stale")
	}
	if open := ss.TakeOpen(); open[key] != old2 {
		t.Fatalf("TakeOpen = %v", open)
	}
	CheckIn(ss.TakePins())
}

// Undo takes back a request's start.
func TestUndo(t *testing.T) {
	var ss Session
	r := route(config.PoolModeTransaction)
	ss.Start(r)
	ss.Undo()
	if ss.Requests() != 0 || ss.Busy() || ss.State() != StateIdle {
		t.Fatalf("requests %d, busy %v, state %v after Undo", ss.Requests(), ss.Busy(), ss.State())
	}
}

// A load-balanced client's cursors are remembered until exhausted or
// killed, and a drain lets their getMores through and waits for them; a
// plain client's are not.
func TestLoadBalancedCursors(t *testing.T) {
	find := &command.Request{Info: command.Info{Name: "find"}}
	getMore := &command.Request{Info: command.Info{Name: "getMore", Kind: command.GetMore}, CursorID: 7}
	var plain Session
	plain.NoteLBCursor(find, command.Reply{OK: true, CursorID: 7}, nil)
	if plain.DrainFinishesCursor(getMore) || plain.Busy() {
		t.Fatal("a plain client's cursor is waited for")
	}
	var lb Session
	lb.SetHelloInfo("app", true)
	lb.NoteLBCursor(find, command.Reply{OK: true, CursorID: 7}, nil)
	if !lb.DrainFinishesCursor(getMore) || !lb.Busy() {
		t.Fatal("a load-balanced client's open cursor is not let through or waited for")
	}
	lb.NoteLBCursor(getMore, command.Reply{OK: true, CursorID: 0}, nil)
	if lb.DrainFinishesCursor(getMore) || lb.Busy() {
		t.Fatal("an exhausted cursor is still waited for")
	}
	lb.SetUser("u@admin")
	if in := lb.Describe(); in != (Info{AppName: "app", User: "u@admin", LoadBalanced: true}) {
		t.Fatalf("Describe = %+v", in)
	}
}
