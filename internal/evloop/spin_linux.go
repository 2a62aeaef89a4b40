package evloop

// Waiting awake for a lone request's reply (io_uring driver). A loop
// thread whose one request in flight is its only work sleeps in
// io_uring_enter until the reply wakes it, and on a machine whose idle
// cores halt at once that wake-up is a good part of a fast upstream's
// round trip (docs/performance.md). So a thread with exactly one reply to
// wait for, whose replies have lately come back within Options.LoopSpin
// (event_loop_spin), polls its ring for up to that long instead of
// sleeping. Against an upstream whose replies take longer (a real server
// across a network) it never spins: the replies' own delay, as measured,
// keeps it asleep. Each turn of the spin is an io_uring_enter that runs
// the ring's deferred work: the kernel raises no flag in the ring's memory
// for it (docs/performance.md).

import (
	"time"
)

// spinState is a ring thread's view of its replies, touched by that
// thread only: out counts the receives of replies in flight on its ring,
// and avg is the moving average of the delay from a request's send to its
// reply's first bytes.
type spinState struct {
	out int
	avg time.Duration
}

// replied takes the delay of a reply whose request was sent at sentAt
// (monoNow; 0 when not measured) and whose first bytes came at now.
func (s *spinState) replied(sentAt, now time.Duration) {
	if sentAt <= 0 {
		return
	}
	d := now - sentAt
	if s.avg <= 0 {
		// The first reply sets the average: from 0, a slow upstream's
		// first few replies would each look fast enough to spin for.
		s.avg = max(d, 1)
		return
	}
	s.avg += (d - s.avg) / 8
}

// spinWait polls the ring, up to event_loop_spin, when the thread's one request in
// flight is worth waiting for awake. It reports whether completions are
// ready, so that the thread need not wait in Enter.
func (th *ringThread) spinWait() bool {
	s := &th.spin
	spinMax := th.d.spinMax
	if s.out != 1 || s.avg <= 0 || s.avg >= spinMax {
		return false
	}
	r := th.ring
	deadline := monoNow() + spinMax
	for {
		err := r.Enter(0)
		if r.Produced() {
			th.d.spins.Caught.Add(1)
			return true
		}
		if err != nil || monoNow() > deadline {
			th.d.spins.Missed.Add(1)
			return false
		}
	}
}
