package routing

// Cursor and transaction affinity on routes of several servers: which
// server a cursor or an open transaction lives on, so that its getMore,
// killCursors, commit and abort go back there; bounded maps whose entries
// expire. A route of one server remembers nothing: every command goes to
// that server anyway.

import (
	"slices"
	"sync"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/topology"
)

// CursorServer returns the server that opened cursor id through the
// route, or nil (unknown, expired, or a route of one server).
func (r *Route) CursorServer(id int64) *topology.Server {
	if !r.Multi() {
		return nil
	}
	srv, _ := r.cursors.Get(id, time.Now())
	return srv
}

// SetCursorServer records that srv opened cursor id.
func (r *Route) SetCursorServer(id int64, srv *topology.Server) {
	if r.Multi() {
		r.cursors.Put(id, srv, time.Now())
	}
}

// ForgetCursor forgets cursor id (exhausted, killed, or failed).
func (r *Route) ForgetCursor(id int64) {
	if r.Multi() {
		r.cursors.Delete(id)
	}
}

// TxnServer returns the server that runs transaction key, or nil.
func (r *Route) TxnServer(key TxnKey) *topology.Server {
	if !r.Multi() {
		return nil
	}
	srv, _ := r.txns.Get(key, time.Now())
	return srv
}

// SetTxnServer records that srv runs transaction key.
func (r *Route) SetTxnServer(key TxnKey, srv *topology.Server) {
	if r.Multi() {
		r.txns.Put(key, srv, time.Now())
	}
}

// ForgetTxn forgets transaction key (committed, aborted, or abandoned).
func (r *Route) ForgetTxn(key TxnKey) {
	if r.Multi() {
		r.txns.Delete(key)
	}
}

// Affinity is a bounded map that remembers which upstream server owns a
// cursor or a transaction, so that getMore, killCursors and every command of
// a transaction reach the server that holds the state. Entries are removed
// when the cursor or transaction ends; a TTL and a size bound keep clients
// that never finish from growing it without limit.
type Affinity[K comparable, V any] struct {
	max int
	ttl time.Duration

	mu sync.Mutex // guards m and evicted
	m  map[K]affinityEntry[V]
	// evicted counts entries dropped to stay under max before they expired
	// (each one may turn a later getMore into CursorNotFound); expiry is
	// not eviction.
	evicted uint64
}

// TxnKey names one transaction: command's key of a request (the session
// id and the transaction number), one type for the request that carries
// it and the map that follows it.
type TxnKey = command.TxnKey

type affinityEntry[V any] struct {
	v    V
	seen time.Time
}

// NewAffinity returns an empty map of at most max entries, each
// forgotten ttl after it was last put or got (0: never).
func NewAffinity[K comparable, V any](max int, ttl time.Duration) *Affinity[K, V] {
	return &Affinity[K, V]{max: max, ttl: ttl, m: make(map[K]affinityEntry[V])}
}

// Put records k -> v, making room if the map is full.
func (a *Affinity[K, V]) Put(k K, v V, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.m[k]; !ok && len(a.m) >= a.max {
		a.makeRoomLocked(now)
	}
	a.m[k] = affinityEntry[V]{v: v, seen: now}
}

// Get returns the value for k and refreshes its TTL.
func (a *Affinity[K, V]) Get(k K, now time.Time) (V, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	e, ok := a.m[k]
	if !ok {
		var zero V
		return zero, false
	}
	if a.ttl > 0 && now.Sub(e.seen) > a.ttl {
		delete(a.m, k)
		var zero V
		return zero, false
	}
	e.seen = now
	a.m[k] = e
	return e.v, true
}

// Delete forgets k (its cursor or transaction ended).
func (a *Affinity[K, V]) Delete(k K) {
	a.mu.Lock()
	delete(a.m, k)
	a.mu.Unlock()
}

// Len returns the number of entries, expired ones included until they
// are found.
func (a *Affinity[K, V]) Len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.m)
}

// makeRoomLocked drops expired entries; if none expired, it drops the
// oldest eighth of the map, so the cost of a full scan is paid once per
// many insertions rather than on each.
func (a *Affinity[K, V]) makeRoomLocked(now time.Time) {
	before := len(a.m)
	if a.ttl > 0 {
		for k, e := range a.m {
			if now.Sub(e.seen) > a.ttl {
				delete(a.m, k)
			}
		}
	}
	if len(a.m) < before {
		return
	}
	// Nothing expired: find the age at or below which the oldest eighth
	// lies. Sorting is O(n log n) once per n/8 insertions.
	ages := make([]int64, 0, len(a.m))
	for _, e := range a.m {
		ages = append(ages, e.seen.UnixNano())
	}
	slices.Sort(ages)
	cut := time.Unix(0, ages[len(ages)/8])
	for k, e := range a.m {
		if !e.seen.After(cut) {
			delete(a.m, k)
			a.evicted++
		}
	}
}
