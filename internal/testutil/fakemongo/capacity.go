package fakemongo

// A capacity model (Options.Capacity): the server serves commands with a
// fixed number of workers, each taking a fixed service time, so that the
// best number of concurrent requests is known (about Workers) and latency
// is made of sleeps, not of the CPU of a busy test machine. Extra
// concurrency queues for a worker, and with Contention it also makes each
// service slower, as a database thrashing does. The adaptive pool limit is
// measured against it (cmd/mongobouncer-bench -model).

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Capacity configures the capacity model.
type Capacity struct {
	// Workers is how many commands are served at once (at least 1).
	Workers int
	// Service is how long each command takes on a worker.
	Service time.Duration
	// Contention stretches each service by Contention × (outstanding −
	// Workers) / Workers when more than Workers commands are in the
	// server (waiting or served) as it starts: 0 means extra concurrency
	// only queues.
	Contention float64
}

// capacity is the running model: a FIFO semaphore of workers (a channel's
// blocked senders are served in order) and the count in the server.
type capacity struct {
	cfg         Capacity
	workers     chan struct{}
	outstanding atomic.Int64
}

func newCapacity(c *Capacity) *capacity {
	if c == nil || c.Service <= 0 {
		return nil
	}
	cfg := *c
	cfg.Workers = max(cfg.Workers, 1)
	return &capacity{cfg: cfg, workers: make(chan struct{}, cfg.Workers)}
}

// serviceTime is the time one service takes with outstanding commands in
// the server.
func (m *capacity) serviceTime(outstanding int64) time.Duration {
	d := m.cfg.Service
	if extra := outstanding - int64(m.cfg.Workers); m.cfg.Contention > 0 && extra > 0 {
		d = time.Duration(float64(d) * (1 + m.cfg.Contention*float64(extra)/float64(m.cfg.Workers)))
	}
	return d
}

// serve waits for a worker and holds it for one service; it returns
// errKilled when the server is killed meanwhile.
func (m *capacity) serve(killed <-chan struct{}) error {
	m.outstanding.Add(1)
	defer m.outstanding.Add(-1)
	select {
	case m.workers <- struct{}{}:
	case <-killed:
		return errKilled
	}
	defer func() { <-m.workers }()
	t := time.NewTimer(m.serviceTime(m.outstanding.Load()))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-killed:
		return errKilled
	}
}

// underCapacity reports whether the model applies to a command: not to
// the handshake and authentication, which a pool's connections send when
// they open, only to the work.
func underCapacity(cmd string) bool {
	switch cmd {
	case "hello", "isMaster", "ismaster", "saslStart", "saslContinue", "authenticate", "buildInfo", "buildinfo",
		"getnonce", "endSessions":
		return false
	}
	return true
}

// Occupy takes n of the capacity model's workers away from commands, as a
// heavy background job would, and counts them as outstanding for the
// contention; it returns once it holds them (it queues behind commands
// already waiting) or ctx ends, and release gives them back. Without a
// model it does nothing.
func (s *Server) Occupy(ctx context.Context, n int) (release func()) {
	m := s.capacity
	if m == nil || n <= 0 {
		return func() {}
	}
	held := 0
take:
	for held < n {
		select {
		case m.workers <- struct{}{}:
			held++
			m.outstanding.Add(1)
		case <-ctx.Done():
			break take
		case <-s.killed:
			break take
		}
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			for range held {
				<-m.workers
			}
			m.outstanding.Add(-int64(held))
		})
	}
}
