package evloop

// The adaptive loop (adapt_linux.go): the load decides the driver, with
// hysteresis, and an endpoint moved between the drivers between its
// requests loses and repeats no byte.

import (
	"testing"
	"time"
)

// The choice follows the windows' mean of requests out: io_uring from
// hiLoad, epoll from loLoad down, and nothing changes between the marks.
func TestAdapterChoosesByLoad(t *testing.T) {
	a := &adapter{lite: &epollDriver{}, heavy: &ringDriver{}}
	now := time.Duration(0)
	// window ends a window of adaptWindow in which requests were out for
	// load × the window in all.
	window := func(load float64) {
		now += adaptWindow
		a.ended(now-time.Duration(load*float64(adaptWindow)), now)
	}
	steps := []struct {
		load  float64
		heavy bool
	}{
		{0.6, false}, // one client, one request at a time
		{2.9, false}, // under the high mark
		{3.5, true},  // three or more out: io_uring
		{2.0, true},  // between the marks: no change
		{1.6, true},
		{1.4, false}, // under the low mark: epoll again
		{2.5, false}, // between the marks
		{8, true},    // ten clients over a pool of ten
	}
	for i, s := range steps {
		window(s.load)
		if got := a.onHeavy.Load(); got != s.heavy {
			t.Fatalf("step %d (load %.1f): on io_uring %v, want %v", i, s.load, got, s.heavy)
		}
		if want := driver(a.lite); s.heavy {
			want = a.heavy
			if a.pick() != want {
				t.Fatalf("step %d: pick is not io_uring", i)
			}
		} else if a.pick() != want {
			t.Fatalf("step %d: pick is not epoll", i)
		}
	}
	if got := a.switches.Load(); got != 3 {
		t.Fatalf("%d switches, want 3", got)
	}
	// A request that ends within the window adds to it and decides nothing.
	a.ended(now, now+adaptWindow/2)
	if !a.onHeavy.Load() || a.switches.Load() != 3 {
		t.Fatal("a request within the window changed the choice")
	}
}

// An endpoint moves between the drivers at its requests' boundaries, each
// time the choice changes, whether its next request is already in the
// socket (pipelined) or not; every reply comes back whole and in order.
func TestAdaptiveLoopMovesAnEndpointBetweenDrivers(t *testing.T) {
	r := newEngineRig(t, IOAdaptive)
	a := r.l.adapt
	r.serveUpstream(t, 1004)
	_ = r.client.SetDeadline(time.Now().Add(20 * time.Second))
	sent := 0
	req := func() string {
		sent++
		return string([]byte{'a' + byte(sent%26), 'b', 'c', '0' + byte(sent%10)})
	}
	for round := range 20 {
		a.onHeavy.Store(round%2 == 1)
		// One at a time: the move happens as the endpoint waits for the
		// next request with nothing in its socket.
		for range 3 {
			q := req()
			if _, err := r.client.Write([]byte(q)); err != nil {
				t.Fatal(err)
			}
			expectReply(t, r.client, reverse(q))
		}
		a.onHeavy.Store(round%2 == 0)
		// Pipelined: the move happens with bytes already in the socket.
		q1, q2, q3 := req(), req(), req()
		if _, err := r.client.Write([]byte(q1 + q2 + q3)); err != nil {
			t.Fatal(err)
		}
		for _, q := range []string{q1, q2, q3} {
			expectReply(t, r.client, reverse(q))
		}
	}
	// A change takes effect at the endpoint's next wait for a request
	// with an empty window, which a pipelined batch defers by a request.
	if m := a.moves.Load(); m < 10 {
		t.Fatalf("the endpoint moved %d times in 40 changes of the choice, want at least 10", m)
	}
	for _, heavy := range []bool{true, false} {
		a.onHeavy.Store(heavy)
		for range 2 {
			q := req()
			if _, err := r.client.Write([]byte(q)); err != nil {
				t.Fatal(err)
			}
			expectReply(t, r.client, reverse(q))
		}
		want := driver(a.lite)
		if heavy {
			want = a.heavy
		}
		waitFor(t, "the endpoint on the chosen driver", func() bool {
			r.h.ep.Mu.Lock()
			defer r.h.ep.Mu.Unlock()
			return r.h.ep.lp.drv == want
		})
	}
	st, ok := r.l.Adaptive()
	if !ok || st.Moves != a.moves.Load() {
		t.Fatalf("Adaptive() = %+v, %v", st, ok)
	}
	r.client.Close()
	waitFor(t, "the endpoint closed", func() bool {
		r.h.mu.Lock()
		defer r.h.mu.Unlock()
		return r.h.ended
	})
}

