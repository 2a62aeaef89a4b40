package evloop

// Where the io_uring driver arms a client's next receive: clients are
// packed onto the loop threads that have headroom, and spread again when a
// thread runs out of it.
//
// A client's receives go on its home thread's ring. Its request, once
// received, often runs elsewhere: a request that waited for a connection
// resumes on whichever thread checked one in, and its reply arrives on the
// thread that sent it. Arming the client's next receive back at its home
// is then a post to that thread's queue and, when it sleeps, a write to
// its eventfd that wakes it. On a machine whose cores are shared with the
// load and the upstream, two half-idle loop threads that keep waking each
// other cost more CPU per request than one busy thread (docs/performance.md,
// issue 20); but one thread for every client caps the loop at one core.
//
// So each thread measures its utilisation: the CPU time its OS thread used
// (user and system, so the kernel's work inside io_uring_enter counts)
// over windows of utilWindow of wall time, published atomically for the
// other threads. Time spent outside io_uring_enter would miss that kernel
// work, which is about half a loop thread's CPU, and a saturated thread
// would never look busy. The decision (place):
//
//   - A thread that runs a client of another thread takes the client (it
//     becomes the client's home, and the receive is armed here, with no
//     post) when it is under lowMark and at least as busy as the client's
//     home, or when the home is over highMark. Clients flow towards the
//     busier of the threads with headroom: taking them from a busier
//     thread would spread a light load, and flows both ways would never
//     settle.
//   - A thread over highMark arming a client of its own gives it to the
//     least busy other thread, when that one is under lowMark.
//   - A thread under lowMark arming a client of its own gives it to the
//     busiest other thread under lowMark, when that one is busier: clients
//     whose requests never leave their home thread (an uncontended pool)
//     are packed too.
//   - Between the marks nothing moves: the hysteresis that keeps a thread
//     near either mark from trading clients back and forth.
//
// A move shows in the utilisations only a window later, so each thread
// takes in, and gives away, at most a share of the clients it has per
// window (moveBudget): a thread over the high mark does not hand all its
// clients to an idle one in the window before either notices, which would
// then hand them back.
//
// rc.home changes only under the client's ownMu, like the rest of its
// ringClient. A thread's utilisation and client count are atomics that
// any thread reads; the window's bookkeeping is the thread's own.

