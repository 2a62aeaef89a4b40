package evloop

// The engine alone, on each I/O model, with a handler that knows nothing
// of MongoDB: four-byte requests from a client socket go to an upstream
// socket, whose four-byte replies go back, pipelined or not; a client that
// closes ends its stream; an upstream that closes fails the request.

import (
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"
)

// relay is a Handler that forwards each four-byte request of its
// endpoint to its upstream and each four-byte reply back.
type relay struct {
	ep  Endpoint
	u   *Upstream
	buf [64]byte
	n   int // reply bytes received
	// mu guards what the test reads: the failure and the end of stream.
	mu     sync.Mutex
	failed error
	ended  bool
}

func (h *relay) RequestReceived(th Thread, err error) {
	if err != nil {
		h.mu.Lock()
		h.ended = true
		h.mu.Unlock()
		h.ep.State = Closed
		h.ep.Close(false)
		return
	}
	p := h.ep.Win.Pending()
	if len(p) < 4 {
		h.ep.RecvRequest(th)
		return
	}
	req := p[:4]
	h.ep.Win.Consume(4) // the bytes stay until the next receive compacts
	h.n = 0
	h.ep.SendRequest(th, h.u, req, h.buf[:])
}

func (h *relay) ReplyReceived(th Thread, n int) {
	h.n += n
	if h.n < 4 {
		h.ep.RecvReply(th, h.buf[h.n:])
		return
	}
	h.ep.EndReply()
	if _, err := h.ep.Write(h.buf[:4]); err != nil {
		h.Failed(th, "write", err)
		return
	}
	h.ep.State = Idle
	h.RequestReceived(th, nil) // the next request may be in the window already
}

func (h *relay) Failed(_ Thread, _ string, err error) {
	h.mu.Lock()
	h.failed = err
	h.mu.Unlock()
	h.ep.EndReply()
	h.ep.State = Closed
	h.ep.Close(false)
}

func (h *relay) Resumed(Thread, any, error) {}

func (h *relay) Recover() {
	if v := recover(); v != nil {
		panic(v)
	}
}

// socketPair returns two connected non-blocking stream sockets (the loop
// never blocks): a descriptor, and a net.Conn of Go's.
func socketPair(t *testing.T) (int, net.Conn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC|syscall.SOCK_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fds[1]), "peer")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return fds[0], c
}

// engineRig is a loop, a relay endpoint whose client side the test holds,
// and an upstream whose far side the test serves.
type engineRig struct {
	l      *Loop
	h      *relay
	client net.Conn // the test's side of the endpoint's socket
	peer   net.Conn // the upstream's far side
	up     net.Conn // the upstream connection whose socket the loop borrows
}

func newEngineRig(t *testing.T, model string) *engineRig {
	t.Helper()
	if model != IOEpoll && !RingSupported() {
		t.Skip("the kernel refuses io_uring here")
	}
	l, err := Start(Options{IO: model, Threads: 2, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Stop)
	if l.IO() != model {
		t.Fatalf("loop on %s, want %s", l.IO(), model)
	}
	r := &engineRig{l: l, h: &relay{}}
	// The upstream: a socket of Go's, borrowed through its RawConn.
	ufd, peer := socketPair(t)
	r.peer = peer
	uf := os.NewFile(uintptr(ufd), "upstream")
	uc, err := net.FileConn(uf)
	uf.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { uc.Close() })
	r.up = uc
	rc, err := uc.(*net.UnixConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	if r.h.u, err = l.AttachUpstream(rc); err != nil {
		t.Fatal(err)
	}
	// The endpoint: a descriptor the loop owns.
	cfd, client := socketPair(t)
	r.client = client
	ep := &r.h.ep
	ep.Init(r.h)
	ep.Mu.Lock()
	defer ep.Mu.Unlock()
	if err := l.Attach(ep, cfd); err != nil {
		t.Fatal(err)
	}
	ep.Enter()
	ep.RecvRequest(nil) // off the loop threads, as a goroutine hands over
	return r
}

// serveUpstream answers n requests with their bytes reversed.
func (r *engineRig) serveUpstream(t *testing.T, n int) {
	go func() {
		var b [4]byte
		for range n {
			if _, err := io.ReadFull(r.peer, b[:]); err != nil {
				return
			}
			b[0], b[1], b[2], b[3] = b[3], b[2], b[1], b[0]
			if _, err := r.peer.Write(b[:]); err != nil {
				return
			}
		}
	}()
}

func TestEngineRelaysRequestsAndReplies(t *testing.T) {
	for _, model := range []string{IOEpoll, IOUring, IOAdaptive} {
		t.Run(model, func(t *testing.T) {
			r := newEngineRig(t, model)
			r.serveUpstream(t, 6)
			_ = r.client.SetDeadline(time.Now().Add(10 * time.Second))
			// One at a time, then three pipelined in one write.
			for _, req := range []string{"abcd", "wxyz", "1234"} {
				if _, err := r.client.Write([]byte(req)); err != nil {
					t.Fatal(err)
				}
				expectReply(t, r.client, reverse(req))
			}
			if _, err := r.client.Write([]byte("pqrsklmnefgh")); err != nil {
				t.Fatal(err)
			}
			for _, req := range []string{"pqrs", "klmn", "efgh"} {
				expectReply(t, r.client, reverse(req))
			}
			// The client leaves: its stream ends, the endpoint closes.
			r.client.Close()
			waitFor(t, "the endpoint closed", func() bool {
				r.h.mu.Lock()
				defer r.h.mu.Unlock()
				return r.h.ended
			})
		})
	}
}

// An upstream that closes while a request waits for its reply fails the
// request (Handler.Failed), on either model.
func TestEngineFailsARequestWhoseUpstreamCloses(t *testing.T) {
	for _, model := range []string{IOEpoll, IOUring, IOAdaptive} {
		t.Run(model, func(t *testing.T) {
			r := newEngineRig(t, model)
			go func() {
				var b [4]byte
				_, _ = io.ReadFull(r.peer, b[:])
				r.peer.Close()
			}()
			if _, err := r.client.Write([]byte("lost")); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the request failed", func() bool {
				r.h.mu.Lock()
				defer r.h.mu.Unlock()
				return r.h.failed != nil
			})
		})
	}
}

func reverse(s string) string {
	b := []byte(s)
	for i, j := 0, len(b)-1; i < j; i, j = i+1, j-1 {
		b[i], b[j] = b[j], b[i]
	}
	return string(b)
}

func expectReply(t *testing.T, c net.Conn, want string) {
	t.Helper()
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("reading %q: %v", want, err)
	}
	if string(got) != want {
		t.Fatalf("reply %q, want %q", got, want)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting: %s", what)
}
