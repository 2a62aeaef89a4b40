// The accounting of a restart measurement (mongobouncer-bench restart):
// what the application's clients saw while the proxies behind their
// address were restarted or upgraded. A Ledger collects every operation's
// outcome and every SIGTERM sent, as offsets from one clock; the functions
// below turn it into the figures the report gives: errors by text with
// their distance from the nearest SIGTERM, acknowledged writes lost or
// duplicated, and the longest time without a successful operation. They
// are pure, so the unit tests check them on hand-made timelines.

package loadgen

import (
	"cmp"
	"regexp"
	"slices"
	"sort"
	"sync"
	"time"
)

// WriteKey names one insert of the restart workload: writer w's seq-th
// document. Every inserted document carries it (fields w and s), whatever
// its _id, so that a document stored twice is seen as such.
type WriteKey struct {
	Writer int64 `json:"w" bson:"w"`
	Seq    int64 `json:"s" bson:"s"`
}

// Ledger records the outcomes of a restart measurement's operations. Its
// methods are safe for concurrent use.
type Ledger struct {
	start time.Time

	mu sync.Mutex
	// successes are the end offsets of successful operations. Guarded by mu.
	successes []time.Duration
	// errors are the application-visible failures. Guarded by mu.
	errors []OpError
	// signals are the offsets at which a SIGTERM was sent. Guarded by mu.
	signals []time.Duration
	// acked, failed and cut are the inserts that were acknowledged, that
	// failed, and that the run's end interrupted. Guarded by mu.
	acked, failed, cut []WriteKey
}

// OpError is one application-visible error.
type OpError struct {
	// At is its offset from the ledger's start.
	At time.Duration
	// Text classifies it (ErrorText): the same failure gives the same text.
	Text string
}

// NewLedger returns a ledger whose offsets count from start.
func NewLedger(start time.Time) *Ledger { return &Ledger{start: start} }

// Since is t's offset from the ledger's start.
func (l *Ledger) Since(t time.Time) time.Duration { return t.Sub(l.start) }

// Success records an operation that succeeded at end.
func (l *Ledger) Success(end time.Time) {
	l.mu.Lock()
	l.successes = append(l.successes, l.Since(end))
	l.mu.Unlock()
}

// Failure records an operation that failed at end with text.
func (l *Ledger) Failure(end time.Time, text string) {
	l.mu.Lock()
	l.errors = append(l.errors, OpError{At: l.Since(end), Text: text})
	l.mu.Unlock()
}

// Acked records an acknowledged insert (Success is recorded separately).
func (l *Ledger) Acked(k WriteKey) {
	l.mu.Lock()
	l.acked = append(l.acked, k)
	l.mu.Unlock()
}

// WriteFailed records an insert that returned an error (Failure is
// recorded separately); it may still have been stored.
func (l *Ledger) WriteFailed(k WriteKey) {
	l.mu.Lock()
	l.failed = append(l.failed, k)
	l.mu.Unlock()
}

// WriteCut records an insert the run's end interrupted: neither an error
// nor an acknowledgement, so whether it is stored means nothing.
func (l *Ledger) WriteCut(k WriteKey) {
	l.mu.Lock()
	l.cut = append(l.cut, k)
	l.mu.Unlock()
}

// Signal records a SIGTERM sent at t.
func (l *Ledger) Signal(t time.Time) {
	l.mu.Lock()
	l.signals = append(l.signals, l.Since(t))
	l.mu.Unlock()
}

// LedgerSnapshot is a copy of a ledger's records.
type LedgerSnapshot struct {
	Successes          []time.Duration
	Errors             []OpError
	Signals            []time.Duration
	Acked, Failed, Cut []WriteKey
}

// Snapshot copies the records.
func (l *Ledger) Snapshot() LedgerSnapshot {
	l.mu.Lock()
	defer l.mu.Unlock()
	return LedgerSnapshot{Successes: slices.Clone(l.successes), Errors: slices.Clone(l.errors),
		Signals: slices.Clone(l.signals), Acked: slices.Clone(l.acked), Failed: slices.Clone(l.failed),
		Cut: slices.Clone(l.cut)}
}

// ErrorGroup is the errors of one text.
type ErrorGroup struct {
	Text  string `json:"text"`
	Count int    `json:"count"`
	// FirstOffset and LastOffset are the smallest and largest distance of
	// one of them from the nearest SIGTERM (negative: before it).
	FirstOffset time.Duration `json:"first_offset_ns"`
	LastOffset  time.Duration `json:"last_offset_ns"`
}

