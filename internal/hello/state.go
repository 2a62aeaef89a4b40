package hello

// The awaitable hello's state of one process, as a mongos 4.4+ keeps it
// (the SDAM monitoring specification's "awaitable hello" and "streaming
// protocol"): its topologyVersion {processId, counter}, the hellos waiting
// for the counter to move, and the quiesce of a drain, the one change of
// a mongobouncer's topology. The caller owns the sockets: it waits on its
// own goroutine (Wait, bounded, with its cancellation channels) and
// writes the replies.

import (
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// MinStreamInterval is the least time between two streamed replies when
// the topology has not changed: the SDAM specification's
// minHeartbeatFrequencyMS, so that maxAwaitTimeMS: 0 with exhaustAllowed
// is no busy loop. It is also the least hello_max_await (SetMaxAwait).
const MinStreamInterval = 500 * time.Millisecond

// QuiesceMessage is the errmsg of a hello during a drain, a mongos's
// wording in quiesce mode, which drivers and users recognise.
const QuiesceMessage = "The server is in quiesce mode and will shut down"

// State is one process's topologyVersion and the hellos waiting on it.
// Its methods are safe for concurrent use. Lock order: mu is a leaf.
type State struct {
	// processID is made once per State: a driver that sees another one
	// knows it talks to another process.
	processID bson.ObjectID
	// counter is read without mu; changed only under mu.
	counter atomic.Int64
	mu      sync.Mutex // guards changed
	// changed is closed, and replaced, when counter moves.
	changed chan struct{}
	// serving counts the awaitable hellos being served now, waiting or
	// streaming (Enter, Leave).
	serving atomic.Int64
	// drainDeadline is the drain's end in Unix nanoseconds, 0 if unknown
	// (remainingQuiesceTimeMillis).
	drainDeadline atomic.Int64
	// maxAwait (nanoseconds) is hello_max_await, 0 until set: MaxAwait.
	maxAwait atomic.Int64
}

// Init makes s the state of a new process: a fresh processId, counter 0.
// A State is used after its Init, and never copied.
func (s *State) Init() {
	s.processID = bson.NewObjectID()
	s.changed = make(chan struct{})
}

// Version is the topologyVersion replies carry now.
func (s *State) Version() TopologyVersion {
	return TopologyVersion{s.processID, s.counter.Load()}
}

// Bump moves the counter and ends every wait at once: the start of a
// drain.
func (s *State) Bump() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counter.Add(1)
	close(s.changed)
	s.changed = make(chan struct{})
}

// Enter counts an awaitable hello being served, waiting or streaming,
// until its Leave: a drain is not over while one is (it has its quiesce
// reply to write).
func (s *State) Enter() { s.serving.Add(1) }

// Leave ends what Enter counted.
func (s *State) Leave() { s.serving.Add(-1) }

// Serving returns how many awaitable hellos are being served now.
func (s *State) Serving() int { return int(s.serving.Load()) }

// SetDrainDeadline records when the drain will end, for the quiesce
// reply's remainingQuiesceTimeMillis.
func (s *State) SetDrainDeadline(t time.Time) { s.drainDeadline.Store(t.UnixNano()) }

// SetMaxAwait sets hello_max_await: the longest an awaitable hello waits
// without a change, whatever maxAwaitTimeMS asks, within
// [MinStreamInterval, MaxAwait]. A reply with nothing changed is a
// heartbeat to the driver, so answering sooner than asked is allowed and
// costs one small reply. Waits already begun keep theirs.
func (s *State) SetMaxAwait(d time.Duration) {
	s.maxAwait.Store(int64(min(max(d, MinStreamInterval), MaxAwait)))
}

// AwaitFor is how long a hello that asked for wait may wait.
func (s *State) AwaitFor(wait time.Duration) time.Duration {
	if m := time.Duration(s.maxAwait.Load()); m > 0 {
		return min(wait, m)
	}
	return wait
}