// The upstream connection is in the epoll set only while epoll serves its
// request: a reply to a request sent on io_uring wakes no epoll thread.
func TestAdaptiveLoopKeepsUpstreamsOutOfEpollUnderLoad(t *testing.T) {
	r := newEngineRig(t, IOAdaptive)
	a := r.l.adapt
	r.serveUpstream(t, 10)
	_ = r.client.SetDeadline(time.Now().Add(10 * time.Second))
	a.onHeavy.Store(false)
	for _, q := range []string{"abcd", "efgh"} {
		if _, err := r.client.Write([]byte(q)); err != nil {
			t.Fatal(err)
		}
		expectReply(t, r.client, reverse(q))
	}
	r.h.ep.Mu.Lock()
	inSet := r.h.u.epoll.inSet
	r.h.ep.Mu.Unlock()
	if !inSet {
		t.Fatal("served by epoll, the upstream is not in the epoll set")
	}
	a.onHeavy.Store(true)
	for _, q := range []string{"ijkl", "mnop", "qrst"} {
		if _, err := r.client.Write([]byte(q)); err != nil {
			t.Fatal(err)
		}
		expectReply(t, r.client, reverse(q))
	}
	var onRing bool
	r.h.ep.Mu.Lock()
	inSet, onRing = r.h.u.epoll.inSet, r.h.ep.lp.drv == driver(a.heavy)
	r.h.ep.Mu.Unlock()
	if !onRing || inSet {
		t.Fatalf("under load: endpoint on io_uring %v, upstream in the epoll set %v; want true, false", onRing, inSet)
	}
}

// Served by epoll, the upstream joins the epoll set of the endpoint whose
// request it carries, and moves there from another thread's set, so that
// the reply wakes the thread that took the request and not a second one.
func TestAdaptiveLoopPutsTheUpstreamOnItsEndpointsThread(t *testing.T) {
	r := newEngineRig(t, IOAdaptive)
	a := r.l.adapt
	if len(a.lite.threads) < 2 {
		t.Fatalf("%d epoll threads, want 2", len(a.lite.threads))
	}
	r.serveUpstream(t, 10)
	_ = r.client.SetDeadline(time.Now().Add(10 * time.Second))
	a.onHeavy.Store(false)
	sets := func() (up, ep int, inSet bool) {
		r.h.ep.Mu.Lock()
		defer r.h.ep.Mu.Unlock()
		return r.h.u.epoll.set, r.h.ep.reg.(*epollClient).set, r.h.u.epoll.inSet
	}
	exchange := func(q string) {
		t.Helper()
		if _, err := r.client.Write([]byte(q)); err != nil {
			t.Fatal(err)
		}
		expectReply(t, r.client, reverse(q))
	}
	exchange("abcd")
	up, ep, inSet := sets()
	if !inSet || up != ep {
		t.Fatalf("after a request on epoll: upstream in set %d (in a set: %v), endpoint in %d; want the endpoint's", up, inSet, ep)
	}
	// The last user of the upstream was on the other thread: it is in
	// that thread's set.
	other := a.lite.threads[0].ep
	if other == ep {
		other = a.lite.threads[1].ep
	}
	r.h.ep.Mu.Lock()
	a.lite.leave(r.h.u)
	err := a.lite.join1(r.h.u.epoll, other)
	r.h.ep.Mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{"efgh", "ijkl"} {
		exchange(q)
		if up, ep, inSet := sets(); !inSet || up != ep {
			t.Fatalf("after %q: upstream in set %d (in a set: %v), endpoint in %d; want it moved to the endpoint's", q, up, inSet, ep)
		}
	}
}