// GroupErrors groups errs by text, most frequent first, each with the
// range of its offsets from the nearest of signals (0 when there are
// none).
func GroupErrors(errs []OpError, signals []time.Duration) []ErrorGroup {
	byText := map[string]*ErrorGroup{}
	var order []*ErrorGroup
	for _, e := range errs {
		off := NearestOffset(e.At, signals)
		g := byText[e.Text]
		if g == nil {
			g = &ErrorGroup{Text: e.Text, FirstOffset: off, LastOffset: off}
			byText[e.Text] = g
			order = append(order, g)
		}
		g.Count++
		g.FirstOffset = min(g.FirstOffset, off)
		g.LastOffset = max(g.LastOffset, off)
	}
	out := make([]ErrorGroup, len(order))
	for i, g := range order {
		out[i] = *g
	}
	slices.SortStableFunc(out, func(a, b ErrorGroup) int { return cmp.Compare(b.Count, a.Count) })
	return out
}

// NearestOffset is at's signed distance from the nearest of signals (at
// minus that signal), or 0 when there is none.
func NearestOffset(at time.Duration, signals []time.Duration) time.Duration {
	var best time.Duration
	for i, s := range signals {
		d := at - s
		if i == 0 || absDur(d) < absDur(best) {
			best = d
		}
	}
	return best
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// Gap is the longest interval without a successful operation.
type Gap struct {
	Length time.Duration `json:"length_ns"`
	// Start is its beginning, as an offset from the nearest SIGTERM.
	Start time.Duration `json:"start_from_sigterm_ns"`
}

// LongestGap finds the longest interval within [from, to] in which no
// operation succeeded: between two consecutive successes, or between from
// or to and the nearest success (the whole window when none succeeded).
// Start is reported against signals (NearestOffset).
func LongestGap(successes []time.Duration, from, to time.Duration, signals []time.Duration) Gap {
	s := slices.Clone(successes)
	slices.Sort(s)
	prev := from
	var g Gap
	gapStart := from
	for _, t := range s {
		if t < from {
			continue
		}
		if t > to {
			break
		}
		if d := t - prev; d > g.Length {
			g.Length, gapStart = d, prev
		}
		prev = t
	}
	if d := to - prev; d > g.Length {
		g.Length, gapStart = d, prev
	}
	g.Start = NearestOffset(gapStart, signals)
	return g
}

// WriteCheck compares the inserts acknowledged with what is stored.
type WriteCheck struct {
	// Acked is how many inserts were acknowledged.
	Acked int `json:"acked"`
	// Failed is how many returned an error.
	Failed int `json:"failed"`
	// Stored is how many documents the collection holds.
	Stored int `json:"stored"`
	// Lost is how many acknowledged inserts are not stored.
	Lost int `json:"lost"`
	// Duplicated is how many documents beyond the first carry the same
	// WriteKey: the same insert stored twice, under different _ids.
	Duplicated int `json:"duplicated"`
	// AppliedDespiteError is how many inserts that returned an error are
	// stored all the same (a driver's retry that met its own first
	// attempt gets a duplicate-key error, say): an application that
	// retried them itself would store them twice.
	AppliedDespiteError int `json:"applied_despite_error"`
	// Unexpected is how many stored documents were neither acknowledged,
	// failed nor cut by the run's end: they should not exist.
	Unexpected int `json:"unexpected"`
}

// CheckWrites compares acked, failed and cut inserts with the keys of
// the documents stored.
func CheckWrites(acked, failed, cut, stored []WriteKey) WriteCheck {
	count := make(map[WriteKey]int, len(stored))
	for _, k := range stored {
		count[k]++
	}
	c := WriteCheck{Acked: len(acked), Failed: len(failed), Stored: len(stored)}
	known := make(map[WriteKey]bool, len(acked)+len(failed)+len(cut))
	for _, k := range acked {
		known[k] = true
		if count[k] == 0 {
			c.Lost++
		}
	}
	for _, k := range failed {
		known[k] = true
		if count[k] > 0 {
			c.AppliedDespiteError++
		}
	}
	for _, k := range cut {
		known[k] = true
	}
	for k, n := range count {
		c.Duplicated += n - 1
		if !known[k] {
			c.Unexpected++
		}
	}
	return c
}

// connAddr and connSuffix are the parts of the driver's error texts that
// differ from one connection to the next (its address and its number),
// removed so that the same failure groups under one text.
var (
	connAddr   = regexp.MustCompile(`(\[::1\]|127\.\d+\.\d+\.\d+|localhost):\d+`)
	connSuffix = regexp.MustCompile(`\[-\d+\]|connection\(\d+\)|id \d+`)
)

// maxErrorText bounds an error's text in the report.
const maxErrorText = 200

// NormalizeErrorText makes an error's text a grouping key: addresses
// and connection numbers are replaced, and it is cut to maxErrorText.
func NormalizeErrorText(s string) string {
	s = connAddr.ReplaceAllString(s, "ADDR")
	s = connSuffix.ReplaceAllString(s, "")
	if len(s) > maxErrorText {
		s = s[:maxErrorText] + "..."
	}
	return s
}

// Median returns the median of xs (the mean of the two middle values for
// an even count), 0 for none.
func Median[T int | int64 | time.Duration | float64](xs []T) T {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
