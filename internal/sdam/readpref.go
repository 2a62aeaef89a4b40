// This file holds read preferences: the model (mode, tag sets, max
// staleness), the parser of the $readPreference document a driver puts in a
// command (server-selection.md, "Document structure"), and the validation
// rules of server-selection.md and max-staleness.md.

package sdam

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Mode is a read preference mode. The zero value is Primary, the
// specification's default.
type Mode int

// The read preference modes of server-selection.md.
const (
	Primary Mode = iota
	PrimaryPreferred
	Secondary
	SecondaryPreferred
	Nearest
)

var readPrefModeNames = [...]string{
	Primary:            "primary",
	PrimaryPreferred:   "primaryPreferred",
	Secondary:          "secondary",
	SecondaryPreferred: "secondaryPreferred",
	Nearest:            "nearest",
}

// String returns the mode's name as it is spelled in a $readPreference
// document (camel case).
func (m Mode) String() string {
	if m >= 0 && int(m) < len(readPrefModeNames) {
		return readPrefModeNames[m]
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// ParseMode returns the mode named s. Only the camel-case spelling of the
// $readPreference document is accepted ("primaryPreferred", not
// "PrimaryPreferred" nor "primarypreferred"): the specification requires
// it of the document, and mongos rejects the other spellings too, so a
// driver that sends them would fail against a real mongos as well.
func ParseMode(s string) (Mode, error) {
	for i, n := range readPrefModeNames {
		if n == s {
			return Mode(i), nil
		}
	}
	return 0, &ReadPrefError{Field: "mode", Reason: fmt.Sprintf("unknown mode %q (want one of primary, primaryPreferred, secondary, secondaryPreferred, nearest)", rpTruncate(s))}
}

// TagSet is one tag set of a read preference: a server matches it when the
// server's tags hold every pair of the set. The empty set matches every
// server.
type TagSet map[string]string

// Matches reports whether a server with the given tags matches the set
// (the set is a subset of the server's tags).
func (ts TagSet) Matches(serverTags map[string]string) bool {
	for k, v := range ts {
		if sv, ok := serverTags[k]; !ok || sv != v {
			return false
		}
	}
	return true
}

// String renders the set as {k: v, ...} with the keys sorted, so logs and
// error messages are stable.
func (ts TagSet) String() string {
	keys := make([]string, 0, len(ts))
	for k := range ts {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	b.WriteByte('{')
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Quote(k))
		b.WriteString(": ")
		b.WriteString(strconv.Quote(ts[k]))
	}
	b.WriteByte('}')
	return b.String()
}

// ReadPref is a read preference. The zero value is mode primary with no
// tag sets and no max staleness, the specification's default.
type ReadPref struct {
	Mode Mode
	// TagSets are tried in order; the first that matches at least one
	// candidate decides. Empty means every candidate is eligible, as does
	// a list holding the empty set.
	TagSets []TagSet
	// MaxStaleness is maxStalenessSeconds; 0 means no maximum.
	MaxStaleness time.Duration
}

// String describes the read preference for logs (the "selector" of the
// server selection log messages): the mode, then the tag sets and max
// staleness when set.
func (rp ReadPref) String() string {
	var b strings.Builder
	b.WriteString(rp.Mode.String())
	if len(rp.TagSets) > 0 {
		b.WriteString(" tagSets=[")
		for i, ts := range rp.TagSets {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(ts.String())
		}
		b.WriteByte(']')
	}
	if rp.MaxStaleness > 0 {
		b.WriteString(" maxStalenessSeconds=")
		b.WriteString(strconv.FormatInt(int64(rp.MaxStaleness/time.Second), 10))
	}
	return b.String()
}

// The constants of max staleness (max-staleness.md).
const (
	// SmallestMaxStaleness is smallestMaxStalenessSeconds: no positive
	// max staleness may be smaller.
	SmallestMaxStaleness = 90 * time.Second
	// IdleWritePeriod is idleWritePeriodMS, how often an idle primary
	// writes a no-op; a max staleness must also be at least the heartbeat
	// frequency plus this.
	IdleWritePeriod = 10 * time.Second
)

// The kinds of read preference error, for errors.Is. Every *ReadPrefError
// also matches ErrInvalidReadPref.
var (
	// ErrInvalidReadPref matches every read preference error.
	ErrInvalidReadPref = errors.New("invalid read preference")
	// ErrPrimaryWithOptions: mode primary with a non-empty tag set, a max
	// staleness or a hedge, which the specification forbids.
	ErrPrimaryWithOptions = errors.New("mode primary takes no tag sets, maxStalenessSeconds or hedge")
	// ErrMaxStalenessTooSmall: a max staleness below SmallestMaxStaleness
	// or below the heartbeat frequency plus IdleWritePeriod.
	ErrMaxStalenessTooSmall = errors.New("maxStalenessSeconds is too small")
	// ErrMaxStalenessBelowHeartbeat: a max staleness at least
	// SmallestMaxStaleness but below the heartbeat frequency plus
	// IdleWritePeriod. It matches ErrMaxStalenessTooSmall too; it is apart
	// so that a caller can name the heartbeat as the value to change.
	ErrMaxStalenessBelowHeartbeat = fmt.Errorf("%w: below heartbeatFrequency + idleWritePeriod", ErrMaxStalenessTooSmall)
)

// ReadPrefError says what is wrong with a read preference: which field and
// why. errors.Is matches it to ErrInvalidReadPref and, when set, to Kind.
type ReadPrefError struct {
	// Field is the document field at fault ("mode", "tags",
	// "maxStalenessSeconds", "hedge"), empty for the document itself.
	Field string
	// Reason is a sentence on what is wrong.
	Reason string
	// Kind is ErrPrimaryWithOptions, ErrMaxStalenessTooSmall or nil.
	Kind error
}

// Error returns "invalid read preference: <field>: <reason>".
func (e *ReadPrefError) Error() string {
	if e.Field == "" {
		return "invalid read preference: " + e.Reason
	}
	return "invalid read preference: " + e.Field + ": " + e.Reason
}

// Unwrap lets errors.Is see ErrInvalidReadPref and the Kind.
func (e *ReadPrefError) Unwrap() []error {
	if e.Kind != nil {
		return []error{ErrInvalidReadPref, e.Kind}
	}
	return []error{ErrInvalidReadPref}
}

// checkMode applies the rules that hold whatever the topology: mode
// primary takes no non-empty tag set and no max staleness.
func (rp ReadPref) checkMode() error {
	if errs := rp.modeProblems(); len(errs) > 0 {
		return errs[0]
	}
	return nil
}

// modeProblems lists what checkMode finds, every problem rather than the
// first, in the order checkMode reports them.
func (rp ReadPref) modeProblems() []*ReadPrefError {
	if rp.Mode < Primary || rp.Mode > Nearest {
		return []*ReadPrefError{{Field: "mode", Reason: "unknown mode " + rp.Mode.String()}}
	}
	var out []*ReadPrefError
	if rp.MaxStaleness < 0 {
		out = append(out, &ReadPrefError{Field: "maxStalenessSeconds", Reason: "negative max staleness " + rp.MaxStaleness.String()})
	}
	if rp.Mode != Primary {
		return out
	}
	if rp.MaxStaleness > 0 {
		out = append(out, &ReadPrefError{Field: "maxStalenessSeconds", Reason: "mode primary takes no max staleness", Kind: ErrPrimaryWithOptions})
	}
	for _, ts := range rp.TagSets {
		if len(ts) > 0 {
			out = append(out, &ReadPrefError{Field: "tags", Reason: "mode primary takes no tag set, got " + ts.String(), Kind: ErrPrimaryWithOptions})
			break
		}
	}
	return out
}

// Validate checks the read preference for a client whose monitors check
// every heartbeat: mode primary takes no non-empty tag set and no max
// staleness, and a max staleness must be at least SmallestMaxStaleness and
// at least heartbeat + IdleWritePeriod. Selection applies the size rule
// only to replica sets (a mongos or a single server ignores it, as the
// specification says), so call this where a read preference is configured
// to refuse it early whatever the topology. It returns the first of
// Problems.
func (rp ReadPref) Validate(heartbeat time.Duration) error {
	if errs := rp.Problems(heartbeat); len(errs) > 0 {
		return errs[0]
	}
	return nil
}

// Problems lists every rule of Validate that rp breaks, for a caller that
// reports them all at once (the configuration). These are the rules of
// read preferences: the configuration applies them through this method
// and states none of its own.
func (rp ReadPref) Problems(heartbeat time.Duration) []*ReadPrefError {
	out := rp.modeProblems()
	if err := rp.checkStaleness(heartbeat); err != nil {
		out = append(out, err)
	}
	return out
}

// checkStaleness is the replica-set rule on the size of max staleness.
func (rp ReadPref) checkStaleness(heartbeat time.Duration) *ReadPrefError {
	if rp.MaxStaleness <= 0 {
		return nil
	}
	if rp.MaxStaleness < SmallestMaxStaleness {
		return &ReadPrefError{Field: "maxStalenessSeconds", Kind: ErrMaxStalenessTooSmall,
			Reason: fmt.Sprintf("%s is below the smallest allowed, %s", rp.MaxStaleness, SmallestMaxStaleness)}
	}
	if floor := heartbeat + IdleWritePeriod; rp.MaxStaleness < floor {
		return &ReadPrefError{Field: "maxStalenessSeconds", Kind: ErrMaxStalenessBelowHeartbeat,
			Reason: fmt.Sprintf("%s is below heartbeatFrequency %s + idleWritePeriod %s", rp.MaxStaleness, heartbeat, IdleWritePeriod)}
	}
	return nil
}

// ParseReadPref reads the $readPreference document of a command. mode is
// required, once, in camel case; tags, when present, is a non-empty array
// of documents whose values are strings; maxStalenessSeconds, when present,
// is an integer (int32, int64, or a double with no fraction), -1 meaning
// none and anything else below 1 an error; hedge, when present, is a
// document and is otherwise ignored (hedged reads are deprecated); other
// fields are ignored for forward compatibility, as the specification asks.
// Mode primary with a non-empty tag set, a max staleness or a hedge is an
// error (ErrPrimaryWithOptions). The size of max staleness is not checked
// here: that depends on the topology and the heartbeat (see Validate).
// Every error is a *ReadPrefError.
func ParseReadPref(doc bsoncore.Document) (ReadPref, error) {
	var rp ReadPref
	if err := doc.Validate(); err != nil {
		return rp, &ReadPrefError{Reason: "malformed document: " + err.Error()}
	}
	elems, err := doc.Elements()
	if err != nil {
		return rp, &ReadPrefError{Reason: "malformed document: " + err.Error()}
	}
	var haveMode, haveTags, haveStaleness, haveHedge bool
	for _, e := range elems {
		key := e.Key()
		v := e.Value()
		switch key {
		case "mode":
			if haveMode {
				return ReadPref{}, &ReadPrefError{Field: key, Reason: "present more than once"}
			}
			haveMode = true
			s, ok := v.StringValueOK()
			if !ok {
				return ReadPref{}, &ReadPrefError{Field: key, Reason: "must be a string, got " + v.Type.String()}
			}
			if rp.Mode, err = ParseMode(s); err != nil {
				return ReadPref{}, err
			}
		case "tags":
			if haveTags {
				return ReadPref{}, &ReadPrefError{Field: key, Reason: "present more than once"}
			}
			haveTags = true
			if rp.TagSets, err = readPrefTagSets(v); err != nil {
				return ReadPref{}, err
			}
		case "maxStalenessSeconds":
			if haveStaleness {
				return ReadPref{}, &ReadPrefError{Field: key, Reason: "present more than once"}
			}
			haveStaleness = true
			if rp.MaxStaleness, err = readPrefMaxStaleness(v); err != nil {
				return ReadPref{}, err
			}
		case "hedge":
			if haveHedge {
				return ReadPref{}, &ReadPrefError{Field: key, Reason: "present more than once"}
			}
			haveHedge = true
			if v.Type != bsoncore.TypeEmbeddedDocument {
				return ReadPref{}, &ReadPrefError{Field: key, Reason: "must be a document, got " + v.Type.String()}
			}
		}
	}
	if !haveMode {
		return ReadPref{}, &ReadPrefError{Field: "mode", Reason: "missing"}
	}
	if rp.Mode == Primary && haveHedge {
		return ReadPref{}, &ReadPrefError{Field: "hedge", Reason: "mode primary takes no hedge", Kind: ErrPrimaryWithOptions}
	}
	if err := rp.checkMode(); err != nil {
		return ReadPref{}, err
	}
	return rp, nil
}

// readPrefTagSets reads the tags array: documents of string values, at least
// one, no key twice in a set (a set needing two values of one tag could
// never match, and a map cannot hold it).
func readPrefTagSets(v bsoncore.Value) ([]TagSet, error) {
	arr, ok := v.ArrayOK()
	if !ok {
		return nil, &ReadPrefError{Field: "tags", Reason: "must be an array of documents, got " + v.Type.String()}
	}
	vals, err := arr.Values()
	if err != nil {
		return nil, &ReadPrefError{Field: "tags", Reason: "malformed array: " + err.Error()}
	}
	if len(vals) == 0 {
		return nil, &ReadPrefError{Field: "tags", Reason: "must hold at least one tag set (leave it out for none)"}
	}
	sets := make([]TagSet, 0, len(vals))
	for i, sv := range vals {
		d, ok := sv.DocumentOK()
		if !ok {
			return nil, &ReadPrefError{Field: "tags", Reason: fmt.Sprintf("element %d must be a document, got %s", i, sv.Type)}
		}
		elems, err := d.Elements()
		if err != nil {
			return nil, &ReadPrefError{Field: "tags", Reason: fmt.Sprintf("element %d is malformed: %v", i, err)}
		}
		ts := make(TagSet, len(elems))
		for _, e := range elems {
			s, ok := e.Value().StringValueOK()
			if !ok {
				return nil, &ReadPrefError{Field: "tags", Reason: fmt.Sprintf("tag %q of set %d must be a string, got %s", rpTruncate(e.Key()), i, e.Value().Type)}
			}
			if _, dup := ts[e.Key()]; dup {
				return nil, &ReadPrefError{Field: "tags", Reason: fmt.Sprintf("tag %q appears twice in set %d", rpTruncate(e.Key()), i)}
			}
			ts[e.Key()] = s
		}
		sets = append(sets, ts)
	}
	return sets, nil
}

// readPrefMaxStalenessSecs is the largest number of seconds a time.Duration
// holds; larger values are clamped to it, which keeps their meaning (no
// secondary is that stale).
const readPrefMaxStalenessSecs = math.MaxInt64 / int64(time.Second)

// readPrefMaxStaleness reads maxStalenessSeconds: -1 is none (0), a positive
// integer is kept, anything else is an error.
func readPrefMaxStaleness(v bsoncore.Value) (time.Duration, error) {
	var n int64
	switch v.Type {
	case bsoncore.TypeInt32:
		n = int64(v.Int32())
	case bsoncore.TypeInt64:
		n = v.Int64()
	case bsoncore.TypeDouble:
		f := v.Double()
		if f != math.Trunc(f) || math.IsInf(f, 0) || math.IsNaN(f) {
			return 0, &ReadPrefError{Field: "maxStalenessSeconds", Reason: "must be an integer, got " + strconv.FormatFloat(f, 'g', -1, 64)}
		}
		if f < -1 || (f > -1 && f < 1) {
			return 0, &ReadPrefError{Field: "maxStalenessSeconds", Reason: "must be positive or -1 (none), got " + strconv.FormatFloat(f, 'g', -1, 64)}
		}
		if f >= float64(readPrefMaxStalenessSecs) {
			n = readPrefMaxStalenessSecs
		} else {
			n = int64(f)
		}
	default:
		return 0, &ReadPrefError{Field: "maxStalenessSeconds", Reason: "must be a number, got " + v.Type.String()}
	}
	switch {
	case n == -1:
		return 0, nil
	case n < 1:
		return 0, &ReadPrefError{Field: "maxStalenessSeconds", Reason: fmt.Sprintf("must be positive or -1 (none), got %d", n)}
	case n >= readPrefMaxStalenessSecs:
		return time.Duration(math.MaxInt64), nil
	}
	return time.Duration(n) * time.Second, nil
}

// rpTruncate keeps error messages short when a client sends a long string.
func rpTruncate(s string) string {
	const limit = 64
	if len(s) <= limit {
		return s
	}
	return s[:limit] + "..."
}
