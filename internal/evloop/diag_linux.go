package evloop

// What the engine lets its user see of the io_uring placement of
// endpoints on the threads (place_linux.go), for tests of the whole
// server: where an endpoint lives, how many live on each thread, and a
// way to pin the threads' utilisations.

// Home returns the index of the io_uring thread the endpoint's receives go
// on, and whether one is in flight; -1 on epoll, or before Attach. It
// holds Mu.
func (ep *Endpoint) Home() (thread int, armed bool) {
	rc, ok := ep.reg.(*ringClient)
	if !ok {
		return -1, false
	}
	for i, th := range rc.home.d.threads {
		if th == rc.home {
			return i, rc.armed
		}
	}
	return -1, rc.armed
}

// HomeCounts returns, per io_uring thread, how many endpoints count it as
// their home; nil on epoll.
func (l *Loop) HomeCounts() []int32 {
	d, ok := l.drv.(*ringDriver)
	if !ok {
		return nil
	}
	n := make([]int32, len(d.threads))
	for i, th := range d.threads {
		n[i] = th.load.clients.Load()
	}
	return n
}

// ForceUtil pins the io_uring threads' utilisations, in thousandths, in
// place of the measured ones (a test's placement); false on epoll.
func (l *Loop) ForceUtil(utils ...int32) bool {
	d, ok := l.drv.(*ringDriver)
	if !ok {
		return false
	}
	for i, u := range utils {
		d.threads[i].load.forced.Store(u + 1)
	}
	return true
}

// Lingering is how many closed endpoints wait for a receive in flight
// before their descriptor closes (io_uring; 0 on epoll).
func (l *Loop) Lingering() int64 {
	if d, ok := l.drv.(*ringDriver); ok {
		return d.lingering.Load()
	}
	return 0
}

// OwnFd returns the descriptor of the upstream's socket that the loop
// holds of its own (io_uring's duplicate; -1 once closed, or on epoll,
// which holds none), and whether the loop heard the connection closed.
func (u *Upstream) OwnFd() (fd int, closed bool) {
	ru := u.ring
	if ru == nil {
		return -1, false
	}
	ru.mu.Lock()
	defer ru.mu.Unlock()
	return ru.fdn, ru.closed
}
