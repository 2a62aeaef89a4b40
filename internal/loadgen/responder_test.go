package loadgen

import (
	"bufio"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// responderOpts shapes the in-test loopback server. It answers hello with
// ok:1 and every other OP_MSG according to the options.
type responderOpts struct {
	// failPings answers pings with {ok: 0, errmsg: "boom", code: 8000}.
	failPings bool
	// closeAfter closes a connection instead of answering its
	// (closeAfter+1)-th ping (0: never).
	closeAfter int
	// closeAfterHello closes each connection right after the hello reply.
	closeAfterHello bool
	// delay holds every ping reply this long.
	delay time.Duration
	// hang never answers pings (until the client goes away).
	hang bool
	// silent never answers anything, hello included.
	silent bool
}

type responder struct {
	t    testing.TB
	ln   net.Listener
	opts responderOpts
	wg   sync.WaitGroup

	hellos atomic.Int64
	pings  atomic.Int64
	open   atomic.Int64

	mu sync.Mutex
	// conns is guarded by mu; closed marks shutdown so late accepts close.
	conns  map[net.Conn]struct{}
	closed bool
}

var (
	okReply    = bsoncore.NewDocumentBuilder().AppendDouble("ok", 1).Build()
	helloReply = bsoncore.NewDocumentBuilder().
			AppendBoolean("isWritablePrimary", true).
			AppendInt32("maxWireVersion", 21).
			AppendInt32("minWireVersion", 0).
			AppendInt32("logicalSessionTimeoutMinutes", 30).
			AppendDouble("ok", 1).Build()
	failReply = bsoncore.NewDocumentBuilder().
			AppendDouble("ok", 0).
			AppendString("errmsg", "boom").
			AppendInt32("code", 8000).
			AppendString("codeName", "AtlasError").Build()
)

func startResponder(t testing.TB, opts responderOpts) *responder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &responder{t: t, ln: ln, opts: opts, conns: map[net.Conn]struct{}{}}
	r.wg.Go(r.accept)
	t.Cleanup(r.close)
	return r
}

func (r *responder) addr() string { return r.ln.Addr().String() }

func (r *responder) close() {
	_ = r.ln.Close()
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		_ = c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

func (r *responder) accept() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			_ = c.Close()
			return
		}
		r.conns[c] = struct{}{}
		r.mu.Unlock()
		r.open.Add(1)
		r.wg.Go(func() { r.serve(c) })
	}
}

// serve answers requests without allocating in the steady state, so that
// BenchmarkPingClient's allocation count is the generator's own.
func (r *responder) serve(c net.Conn) {
	defer func() {
		_ = c.Close()
		r.mu.Lock()
		delete(r.conns, c)
		r.mu.Unlock()
		r.open.Add(-1)
	}()
	br := bufio.NewReader(c)
	buf := make([]byte, 0, 4096)
	out := make([]byte, 0, 512)
	var m wire.Msg
	pings := 0
	for {
		msg, err := wire.ReadMessage(br, buf, 1<<20)
		if err != nil {
			return
		}
		if err := wire.ParseMsgInto(msg, &m); err != nil {
			r.t.Errorf("responder: %v", err)
			return
		}
		if r.opts.silent {
			_, _ = br.ReadByte()
			return
		}
		reply := okReply
		if wire.CommandName(m.Body) == "hello" {
			r.hellos.Add(1)
			reply = helloReply
		} else {
			pings++
			if r.opts.closeAfter > 0 && pings > r.opts.closeAfter {
				return
			}
			if r.opts.hang {
				// Wait for the client to hang up (or the test to end).
				_, _ = br.ReadByte()
				return
			}
			if r.opts.delay > 0 {
				time.Sleep(r.opts.delay)
			}
			if r.opts.failPings {
				reply = failReply
			}
			r.pings.Add(1)
		}
		out = wire.AppendMsg(out[:0], 1, m.Header.RequestID, 0, reply)
		if _, err := c.Write(out); err != nil {
			return
		}
		if r.opts.closeAfterHello {
			return
		}
	}
}
