package pool

import "time"

// instant is a point in time on the monotonic clock, as an offset from the process's
// epoch; 0 means "not taken". Reading it costs one monotonic clock read, about half of
// time.Now (which also reads the wall clock), and it is read on the checkout path.
type instant time.Duration

// epoch anchors instants.
var epoch = time.Now()

// monoNow returns the current instant (never 0).
func monoNow() instant { return instant(time.Since(epoch)) + 1 }

// sub returns the duration from earlier to i.
func (i instant) sub(earlier instant) time.Duration { return time.Duration(i - earlier) }

// since returns the time elapsed since i.
func since(i instant) time.Duration { return monoNow().sub(i) }

// waited returns the time elapsed since start, or 0 when start was not taken:
// a checkout that never waited (see Pool.beginLocked).
func waited(start instant) time.Duration {
	if start == 0 {
		return 0
	}
	return since(start)
}
