package auth

// The shape of real users' credentials (iteration count, salt length) per
// mechanism, counted over the auth_file's users and the users lookups
// found, so that an unknown user's fake credentials have the shape most
// real users have: a fake with MongoDB's default 15000 iterations among
// users created with 4096 would stand out in the server-first message.

import (
	"cmp"
	"sync"
)

// shape is what server-first shows of stored credentials besides the salt
// itself.
type shape struct{ iters, saltLen int }

// maxShapes bounds the distinct shapes counted per mechanism from
// lookups; past it new shapes are not counted (real deployments have a
// handful: one per iteration-count setting they ever had).
const maxShapes = 64

// shapeCounts are the users seen per shape, per mechanism.
type shapeCounts map[Mechanism]map[shape]int

func (sc shapeCounts) add(c Creds, bound bool) {
	for _, m := range Mechanisms {
		st, ok := c.For(m)
		if !ok {
			continue
		}
		byShape := sc[m]
		if byShape == nil {
			byShape = map[shape]int{}
			sc[m] = byShape
		}
		k := shape{st.Iters, len(st.Salt)}
		if _, ok := byShape[k]; !ok && bound && len(byShape) >= maxShapes {
			continue
		}
		byShape[k]++
	}
}

// shapes counts the shapes of the auth_file in force and of lookups.
type shapes struct {
	mu   sync.Mutex
	file shapeCounts // the auth_file in force; guarded by mu
	seen shapeCounts // every user a lookup found (once per lookup); guarded by mu
}

func newShapes() *shapes { return &shapes{file: shapeCounts{}, seen: shapeCounts{}} }

// setFile counts the users of u, replacing the previous auth_file's.
func (s *shapes) setFile(u *Users) {
	fc := shapeCounts{}
	if u != nil {
		for _, c := range u.m {
			fc.add(c, false)
		}
	}
	s.mu.Lock()
	s.file = fc
	s.mu.Unlock()
}

// found counts a user a lookup found.
func (s *shapes) found(c Creds) {
	s.mu.Lock()
	s.seen.add(c, true)
	s.mu.Unlock()
}

// common is the shape most users of m have (ties to the larger iteration
// count, then salt length, so that it does not depend on map order);
// MongoDB's defaults when no user of m is known.
func (s *shapes) common(m Mechanism) shape {
	s.mu.Lock()
	defer s.mu.Unlock()
	best, bestN := shape{iterationsOf(m), saltLen(m)}, 0
	total := map[shape]int{}
	for k, n := range s.file[m] {
		total[k] += n
	}
	for k, n := range s.seen[m] {
		total[k] += n
	}
	for k, n := range total {
		if n > bestN || n == bestN && cmp.Or(cmp.Compare(k.iters, best.iters), cmp.Compare(k.saltLen, best.saltLen)) > 0 {
			best, bestN = k, n
		}
	}
	return best
}
