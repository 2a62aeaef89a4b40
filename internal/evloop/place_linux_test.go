package evloop

import (
	"runtime"
	"testing"
	"time"
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
