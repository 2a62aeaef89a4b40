package gate

// max_user_client_conn: the client connections logged in as one user
// (auth.UserID), across all listeners, as PgBouncer's setting of that name.
// A client counts from its first login to its disconnect. What a refused
// login answers, and that the connection is then closed, is the proxy's.

import (
	"sync"
	"sync/atomic"

	"github.com/mongobouncer/mongobouncer/internal/auth"
)

// Users counts the logged-in clients of each user under a cap. The zero
// value has no cap. It is safe for concurrent use.
type Users struct {
	max     atomic.Int64  // max_user_client_conn; 0: no cap
	refused atomic.Uint64 // logins refused
	mu      sync.Mutex
	n       map[auth.UserID]int // guarded by mu; entries at 0 are deleted
}

// SetMax changes the cap live (0 or less: no cap). Clients counted over a
// lowered cap stay; new ones wait for the count to fall.
func (u *Users) SetMax(n int) { u.max.Store(int64(max(n, 0))) }

// Acquire counts one more client of id, unless the cap is reached; it
// returns the cap it judged by.
func (u *Users) Acquire(id auth.UserID) (bool, int) {
	limit := int(u.max.Load())
	u.mu.Lock()
	defer u.mu.Unlock()
	if limit > 0 && u.n[id] >= limit {
		return false, limit
	}
	if u.n == nil {
		u.n = make(map[auth.UserID]int)
	}
	u.n[id]++
	return true, limit
}

// Release counts one client of id less.
func (u *Users) Release(id auth.UserID) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.n[id]--; u.n[id] <= 0 {
		delete(u.n, id)
	}
}

// Count returns how many clients of id are counted now.
func (u *Users) Count(id auth.UserID) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.n[id]
}

// Refuse counts a refused login; Refused returns how many there were.
func (u *Users) Refuse() { u.refused.Add(1) }

// Refused returns how many logins were refused (Refuse).
func (u *Users) Refused() uint64 { return u.refused.Load() }

// users is the number of users with a client counted (tests).
func (u *Users) users() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.n)
}
