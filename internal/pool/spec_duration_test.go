package pool_test

import (
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/pool"
)

// checkoutWindow is one checkOut operation of the runner: from just before it
// called CheckOut to just after CheckOut returned.
type checkoutWindow struct {
	start, end time.Time
	done       bool  // CheckOut has returned (end and the outcome are set)
	connID     int64 // the connection it got, 0 if it failed
}

// startCheckout records that a checkOut operation is about to call CheckOut.
func (r *specRun) startCheckout() *checkoutWindow {
	w := &checkoutWindow{start: time.Now()}
	r.mu.Lock()
	r.checkouts = append(r.checkouts, w)
	r.mu.Unlock()
	return w
}

// endCheckout records CheckOut's return.
func (r *specRun) endCheckout(w *checkoutWindow, c *pool.Conn, err error) {
	end := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	w.end, w.done = end, true
	if err == nil {
		w.connID = c.ID()
	}
}

// checkoutWindows returns copies of the checkOut windows so far.
func (r *specRun) checkoutWindows() []checkoutWindow {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]checkoutWindow, len(r.checkouts))
	for i, w := range r.checkouts {
		out[i] = *w
	}
	return out
}

// checkDurations checks the duration of every ConnectionReady,
// ConnectionCheckedOut and ConnectionCheckOutFailed event, which the spec files
// only give as "any value". events is the whole stream (ignored types
// included), at[i] when the recorder received events[i], and windows the
// runner's checkOut operations.
//
// The bounds hold for any pool that measures as the spec says, not only for
// this one: a Monitor runs synchronously while the pool emits, so an event's
// receipt time lies after every clock read the pool made before emitting it
// and before every clock read it makes afterwards. Hence:
//
//   - ConnectionReady (created to ready, connection c): strictly positive, and
//     between at[ready-1] - at[created(c)] and at[ready] - at[created(c)-1].
//   - ConnectionCheckedOut and ConnectionCheckOutFailed (checkout started to
//     this event): never negative, and no longer than the time since the
//     earliest checkOut operation that could be this one started (one in
//     flight at the event that got this connection, or failed).
//   - Such an event is for a checkout that waited when an event other than
//     ConnectionClosed lies between it and the last ConnectionCheckOutStarted
//     before it (a checkout decided at once emits its started and final events
//     together, with only the perished connections it closed between). Then
//     the duration is strictly positive and at least at[event-1] - at[m],
//     m being the first event after that start that is not a
//     ConnectionClosed (the start may be read after closing the perished
//     connections); otherwise it is at most at[event] - at[lastStarted] (this
//     pool reports 0 there, see Event.Duration).
func checkDurations(t *testing.T, events []pool.Event, at []time.Time, windows []checkoutWindow) {
	t.Helper()
	for k, e := range events {
		d := e.Duration
		switch e.Type {
		case pool.ConnectionReady:
			ic := k - 1
			for ic >= 0 && (events[ic].Type != pool.ConnectionCreated || events[ic].ConnectionID != e.ConnectionID) {
				ic--
			}
			if ic < 1 {
				t.Errorf("event %d: ConnectionReady(%d) without a ConnectionCreated after the pool's first event", k, e.ConnectionID)
				continue
			}
			lo, hi := at[k-1].Sub(at[ic]), at[k].Sub(at[ic-1])
			if d <= 0 || d < lo || d > hi {
				t.Errorf("event %d: ConnectionReady(%d) duration %v, want > 0 and within [%v, %v]", k, e.ConnectionID, d, lo, hi)
			}
		case pool.ConnectionCheckedOut, pool.ConnectionCheckOutFailed:
			name := e.Type.String()
			if d < 0 {
				t.Errorf("event %d: %s duration %v is negative", k, name, d)
			}
			j := k - 1
			for j >= 0 && events[j].Type != pool.ConnectionCheckOutStarted {
				j--
			}
			if j < 0 {
				t.Errorf("event %d: %s without a ConnectionCheckOutStarted before it", k, name)
				continue
			}
			m := j + 1 // the first event after the last start that is not a ConnectionClosed
			for m < k && events[m].Type == pool.ConnectionClosed {
				m++
			}
			if m < k { // the checkout waited
				if lo := at[k-1].Sub(at[m]); d <= 0 || d < lo {
					t.Errorf("event %d: %s of a checkout that waited: duration %v, want > 0 and >= %v", k, name, d, lo)
				}
			} else if hi := at[k].Sub(at[j]); d > hi {
				t.Errorf("event %d: %s of a checkout decided at once: duration %v, want <= %v", k, name, d, hi)
			}
			var earliest time.Time
			for _, w := range windows {
				inFlight := !w.start.After(at[k]) && (!w.done || !w.end.Before(at[k]))
				outcome := !w.done || (e.Type == pool.ConnectionCheckedOut && w.connID == e.ConnectionID) ||
					(e.Type == pool.ConnectionCheckOutFailed && w.connID == 0)
				if inFlight && outcome && (earliest.IsZero() || w.start.Before(earliest)) {
					earliest = w.start
				}
			}
			if earliest.IsZero() {
				t.Errorf("event %d: %s while no checkOut operation that could have caused it was running", k, name)
			} else if hi := at[k].Sub(earliest); d > hi {
				t.Errorf("event %d: %s duration %v is longer than any checkout in flight (at most %v)", k, name, d, hi)
			}
		}
	}
}
