// Tests of the restart measurement's accounting on hand-made timelines:
// the figures the report gives must follow from the records, whatever
// their order.

package loadgen

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

const ms = time.Millisecond

func TestLongestGap(t *testing.T) {
	sig := []time.Duration{1000 * ms, 5000 * ms}
	cases := []struct {
		name      string
		successes []time.Duration
		from, to  time.Duration
		want      Gap
	}{
		{"between successes, unsorted", []time.Duration{900 * ms, 1300 * ms, 1000 * ms, 1010 * ms, 2000 * ms}, 900 * ms, 2000 * ms,
			Gap{Length: 700 * ms, Start: 300 * ms}},
		{"from the window's start", []time.Duration{1500 * ms, 1600 * ms}, 1000 * ms, 1600 * ms, Gap{Length: 500 * ms, Start: 0}},
		{"to the window's end", []time.Duration{1000 * ms, 1100 * ms}, 1000 * ms, 4900 * ms, Gap{Length: 3800 * ms, Start: 100 * ms}},
		{"none succeeded", nil, 4000 * ms, 6000 * ms, Gap{Length: 2000 * ms, Start: -1000 * ms}},
		{"successes outside the window ignored", []time.Duration{0, 1950 * ms, 2100 * ms, 9000 * ms}, 1900 * ms, 2200 * ms,
			Gap{Length: 150 * ms, Start: 950 * ms}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := LongestGap(c.successes, c.from, c.to, sig); got != c.want {
				t.Fatalf("LongestGap = %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestNearestOffset(t *testing.T) {
	sig := []time.Duration{1000 * ms, 3000 * ms}
	for _, c := range []struct{ at, want time.Duration }{
		{1004 * ms, 4 * ms}, {990 * ms, -10 * ms}, {2100 * ms, -900 * ms}, {1900 * ms, 900 * ms}, {9000 * ms, 6000 * ms},
	} {
		if got := NearestOffset(c.at, sig); got != c.want {
			t.Errorf("NearestOffset(%v) = %v, want %v", c.at, got, c.want)
		}
	}
	if got := NearestOffset(5*ms, nil); got != 0 {
		t.Errorf("NearestOffset without signals = %v, want 0", got)
	}
}

func TestGroupErrors(t *testing.T) {
	sig := []time.Duration{1000 * ms, 5000 * ms}
	errs := []OpError{
		{At: 1004 * ms, Text: "insert: ShutdownInProgress (91)"},
		{At: 3000 * ms, Text: "find: x"},
		{At: 5060 * ms, Text: "insert: ShutdownInProgress (91)"},
		{At: 4990 * ms, Text: "insert: ShutdownInProgress (91)"},
	}
	got := GroupErrors(errs, sig)
	want := []ErrorGroup{
		{Text: "insert: ShutdownInProgress (91)", Count: 3, FirstOffset: -10 * ms, LastOffset: 60 * ms},
		{Text: "find: x", Count: 1, FirstOffset: 2000 * ms, LastOffset: 2000 * ms},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("GroupErrors = %+v\nwant %+v", got, want)
	}
}

func TestCheckWrites(t *testing.T) {
	k := func(w, s int64) WriteKey { return WriteKey{Writer: w, Seq: s} }
	acked := []WriteKey{k(0, 1), k(0, 2), k(1, 1), k(1, 2)}
	failed := []WriteKey{k(0, 3), k(1, 3)}
	cut := []WriteKey{k(0, 4), k(1, 4)}
	stored := []WriteKey{
		k(0, 1), k(0, 2), k(0, 2), k(0, 2), // (0,2) stored three times: 2 duplicates
		k(1, 1), // (1,2) acknowledged but lost
		k(0, 3), // failed, yet stored
		k(1, 4), // cut by the run's end: stored or not, no matter
		k(7, 7), // nobody wrote it
	}
	got := CheckWrites(acked, failed, cut, stored)
	want := WriteCheck{Acked: 4, Failed: 2, Stored: 8, Lost: 1, Duplicated: 2, AppliedDespiteError: 1, Unexpected: 1}
	if got != want {
		t.Fatalf("CheckWrites = %+v\nwant %+v", got, want)
	}
	if got := CheckWrites(acked, nil, nil, acked); got != (WriteCheck{Acked: 4, Stored: 4}) {
		t.Fatalf("everything stored once: %+v", got)
	}
}

func TestLedgerRecords(t *testing.T) {
	start := time.Now()
	l := NewLedger(start)
	l.Success(start.Add(10 * ms))
	l.Failure(start.Add(20*ms), "e")
	l.Signal(start.Add(15 * ms))
	l.Acked(WriteKey{1, 1})
	l.WriteFailed(WriteKey{1, 2})
	l.WriteCut(WriteKey{1, 3})
	s := l.Snapshot()
	if fmt.Sprint(s) != fmt.Sprint(LedgerSnapshot{Successes: []time.Duration{10 * ms}, Errors: []OpError{{20 * ms, "e"}},
		Signals: []time.Duration{15 * ms}, Acked: []WriteKey{{1, 1}}, Failed: []WriteKey{{1, 2}}, Cut: []WriteKey{{1, 3}}}) {
		t.Fatalf("snapshot %+v", s)
	}
}

func TestErrorText(t *testing.T) {
	cases := []struct {
		err  error
		want string
	}{
		{mongo.CommandError{Code: 91, Name: "ShutdownInProgress"}, "insert: ShutdownInProgress (91)"},
		{fmt.Errorf("wrapped: %w", mongo.CommandError{Code: 91, Name: "ShutdownInProgress", Labels: []string{"RetryableWriteError"}}),
			"insert: ShutdownInProgress (91) [RetryableWriteError]"},
		{mongo.WriteException{WriteErrors: []mongo.WriteError{{Code: 11000, Message: "E11000 duplicate key"}}}, "insert: DuplicateKey (11000)"},
		{mongo.CommandError{Message: "connection(127.0.0.1:4242[-3]) incomplete read of message header: EOF", Labels: []string{"NetworkError", "RetryableWriteError"}},
			"insert: connection(ADDR) incomplete read of message header: EOF [NetworkError,RetryableWriteError]"},
		{mongo.ErrNoDocuments, "insert: acknowledged document not found"},
		{errors.New("connection(127.0.0.1:4242[-17]) incomplete read of message header: EOF"),
			"insert: connection(ADDR) incomplete read of message header: EOF"},
	}
	for _, c := range cases {
		if got := ErrorText("insert", c.err); got != c.want {
			t.Errorf("ErrorText(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}

func TestMedian(t *testing.T) {
	if got := Median([]int{5, 1, 3}); got != 3 {
		t.Errorf("odd: %d", got)
	}
	if got := Median([]time.Duration{4, 1, 3, 2}); got != 2 {
		t.Errorf("even: %d", got)
	}
	if got := Median[int](nil); got != 0 {
		t.Errorf("none: %d", got)
	}
}

// The monitors count by reason; a command cut by the run's end (its
// context cancelled) is not a failure.
func TestConnCounter(t *testing.T) {
	c := &connCounter{s: ConnStats{Closed: map[string]int{}, CheckOutFailed: map[string]int{}, CommandsFailed: map[string]int{}}}
	c.pool(&event.PoolEvent{Type: event.ConnectionCreated})
	c.pool(&event.PoolEvent{Type: event.ConnectionClosed, Reason: event.ReasonStale})
	c.pool(&event.PoolEvent{Type: event.ConnectionClosed, Reason: event.ReasonError, Error: errors.New("read: connection reset by peer")})
	c.pool(&event.PoolEvent{Type: event.ConnectionPoolCleared})
	c.heartbeatFailed(&event.ServerHeartbeatFailedEvent{Failure: errors.New("dial tcp 127.0.0.1:1: connect: connection refused")})
	failed := func(name string, err error) *event.CommandFailedEvent {
		e := &event.CommandFailedEvent{Failure: err}
		e.CommandName = name
		return e
	}
	c.commandFailed(context.Background(), failed("find", errors.New("(ShutdownInProgress) mongobouncer: shutting down")))
	c.commandFailed(context.Background(), failed("find", errors.New("(ShutdownInProgress) mongobouncer: shutting down")))
	c.commandFailed(context.Background(), failed("insert", fmt.Errorf("incomplete read: %w", context.Canceled)))
	got := c.snapshot()
	want := ConnStats{Created: 1, Closed: map[string]int{"stale": 1, "error": 1}, ClosedTotal: 2, PoolCleared: 1,
		CheckOutFailed: map[string]int{}, HeartbeatFailed: 1, Refused: 1, Reset: 1,
		CommandsFailed: map[string]int{"find: (ShutdownInProgress) mongobouncer: shutting down": 2}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("counts %+v\nwant %+v", got, want)
	}
}
