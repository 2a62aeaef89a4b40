package proxy

// The io_uring driver's placement of clients (internal/evloop's
// place_linux.go), seen from the clients of a server: packed under a light
// load, spread off a busy thread, counted while connected.

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/evloop"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/wait"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// placeRig is a loop rig on io_uring whose two threads' utilisations the
// test sets.
func placeRig(t *testing.T, maxPool int) (*loopRig, *evloop.Loop) {
	t.Helper()
	if !evloop.RingSupported() {
		t.Skip("the kernel refuses io_uring here")
	}
	r := newLoopRig(t, LoopIOUring, maxPool, func(*fakemongo.Request) fakemongo.Reply { return fakemongo.OK() })
	l := r.s.loopsFor()
	if l.IO() != evloop.IOUring || l.Threads() != 2 {
		t.Fatalf("loop on %s with %d threads, want io_uring with 2", l.IO(), l.Threads())
	}
	return r, l
}

// force pins the threads' utilisations, in thousandths.
func force(d *evloop.Loop, utils ...int32) { d.ForceUtil(utils...) }

// homes returns, per thread, the clients whose receive is armed there.
func homes(r *loopRig, d *evloop.Loop) []int {
	n := make([]int, d.Threads())
	for _, c := range r.s.snapshot() {
		c.lc.Mu.Lock()
		if th, armed := c.lc.Home(); th >= 0 && armed && c.lc.State == lsIdle {
			n[th]++
		}
		c.lc.Mu.Unlock()
	}
	return n
}

// armed waits until all n clients are idle with a receive armed, and
// returns how many are on each thread.
func armed(t *testing.T, r *loopRig, d *evloop.Loop, n int) []int {
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
			if n := d.HomeCounts(); n[0] != 4 || n[1] != 0 {
				t.Fatalf("client counts %d and %d, want 4 and 0", n[0], n[1])
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
	count := func() int32 { n := d.HomeCounts(); return n[0] + n[1] }
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