// Check refuses r as a mongos does: an apiVersion other than "1",
// malformed awaitable fields, or a counter of ours ahead of ours. It
// returns nil when r may be answered (and, if Awaitable, wait).
func (s *State) Check(r *Request) *Error {
	if e := r.apiVersionError(); e != nil {
		return e
	}
	if r.awaitErr != nil {
		return r.awaitErr
	}
	if r.HasVersion && r.Version.ProcessID == s.processID {
		if ours := s.counter.Load(); r.Version.Counter > ours {
			return &Error{51761, "Location51761", fmt.Sprintf(
				"Received a topology version with counter: %d which is greater than the mongos topology version counter: %d", r.Version.Counter, ours)}
		}
	}
	return nil
}

// Current reports whether tv is ours now: a hello holding it waits, one
// holding another answers at once.
func (s *State) Current(tv TopologyVersion) bool {
	return tv.ProcessID == s.processID && tv.Counter == s.counter.Load()
}

// Wake says what ended a Wait.
type Wake int

const (
	// Changed: the counter moved, or tv was not ours when Wait began.
	Changed Wake = iota
	// Expired: the wait's bound passed.
	Expired
	// Gone: the gone channel closed (the client went away).
	Gone
	// Stopped: the stop channel closed (the caller stops serving).
	Stopped
)

// Wait waits while our topologyVersion is tv, for at most d: until the
// counter moves, d passes, or gone or stop is closed (either may be nil).
func (s *State) Wait(tv TopologyVersion, d time.Duration, gone, stop <-chan struct{}) Wake {
	if tv.ProcessID != s.processID {
		return Changed
	}
	s.mu.Lock()
	cur, changed := s.counter.Load(), s.changed
	s.mu.Unlock()
	if cur != tv.Counter {
		return Changed
	}
	if d <= 0 {
		return Expired
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-changed:
		return Changed
	case <-t.C:
		return Expired
	case <-gone:
		return Gone
	case <-stop:
		return Stopped
	}
}

// WithVersion returns doc, a whole document, with our topologyVersion
// appended: a state change error reply carries it, as hello replies do.
func (s *State) WithVersion(doc bsoncore.Document) bsoncore.Document {
	tv := s.Version()
	return withElements(doc, 64, func(b []byte) []byte { return appendVersion(b, tv) })
}

// Quiesce returns errDoc, the 91 ShutdownInProgress a hello gets during a
// drain, as a mongos in quiesce mode answers: with the topologyVersion and
// the time left (remainingQuiesceTimeMillis, when the drain's end is
// known).
func (s *State) Quiesce(errDoc bsoncore.Document) bsoncore.Document {
	doc := s.WithVersion(errDoc)
	if dl := s.drainDeadline.Load(); dl != 0 {
		left := max(time.Until(time.Unix(0, dl)).Milliseconds(), 0)
		doc = withElements(doc, 40, func(b []byte) []byte {
			return bsoncore.AppendInt64Element(b, "remainingQuiesceTimeMillis", left)
		})
	}
	return doc
}

// Restamp rewrites in place the topologyVersion of a relayed upstream
// reply body (a member's state change error) to ours, now, and reports
// whether it did. A driver compares an error's topologyVersion with the
// one it holds for the server that sent it, mongobouncer, and ignores an
// error that is not newer: a member's stepdown is then what it is to the
// client, a retryable error, and not a change of mongobouncer's own state
// (which would make a streaming driver mark mongobouncer Unknown until its
// next streamed heartbeat). A reply without a topologyVersion (a server
// before 4.4), or with one of other types, is left as it is.
func (s *State) Restamp(body []byte) bool {
	if len(body) < 5 {
		return false
	}
	rest := body[4 : len(body)-1]
	for len(rest) > 0 {
		el, next, ok := bsoncore.ReadElement(rest)
		if !ok {
			return false
		}
		rest = next
		if el.Key() != "topologyVersion" {
			continue
		}
		d, ok := el.Value().DocumentOK()
		if !ok {
			return false
		}
		pid, err1 := d.LookupErr("processId")
		cnt, err2 := d.LookupErr("counter")
		if err1 != nil || err2 != nil || pid.Type != bsoncore.TypeObjectID || len(pid.Data) != 12 ||
			cnt.Type != bsoncore.TypeInt64 || len(cnt.Data) != 8 {
			return false
		}
		// Data alias body.
		copy(pid.Data, s.processID[:])
		binary.LittleEndian.PutUint64(cnt.Data, uint64(s.counter.Load()))
		return true
	}
	return false
}
