package loadgen

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// RelayKind names a reference relay's I/O model.
type RelayKind string

const (
	// RelayGoroutine relays with one goroutine per client connection and
	// blocking reads and writes through Go's netpoller: the I/O model of
	// mongobouncer itself.
	RelayGoroutine RelayKind = "goroutine"
	// RelayEpoll relays from a few event loops on epoll with raw system
	// calls and no goroutine per connection (Linux only): the I/O model of
	// HAProxy or PgBouncer.
	RelayEpoll RelayKind = "epoll"
	// RelayUring relays from a few event loops on io_uring: every socket
	// has a receive in flight, and a loop submits its sends and receives
	// and collects their completions with one system call per batch.
	RelayUring RelayKind = "uring"
)

// MaxRelayMessage bounds the messages a reference relay carries; a larger
// one closes that client. The relays exist to measure small commands.
const MaxRelayMessage = 64 * 1024

// relayDialTimeout bounds the dial of a client's upstream connection.
const relayDialTimeout = 5 * time.Second

// ErrRelayUnsupported reports a relay kind this platform cannot run.
var ErrRelayUnsupported = errors.New("loadgen: relay kind not supported on this platform")

// Relay is a reference proxy for comparisons, not a pooler: it gives each
// client connection a dedicated upstream connection and copies whole
// messages between them, with no inspection, routing, pooling or
// accounting. What it costs is the floor of what any relay with that I/O
// model costs on the machine, so a benchmark that measures it beside
// mongobouncer tells how much of mongobouncer's cost is its own work and how
// much the relaying itself.
type Relay struct {
	ln       net.Listener
	upstream string

	wg     sync.WaitGroup
	closed chan struct{}
	once   sync.Once

	// mu guards conns, the open connections of the goroutine relay, so that
	// Close can end them.
	mu    sync.Mutex
	conns map[net.Conn]struct{}

	loops relayLoops // RelayEpoll and RelayUring only

	// delay holds every reply back this long (nanoseconds; SetDelay),
	// goroutine relay only.
	delay atomic.Int64
}

// SetDelay makes the relay hold every upstream reply back by d before
// passing it on, from the next reply (0: none): an upstream that slows
// down mid-run, for measuring how a pool reacts. Only the goroutine relay
// (RelayGoroutine) delays; the others ignore it.
func (r *Relay) SetDelay(d time.Duration) { r.delay.Store(int64(max(d, 0))) }

// relayLoops is the engine of a relay that polls sockets itself.
type relayLoops interface {
	add(c, u net.Conn) error
	stop()
}

// ListenRelay starts a reference relay of the given kind on addr in front
// of the upstream address. Close stops it and ends its connections.
func ListenRelay(addr, upstream string, kind RelayKind) (*Relay, error) {
	r := &Relay{upstream: upstream, closed: make(chan struct{}), conns: make(map[net.Conn]struct{})}
	switch kind {
	case RelayGoroutine:
	case RelayEpoll:
		loops, err := startEpollLoops()
		if err != nil {
			return nil, err
		}
		r.loops = loops
	case RelayUring:
		loops, err := startUringLoops()
		if err != nil {
			return nil, err
		}
		r.loops = loops
	default:
		return nil, fmt.Errorf("loadgen: unknown relay kind %q (want %q, %q or %q)", kind, RelayGoroutine, RelayEpoll, RelayUring)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		if r.loops != nil {
			r.loops.stop()
		}
		return nil, err
	}
	r.ln = ln
	r.wg.Add(1)
	go r.accept()
	return r, nil
}

// Addr returns the address the relay listens on.
func (r *Relay) Addr() string { return r.ln.Addr().String() }

// Close stops accepting, ends every relayed connection and waits for the
// relay's goroutines.
func (r *Relay) Close() error {
	r.once.Do(func() {
		close(r.closed)
		_ = r.ln.Close()
		r.mu.Lock()
		for c := range r.conns {
			_ = c.Close()
		}
		r.mu.Unlock()
		if r.loops != nil {
			r.loops.stop()
		}
	})
	r.wg.Wait()
	return nil
}

func (r *Relay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			select {
			case <-r.closed:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			time.Sleep(10 * time.Millisecond) // e.g. out of file descriptors
			continue
		}
		u, err := net.DialTimeout("tcp", r.upstream, relayDialTimeout)
		if err != nil {
			_ = c.Close()
			continue
		}
		if r.loops != nil {
			if err := r.loops.add(c, u); err != nil {
				_ = c.Close()
				_ = u.Close()
			}
			continue
		}
		if !r.track(c, u) {
			return
		}
		r.wg.Add(1)
		go r.pump(c, u)
	}
}

// track records a goroutine relay's pair so that Close can end it; it
// reports false (and closes both) once the relay is closed.
func (r *Relay) track(c, u net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-r.closed:
		_ = c.Close()
		_ = u.Close()
		return false
	default:
	}
	r.conns[c], r.conns[u] = struct{}{}, struct{}{}
	return true
}

// pump is the goroutine relay's per-client loop: one request to the
// upstream, one reply back, as a pooler in statement mode without the pool.
func (r *Relay) pump(c, u net.Conn) {
	defer r.wg.Done()
	defer func() {
		_ = c.Close()
		_ = u.Close()
		r.mu.Lock()
		delete(r.conns, c)
		delete(r.conns, u)
		r.mu.Unlock()
	}()
	cr := bufio.NewReaderSize(c, 4096)
	ur := bufio.NewReaderSize(u, 4096)
	buf := make([]byte, 4096)
	relay := func(r io.Reader, w io.Writer) bool {
		msg, err := wire.ReadMessage(r, buf, MaxRelayMessage)
		if err != nil {
			return false
		}
		if cap(msg) > cap(buf) {
			buf = msg[:cap(msg)]
		}
		_, err = w.Write(msg)
		return err == nil
	}
	for relay(cr, u) {
		// The request is upstream; its reply waits out the delay, as if
		// the server were that much slower.
		if d := r.delay.Load(); d > 0 {
			time.Sleep(time.Duration(d))
		}
		if !relay(ur, c) {
			return
		}
	}
}
