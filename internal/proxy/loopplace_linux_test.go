package proxy

import (
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/wait"
	"github.com/mongobouncer/mongobouncer/internal/uring"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// The placement decision, over utilisations in thousandths.
func TestPlace(t *testing.T) {
	for _, tc := range []struct {
		name                      string
		atHome                    bool
		here, home, least, packTo int
		want                      placement
	}{
		// Running another thread's client.
		{"light, as busy as the home: takes it", false, 200, 200, 0, -1, placeHere},
		{"light, busier than the home: takes it", false, 300, 100, 0, -1, placeHere},
		{"light, less busy than the home: leaves it", false, 100, 300, 0, -1, placeHome},
		{"idle, the home asleep: takes it", false, 0, 0, 0, -1, placeHere},
		{"at the low mark: takes no more", false, lowMark, 100, 0, -1, placeHome},
		{"between the marks: takes no more", false, 800, 100, 0, -1, placeHome},
		{"light, the home over the high mark: takes it", false, 100, 950, 0, -1, placeHere},
		{"over the low mark, the home over the high mark: leaves it", false, 800, 950, 0, -1, placeHome},
		// Arming its own client.
		{"over the high mark, another light: spreads", true, 950, 950, 100, 100, placeSpread},
		{"at the high mark: keeps it", true, highMark, highMark, 100, 100, placeHome},
		{"between the marks: keeps it", true, 800, 800, 0, 0, placeHome},
		{"over the high mark, every other busy: keeps it", true, 950, 950, lowMark, -1, placeHome},
		{"light, a busier one light too: packs", true, 200, 200, 0, 300, placePack},
		{"light, the others less busy: keeps it", true, 300, 300, 0, 200, placeHome},
		{"light, the other as busy: keeps it", true, 300, 300, 300, 300, placeHome},
		{"light, no other light: keeps it", true, 300, 300, 800, -1, placeHome},
	} {
		if got := place(tc.atHome, tc.here, tc.home, tc.least, tc.packTo); got != tc.want {
			t.Errorf("%s: place(%v, %d, %d, %d, %d) = %d, want %d", tc.name, tc.atHome, tc.here, tc.home, tc.least, tc.packTo, got, tc.want)
		}
	}
}

// A thread's published utilisation reads as idle once two windows passed
// without one (the thread sleeps); a forced one wins; the move budget is
// a share of the thread's clients, with a floor.
func TestThreadLoad(t *testing.T) {
	var tl threadLoad
	at := 10 * time.Second
	tl.util.Store(uint64(at/time.Millisecond)<<16 | 640)
	for _, tc := range []struct {
		now  time.Duration
		want int
	}{
		{at, 640},
		{at + 2*utilWindow, 640},
		{at + 2*utilWindow + time.Millisecond, 0},
	} {
		if got := tl.utilAt(tc.now); got != tc.want {
			t.Errorf("utilAt(%v) = %d, want %d", tc.now, got, tc.want)
		}
	}
	tl.forced.Store(951)
	if got := tl.utilAt(at + time.Hour); got != 950 {
		t.Errorf("forced: utilAt = %d, want 950", got)
	}
	for _, tc := range []struct{ clients, want int32 }{{0, minMoves}, {8 * minMoves, minMoves}, {1000, 1000 / moveShare}} {
		tl.clients.Store(tc.clients)
		if got := tl.moveBudget(); got != tc.want {
			t.Errorf("%d clients: budget %d, want %d", tc.clients, got, tc.want)
		}
	}
	// The thread's CPU clock runs: a busy loop moves it.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start := threadCPU()
	for deadline := time.Now().Add(20 * time.Millisecond); time.Now().Before(deadline); {
	}
	if threadCPU() <= start {
		t.Error("the thread CPU clock did not advance over 20 ms of work")
	}
}

// placeRig is a loop rig on io_uring whose two threads' utilisations the
// test sets.
func placeRig(t *testing.T, maxPool int) (*loopRig, *ringDriver) {
	t.Helper()
	if !uring.Supported() {
		t.Skip("the kernel refuses io_uring here")
	}
	r := newLoopRig(t, LoopIOAuto, maxPool, func(*fakemongo.Request) fakemongo.Reply { return fakemongo.OK() })
	l := r.s.loopsFor()
	d, ok := l.drv.(*ringDriver)
	if !ok || len(d.threads) != 2 {
		t.Fatalf("loop on %T with %d threads, want io_uring with 2", l.drv, l.threads)
	}
	return r, d
}

// force pins the threads' utilisations, in thousandths.
func force(d *ringDriver, utils ...int32) {
	for i, u := range utils {
		d.threads[i].load.forced.Store(u + 1)
	}
}

// homes returns, per thread, the clients whose receive is armed there.
func homes(r *loopRig, d *ringDriver) []int {
	n := make([]int, len(d.threads))
	for _, c := range r.s.snapshot() {
		c.lc.ownMu.Lock()
		if rc, ok := c.lc.sock.(*ringClient); ok && rc.armed && c.lc.state == lsIdle {
			for i, th := range d.threads {
				if rc.home == th {
					n[i]++
				}
			}
		}
		c.lc.ownMu.Unlock()
	}
	return n
}

// armed waits until all n clients are idle with a receive armed, and
// returns how many are on each thread.
func armed(t *testing.T, r *loopRig, d *ringDriver, n int) []int {
	t.Helper()
	var got []int
	wait.Until(t, "every client armed", 10*time.Second, time.Millisecond, func() bool {
		got = homes(r, d)
		sum := 0
		for _, k := range got {
			sum += k
		}
		return sum == n
	})
	return got
}

// pingAll sends each client's pings at the same time, rounds of them.
// The goroutines report failures with Error (Fatal must not leave them).
func pingAll(t *testing.T, cls []*affConn, rounds int) {
	t.Helper()
	body := mustDoc(t, ping())
	var wg sync.WaitGroup
	for i, cl := range cls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msg := wire.AppendMsg(nil, int32(i+100), 0, 0, body)
			_ = cl.c.SetDeadline(time.Now().Add(10 * time.Second))
			for range rounds {
				if _, err := cl.c.Write(msg); err != nil {
					t.Errorf("client %d: write: %v", i, err)
					return
				}
				rep, err := wire.ReadMessage(cl.c, nil, wire.DefaultMaxMessageSize)
				if err == nil {
					var m wire.Msg
					if err = wire.ParseMsgInto(rep, &m); err == nil {
						if v, lerr := bson.Raw(m.Body).LookupErr("ok"); lerr != nil || v.AsFloat64() != 1 {
							err = fmt.Errorf("not ok: %v", bson.Raw(m.Body))
						}
					}
				}
				if err != nil {
					t.Errorf("client %d: reply: %v", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
}

// Under a light load, the clients of both threads end up on one. Four
// clients, two homed on each thread (round-robin), thread 0 the busier,
// both under the low mark. Over a pool of one, requests that waited resume
// on the thread that checked the connection in, which takes their clients
// when it is thread 0; over a pool of four, requests stay on their
// client's home thread, and thread 1 gives its clients to thread 0 as it
// arms them.
func TestRingPacksClientsUnderLightLoad(t *testing.T) {
	for _, pool := range []int{1, 4} {
		t.Run(fmt.Sprintf("pool=%d", pool), func(t *testing.T) {
			r, d := placeRig(t, pool)
			// As busy as each other, the threads keep the clients they
			// arm for the first time.
			force(d, 200, 200)
			cls := make([]*affConn, 4)
			for i := range cls {
				cls[i] = r.client(0)
			}
			if got := armed(t, r, d, 4); got[0] != 2 || got[1] != 2 {
				t.Fatalf("clients armed per thread %v, want 2 and 2 before any request", got)
			}
			force(d, 300, 200)
			wait.Until(t, "every client packed onto thread 0", 20*time.Second, time.Millisecond, func() bool {
				pingAll(t, cls, 5)
				got := armed(t, r, d, 4)
				return got[0] == 4 && got[1] == 0
			})
			if n0, n1 := d.threads[0].load.clients.Load(), d.threads[1].load.clients.Load(); n0 != 4 || n1 != 0 {
				t.Fatalf("client counts %d and %d, want 4 and 0", n0, n1)
			}
		})
	}
}

// A thread over the high mark gives its clients to a thread under the low
// mark, whichever it is; clients then stay while neither is over it.
func TestRingSpreadsClientsOffABusyThread(t *testing.T) {
	r, d := placeRig(t, 4)
	force(d, 950, 100)
	cls := make([]*affConn, 4)
	for i := range cls {
		cls[i] = r.client(0)
	}
	for _, busy := range []int{0, 1} {
		if busy == 1 {
			force(d, 100, 950)
		}
		light := 1 - busy
		wait.Until(t, "every client moved off the busy thread", 20*time.Second, time.Millisecond, func() bool {
			pingAll(t, cls, 2)
			got := armed(t, r, d, 4)
			return got[light] == 4 && got[busy] == 0
		})
	}
	// Between the marks, nothing moves.
	force(d, 800, 100)
	pingAll(t, cls, 5)
	if got := armed(t, r, d, 4); got[0] != 4 {
		t.Fatalf("clients armed per thread %v, want all 4 to stay on thread 0", got)
	}
}

// Clients that leave stop counting on their home thread.
func TestRingClientCountFollowsClose(t *testing.T) {
	r, d := placeRig(t, 1)
	cls := make([]*affConn, 3)
	for i := range cls {
		cls[i] = r.client(0)
	}
	pingAll(t, cls, 3)
	count := func() int32 { return d.threads[0].load.clients.Load() + d.threads[1].load.clients.Load() }
	if got := count(); got != 3 {
		t.Fatalf("%d clients counted, want 3", got)
	}
	for _, cl := range cls {
		cl.c.Close()
	}
	wait.Until(t, "clients gone and uncounted", 10*time.Second, time.Millisecond, func() bool {
		return r.s.ClientCount() == 0 && count() == 0
	})
}
