package pool

// Share: one connection budget for several pools of the same upstream server
// (a route's service pool and its pass-through user pools), PgBouncer's
// max_db_connections. Each pool keeps its own CMAP wait queue, events and
// limits; the Share only decides whether a pool may create one more
// connection, and makes room when it may not:
//
//   - A pool whose front waiter needs a new connection while the budget is
//     spent joins the Share's FIFO of pools (once, whatever the length of its
//     own queue). A slot that frees goes to the first pool in that FIFO (a
//     grant), not back to the budget, so a pool that does not wait cannot
//     take it first; pools are served one connection per turn, round-robin.
//   - For every pool in that FIFO, one idle connection of another pool is
//     asked to close (an eviction): the pool with the most idle connections
//     closes its least recently used one. A connection checked in while
//     pools wait, to a pool whose own queue is empty, is closed at once
//     instead of being made available. So no user starves while others
//     hold idle connections.
//   - A busy pool whose own queue never empties gives up a checked-in
//     connection too when the first waiting pool has none, or two fewer
//     (overShare), so a busy user cannot starve the others either.
//
// Lock order: Pool.mu, then Share.mu. Share.mu is a leaf: the Share never
// takes a pool's lock, and a pool never holds two pool locks. What the Share
// needs of another pool (serve a grant, close an idle connection) it asks
// for with that pool's atomics and a non-blocking wake of its maintenance
// goroutine, which acts under its own lock only.

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
)

// Share is a connection budget shared by pools of one server (Options.Share).
// Create it with NewShare; the zero value is not usable. All methods are safe
// for concurrent use.
type Share struct {
	// pressure is len(queue) > 0 || used > max, for CheckIn's lock-free test
	// (written under mu).
	pressure atomic.Bool

	// mu guards the fields below and every member's shareQueued and
	// shareGrant. Taken under a member's Pool.mu, never the other way round.
	mu        sync.Mutex
	max       int // 0: no cap (connections are still counted)
	used      int // connections of the members, plus grants not yet used
	queue     []*Pool
	members   map[*Pool]struct{}
	evicting  int    // evictions asked for and not yet done
	waits     uint64 // times a pool joined queue
	evictions uint64 // idle connections closed to make room
}

// ShareStats is a snapshot of a Share, for SHOW POOLS and metrics.
type ShareStats struct {
	// Max is the cap (0: none).
	Max int
	// Used is the number of connections counted against it (pending,
	// available and in use, over every member), plus slots granted to a
	// waiting pool and not yet used.
	Used int
	// Waiting is the number of pools waiting for a slot.
	Waiting int
	// Waits counts the times a pool had to wait for a slot.
	Waits uint64
	// Evictions counts the idle connections closed to make room.
	Evictions uint64
}

// NewShare returns a Share capped at max connections (0: no cap).
func NewShare(max int) (*Share, error) {
	if max < 0 {
		return nil, fmt.Errorf("%w: Share max %d must be >= 0", ErrInvalidOptions, max)
	}
	return &Share{max: max, members: make(map[*Pool]struct{})}, nil
}

// Stats returns a snapshot of the Share.
func (s *Share) Stats() ShareStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return ShareStats{Max: s.max, Used: s.used, Waiting: len(s.queue), Waits: s.waits, Evictions: s.evictions}
}