import (
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

const (
	// utilWindow is the span a thread's utilisation is measured over:
	// long enough to hold hundreds of requests at the rates where
	// placement matters, short enough that a thread that saturates sheds
	// clients within a fraction of a second.
	utilWindow = 50 * time.Millisecond
	// lowMark and highMark, in thousandths of a core. A thread under
	// lowMark takes clients; over highMark it gives them away. Under 0.75
	// a thread still has a quarter of a core to spare, enough to absorb
	// a window's growth (at most an eighth of its clients, moveBudget)
	// before it nears saturation; spreading waits for 0.9 because on a
	// machine shared with the load and the upstream (all of this project's
	// benchmarks, and most small deployments) one thread at 0.8 still
	// costs less CPU per request than two that wake each other. The gap
	// of 0.15 is wider than a window's noise.
	lowMark  = 750
	highMark = 900
	// moveShare and minMoves bound the moves per window: a thread takes in
	// and gives away at most max(minMoves, clients/moveShare) each.
	moveShare = 8
	minMoves  = 4
)

// placement is where a client's next receive goes.
type placement uint8

const (
	placeHome   placement = iota // on its home thread, posted there from elsewhere
	placeHere                    // on the running thread, which becomes its home
	placeSpread                  // on the least busy other thread, which becomes its home
	placePack                    // on the busiest other thread under lowMark, which becomes its home
)

// place decides where a client's next receive goes, from utilisations in
// thousandths: here is the running thread's, home the client's home's
// (here's own when atHome); least is the least busy other thread's, and
// packTo the busiest other thread's under lowMark (-1 when none is).
func place(atHome bool, here, home, least, packTo int) placement {
	switch {
	case !atHome:
		if here < lowMark && (here >= home || home > highMark) {
			return placeHere
		}
	case here > highMark:
		if least < lowMark {
			return placeSpread
		}
	case here < lowMark:
		if packTo > here && packTo < lowMark {
			return placePack
		}
	}
	return placeHome
}

// threadLoad is a ring thread's utilisation and client count.
type threadLoad struct {
	// util is the last window's utilisation in thousandths (low 16 bits)
	// and the window's end in milliseconds of monoNow (the rest). Written
	// by the thread, read by any.
	util atomic.Uint64
	// forced, when positive, is the utilisation plus one that utilAt
	// reports instead of the measured one: tests place clients with it.
	forced atomic.Int32
	// clients counts the clients whose home this thread is.
	clients atomic.Int32

	// The thread's own: monoNow at the last return from io_uring_enter,
	// the window's start in wall and CPU time, the clients taken in and
	// given away in it, and the other threads a client may go to, found
	// as the window began: the least busy, and the busiest under lowMark
	// (nil when none is).
	now                time.Duration
	winStart, cpuStart time.Duration
	movedIn, movedOut  int32
	least, packTo      *ringThread
}

// tick closes the window when it has run its length, and looks at the
// other threads for the next one. The thread calls it each time
// io_uring_enter returns: one clock read, and per window a read of the
// thread's CPU clock and of each other thread's utilisation.
func (th *ringThread) tick() {
	tl := &th.load
	now := monoNow()
	tl.now = now
	span := now - tl.winStart
	if span < utilWindow {
		return
	}
	cpu := threadCPU()
	if tl.winStart > 0 {
		u := min(max(int64((cpu-tl.cpuStart)*1000/span), 0), 1000)
		tl.util.Store(uint64(now/time.Millisecond)<<16 | uint64(u))
	}
	tl.winStart, tl.cpuStart = now, cpu
	tl.movedIn, tl.movedOut = 0, 0
	tl.least, tl.packTo = nil, nil
	lu, pu := 0, 0
	for _, o := range th.d.threads {
		if o == th {
			continue
		}
		u := o.load.utilAt(now)
		if tl.least == nil || u < lu {
			tl.least, lu = o, u
		}
		if u < lowMark && (tl.packTo == nil || u > pu) {
			tl.packTo, pu = o, u
		}
	}
}

// utilAt is the thread's utilisation in thousandths as seen at now: 0 once
// its last window ended two windows ago, for a thread that has slept in
// io_uring_enter that long is idle.
func (tl *threadLoad) utilAt(now time.Duration) int {
	if f := tl.forced.Load(); f > 0 {
		return int(f - 1)
	}
	v := tl.util.Load()
	if time.Duration(v>>16)*time.Millisecond < now-2*utilWindow {
		return 0
	}
	return int(v & 0xffff)
}

// moveBudget is how many clients the thread may take in, or give away, per
// window.
func (tl *threadLoad) moveBudget() int32 {
	return max(minMoves, tl.clients.Load()/moveShare)
}

// clockThreadCPUTime is CLOCK_THREAD_CPUTIME_ID: the calling OS thread's
// CPU time, user and system. Ring threads are locked to theirs.
const clockThreadCPUTime = 3

// threadCPU returns the calling OS thread's CPU time.
func threadCPU() time.Duration {
	var ts syscall.Timespec
	_, _, _ = syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTime, uintptr(unsafe.Pointer(&ts)), 0)
	return time.Duration(ts.Nano())
}

// placeRecv returns the thread a client's next receive goes on, asked by
// the running thread t; it moves the client (rc.home) when place says so.
// It holds the client's ownMu.
func (d *ringDriver) placeRecv(t *ringThread, rc *ringClient) *ringThread {
	tl := &t.load
	now := tl.now
	if h := rc.home; h != t {
		if tl.movedIn < tl.moveBudget() && place(false, tl.utilAt(now), h.load.utilAt(now), 0, -1) == placeHere {
			tl.movedIn++
			rc.moveTo(t)
			return t
		}
		return h
	}
	if tl.least == nil || tl.movedOut >= tl.moveBudget() {
		return t
	}
	here := tl.utilAt(now)
	if here >= lowMark && here <= highMark {
		return t
	}
	packTo := -1
	if tl.packTo != nil {
		packTo = tl.packTo.load.utilAt(now)
	}
	var to *ringThread
	switch place(true, here, here, tl.least.load.utilAt(now), packTo) {
	case placeSpread:
		to = tl.least
	case placePack:
		to = tl.packTo
	default:
		return t
	}
	tl.movedOut++
	rc.moveTo(to)
	return to
}

// moveTo makes t the client's home. It holds the client's ownMu.
func (rc *ringClient) moveTo(t *ringThread) {
	rc.home.load.clients.Add(-1)
	t.load.clients.Add(1)
	rc.home = t
}