// SetMax changes the cap live (a reload). Raising it serves waiting pools at
// once; lowering it below the connections in use closes idle ones (checked in
// connections first, then evictions) until the count fits; connections in use
// are never taken away.
func (s *Share) SetMax(max int) error {
	if max < 0 {
		return fmt.Errorf("%w: Share max %d must be >= 0", ErrInvalidOptions, max)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.max = max
	for len(s.queue) > 0 && s.hasRoomLocked() {
		s.used++
		s.grantLocked()
	}
	s.requestEvictionsLocked()
	s.updateLocked()
	return nil
}

func (s *Share) hasRoomLocked() bool { return s.max == 0 || s.used < s.max }

func (s *Share) updateLocked() {
	s.pressure.Store(len(s.queue) > 0 || (s.max > 0 && s.used > s.max))
}

// join makes p a member (New).
func (s *Share) join(p *Pool) {
	s.mu.Lock()
	s.members[p] = struct{}{}
	s.mu.Unlock()
}

// leave removes a closing pool: it no longer waits, gives back its grants and
// is no longer asked to evict. Its connections still release their slots as
// they close. Called with p.mu held.
func (s *Share) leave(p *Pool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.members, p)
	s.dequeueLocked(p)
	for ; p.shareGrant > 0; p.shareGrant-- {
		s.releaseLocked()
	}
	p.grantN.Store(0)
	s.updateLocked()
}

// acquire takes a slot for a new connection of p's front waiter: one granted
// to p, else a free one if no pool waits before it. Otherwise p waits in the
// Share's queue (once) and evictions are asked for; it returns false, and p's
// dispatch is woken when a slot is granted. Called with p.mu held.
func (s *Share) acquire(p *Pool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p.shareGrant > 0 {
		p.shareGrant--
		p.grantN.Store(int32(p.shareGrant))
		return true
	}
	if len(s.queue) == 0 && s.hasRoomLocked() {
		s.used++
		return true
	}
	if !p.shareQueued {
		p.shareQueued = true
		p.queuedN.Store(true)
		s.queue = append(s.queue, p)
		s.waits++
	}
	s.requestEvictionsLocked()
	s.updateLocked()
	return false
}

// tryAcquire takes a free slot for a background connection (minPoolSize):
// never a grant, never before a waiting pool, never by eviction. Called with
// p.mu held.
func (s *Share) tryAcquire() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.queue) == 0 && s.hasRoomLocked() {
		s.used++
		return true
	}
	return false
}

// release frees the slot of a connection of p that closed: it goes to the
// first waiting pool, or back to the budget. Called with p.mu held (after the
// ConnectionClosed event, so that counting events never shows more
// connections than the Share counts).
func (s *Share) release() {
	s.mu.Lock()
	s.releaseLocked()
	s.updateLocked()
	s.mu.Unlock()
}

func (s *Share) releaseLocked() {
	if len(s.queue) > 0 && (s.max == 0 || s.used <= s.max) {
		s.grantLocked() // the slot changes hands: used stays
		return
	}
	s.used--
}

// grantLocked gives one slot (already counted in used) to the first waiting
// pool and wakes it.
func (s *Share) grantLocked() {
	q := s.queue[0]
	s.queue[0] = nil
	s.queue = s.queue[1:]
	q.shareQueued = false
	q.queuedN.Store(false)
	q.shareGrant++
	q.grantN.Store(int32(q.shareGrant))
	q.wake()
}

// giveBack takes p out of the queue and returns the grants it got: it has
// no waiter that needs a new connection any more (it left, or a checked-in
// connection served it). Called with p.mu held.
func (s *Share) giveBack(p *Pool) {
	s.mu.Lock()
	s.dequeueLocked(p)
	for ; p.shareGrant > 0; p.shareGrant-- {
		s.releaseLocked()
	}
	p.grantN.Store(0)
	s.updateLocked()
	s.mu.Unlock()
}

// dequeueLocked takes p out of the queue, if it is in.
func (s *Share) dequeueLocked(p *Pool) {
	if !p.shareQueued {
		return
	}
	p.shareQueued = false
	p.queuedN.Store(false)
	for i, q := range s.queue {
		if q == p {
			s.queue = append(s.queue[:i], s.queue[i+1:]...)
			return
		}
	}
}

// requestEvictionsLocked asks members with idle connections to close one each
// until the evictions asked for cover the waiting pools and the surplus over
// a lowered cap. It picks the member with the most idle connections each
// time (by its idleN, lowered at once so that the next pick looks elsewhere);
// a member that finds nothing to close says so (evicted), and the search
// goes on.
func (s *Share) requestEvictionsLocked() {
	need := len(s.queue)
	if s.max > 0 && s.used > s.max {
		need += s.used - s.max
	}
	for s.evicting < need {
		var best *Pool
		var most int32
		for m := range s.members {
			if m.shareQueued {
				continue // it waits itself: it has nothing idle to give
			}
			if n := m.idleN.Load(); n > most {
				best, most = m, n
			}
		}
		if best == nil {
			return
		}
		best.idleN.Add(-1)
		best.evictReq.Add(1)
		s.evicting++
		best.wake()
	}
}

// evicted reports that p handled asked evictions: closed of them were done
// (their slots already released), missed found nothing to close. Called with
// p.mu held.
func (s *Share) evicted(closed, missed int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.evicting = max(s.evicting-closed-missed, 0)
	s.evictions += uint64(closed)
	if missed > 0 {
		s.requestEvictionsLocked()
	}
}

// checkedInEviction counts a checked-in connection closed to make room.
func (s *Share) checkedInEviction() {
	s.mu.Lock()
	s.evictions++
	s.mu.Unlock()
}

// wake makes p's maintenance goroutine run soon (to serve a grant or an
// eviction). Non-blocking: it may be called under any lock.
func (p *Pool) wake() { p.kick() }

// shareConnsLocked publishes len(p.conns) for the Share's fairness rule.
func (p *Pool) shareConnsLocked() {
	if p.share != nil {
		p.connN.Store(int32(len(p.conns)))
	}
}

// shareIdleLocked publishes len(p.idle) for the Share's eviction choice.
func (p *Pool) shareIdleLocked() {
	if p.share != nil {
		p.idleN.Store(int32(len(p.idle)))
	}
}

// shareSettleLocked leaves the Share's queue and gives back grants when p
// cannot use them now: its queue is empty, its front waiter waits for
// something else (MaxPoolSize, MaxConnecting), or it is not ready. A pool
// whose waiter left must not keep others' idle connections closing for it.
func (p *Pool) shareSettleLocked() {
	if p.share != nil && (p.grantN.Load() > 0 || p.queuedN.Load()) {
		p.share.giveBack(p)
	}
}

// shareEvictLocked closes the idle connections the Share asked p for, least
// recently used first, while pools still wait. Called by maintenance.
func (p *Pool) shareEvictLocked() {
	n := int(p.evictReq.Swap(0))
	if n == 0 {
		return
	}
	closed := 0
	for closed < n && len(p.idle) > 0 && p.share.pressure.Load() {
		c := p.idle[0]
		p.idle = slices.Delete(p.idle, 0, 1)
		p.closeLocked(c, ReasonIdle, nil)
		closed++
	}
	p.shareIdleLocked()
	p.share.evicted(closed, n-closed)
}

// shareReclaimLocked reports whether a connection being made available to p
// (checked in, or established for nobody) should rather close to make room:
// pools wait for the Share, or it is over a lowered cap, and either nobody
// waits in p or p holds more than its fair part (overShare). One atomic load
// when nobody waits.
func (p *Pool) shareReclaimLocked() bool {
	if p.share == nil || !p.share.pressure.Load() {
		return false
	}
	return p.queue.n == 0 || p.share.overShare(p, len(p.conns))
}

// overShare reports whether p, whose own waiters would reuse a connection,
// must give it up all the same: the Share is over its cap (lowered), or the
// first pool waiting for a slot has none at all, or at least two fewer than
// p's n. Without it a user whose queue never empties would keep every slot
// for ever, and the others would wait until their wait-queue timeout. The
// rule only ever moves a slot towards an even split (never between two
// pools one apart), so slots do not swing back and forth between busy users:
// each move costs a new connection and a login upstream. Called with p.mu
// held.
func (s *Share) overShare(p *Pool, n int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.max == 0 {
		return false
	}
	if s.used > s.max {
		return true
	}
	for _, q := range s.queue {
		if q == p {
			continue
		}
		m := int(q.connN.Load())
		return m == 0 || m < n-1
	}
	return false
}
