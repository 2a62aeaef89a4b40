package loadgen

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// reconnectBackoff spaces connection attempts after a failure, so a dead
// address costs a few errors per client per second, not a busy loop.
const reconnectBackoff = 20 * time.Millisecond

// maxReplySize bounds a reply (and so the read buffer a client may grow
// to): a ping or hello reply is well under a kilobyte, so anything larger
// than this is a broken peer.
const maxReplySize = 1 << 20

var (
	pingBody = bsoncore.NewDocumentBuilder().
			AppendInt32("ping", 1).
			AppendString("$db", "admin").
			Build()
	helloBody = bsoncore.NewDocumentBuilder().
			AppendInt32("hello", 1).
			AppendString("$db", "admin").
			AppendDocument("client", bsoncore.NewDocumentBuilder().
				AppendDocument("application", bsoncore.NewDocumentBuilder().
					AppendString("name", "mongobouncer-bench").Build()).
				AppendDocument("driver", bsoncore.NewDocumentBuilder().
					AppendString("name", "mongobouncer-loadgen").
					AppendString("version", "1").Build()).
				AppendDocument("os", bsoncore.NewDocumentBuilder().
					AppendString("type", runtime.GOOS).Build()).
				AppendString("platform", runtime.Version()).
				Build()).
			Build()
)

// errStopped marks an operation cut short because the run ended; it is
// neither counted as an error nor as an operation.
var errStopped = errors.New("loadgen: run stopped")

// CommandError is a reply with ok other than 1. The connection that carried
// it stays usable.
type CommandError struct {
	// Code is the server's error code (0 if absent).
	Code int32
	// CodeName is the server's codeName (may be empty).
	CodeName string
	// Message is the server's errmsg (may be empty).
	Message string
}

// Error implements error.
func (e *CommandError) Error() string {
	return fmt.Sprintf("command failed: code %d %s: %s", e.Code, e.CodeName, e.Message)
}

// ReplyError reports a reply that breaks the protocol's rules (wrong
// responseTo, unexpected flags, undecodable). The connection that carried
// it is dropped.
type ReplyError struct {
	// Reason says what was wrong.
	Reason string
}

// Error implements error.
func (e *ReplyError) Error() string { return "bad reply: " + e.Reason }

// replyOK inspects a reply body: nil when ok is 1, else a *CommandError.
// It allocates only on failure.
func replyOK(body bsoncore.Document) error {
	var okSeen bool
	var okVal float64
	if len(body) < 5 {
		return &ReplyError{Reason: "reply body too short"}
	}
	rem := body[4 : len(body)-1]
	for len(rem) > 0 {
		elem, next, ok := bsoncore.ReadElement(rem)
		if !ok {
			return &ReplyError{Reason: "malformed reply body"}
		}
		rem = next
		if string(elem.KeyBytes()) != "ok" {
			continue
		}
		v := elem.Value()
		if v.Type == bsoncore.TypeBoolean {
			if b, ok := v.BooleanOK(); ok && b {
				okVal = 1
			}
		} else {
			okVal, _ = v.AsFloat64OK()
		}
		okSeen = true
		break
	}
	if okSeen && okVal == 1 {
		return nil
	}
	ce := &CommandError{Message: "reply has no ok field"}
	if okSeen {
		ce.Message = ""
	}
	if v, err := body.LookupErr("code"); err == nil {
		if c, ok := v.AsInt32OK(); ok {
			ce.Code = c
		}
	}
	if v, err := body.LookupErr("codeName"); err == nil {
		ce.CodeName, _ = v.StringValueOK()
	}
	if v, err := body.LookupErr("errmsg"); err == nil {
		if s, ok := v.StringValueOK(); ok {
			ce.Message = s
		}
	}
	return ce
}

// pingClient is one closed-loop client of the ping workload. All fields
// but mu, conn and stopped belong to the client's own goroutine.
type pingClient struct {
	r    *run
	addr string
	st   *stats
	// dialer carries the client's source address (Config.SourceAddrs).
	dialer *net.Dialer

	// stopped is set (before any deadline is forced) when the run ends.
	stopped atomic.Bool
	// mu guards writes of conn and the interrupt's use of it; the owning
	// goroutine, the only writer, reads conn without it.
	mu   sync.Mutex
	conn net.Conn

	br    *bufio.Reader
	req   []byte
	hello []byte
	rbuf  []byte
	msg   wire.Msg
	reqID int32
}

func newPingClient(r *run, addr string, i int) *pingClient {
	c := &pingClient{r: r, addr: addr, st: newStats(), rbuf: make([]byte, 0, 4096),
		dialer: dialerFor(r.cfg.SourceAddrs, addr, i)}
	c.req = wire.AppendMsg(nil, 0, 0, 0, pingBody)
	c.hello = wire.AppendMsg(nil, 0, 0, 0, helloBody)
	return c
}

// interrupt unblocks the client when the run ends.
func (c *pingClient) interrupt() {
	c.stopped.Store(true)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil {
		_ = c.conn.SetDeadline(time.Unix(1, 0))
	}
}

func (c *pingClient) setConn(conn net.Conn) (stopped bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.conn = conn
	return c.stopped.Load()
}

func (c *pingClient) closeConn() {
	if c.conn != nil {
		_ = c.conn.Close()
		c.setConn(nil)
	}
}

// connect dials and completes a hello, as a driver's handshake would.
func (c *pingClient) connect(ctx context.Context) error {
	deadline := time.Now().Add(c.r.cfg.DialTimeout)
	if deadline.After(c.r.deadline) {
		deadline = c.r.deadline
	}
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	conn, err := c.dialer.DialContext(dctx, "tcp", c.addr)
	if err != nil {
		if ctx.Err() != nil {
			return errStopped
		}
		return err
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	if c.br == nil {
		c.br = bufio.NewReaderSize(conn, 4096)
	} else {
		c.br.Reset(conn)
	}
	if c.setConn(conn) {
		c.closeConn()
		return errStopped
	}
	if err := c.roundTrip(c.hello, deadline); err != nil {
		c.closeConn()
		return fmt.Errorf("hello: %w", err)
	}
	return nil
}

// roundTrip sends req (its requestID rewritten) and checks the reply.
func (c *pingClient) roundTrip(req []byte, deadline time.Time) error {
	c.reqID++
	if c.reqID <= 0 {
		c.reqID = 1
	}
	wire.SetRequestID(req, c.reqID)
	if err := c.conn.SetDeadline(deadline); err != nil {
		return err
	}
	// Checked after SetDeadline: an interrupt that ran before it has set
	// stopped, one that runs after it wins with its own deadline.
	if c.stopped.Load() {
		return errStopped
	}
	if _, err := c.conn.Write(req); err != nil {
		return err
	}
	msg, err := wire.ReadMessage(c.br, c.rbuf, maxReplySize)
	if err != nil {
		return err
	}
	if cap(msg) > cap(c.rbuf) {
		c.rbuf = msg[:0]
	}
	if err := wire.ParseMsgInto(msg, &c.msg); err != nil {
		return err
	}
	if c.msg.Header.ResponseTo != c.reqID {
		return &ReplyError{Reason: fmt.Sprintf("responseTo %d, want %d", c.msg.Header.ResponseTo, c.reqID)}
	}
	if c.msg.Flags.Has(wire.FlagMoreToCome) {
		return &ReplyError{Reason: "unexpected moreToCome"}
	}
	return replyOK(c.msg.Body)
}

// loop runs the closed loop until the run ends or the op budget is spent.
func (c *pingClient) loop(ctx context.Context) {
	stop := context.AfterFunc(ctx, c.interrupt)
	defer stop()
	defer c.closeConn()
	for !c.stopped.Load() {
		if c.conn == nil {
			err := c.connect(ctx)
			if err == nil {
				continue
			}
			if c.ended(err) {
				return
			}
			c.st.failure(c.r, err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(reconnectBackoff):
			}
			continue
		}
		if !c.r.take() {
			return
		}
		start := time.Now()
		err := c.roundTrip(c.req, c.r.opDeadline(start))
		end := time.Now()
		if err == nil {
			c.st.success(c.r, start, end)
			continue
		}
		if c.ended(err) {
			return
		}
		c.st.failure(c.r, err)
		var ce *CommandError
		if !errors.As(err, &ce) {
			c.closeConn()
		}
	}
}

// ended reports whether err comes from the run ending rather than from
// the server: an interrupt, or a deadline reached at the run's end.
func (c *pingClient) ended(err error) bool {
	return errors.Is(err, errStopped) || c.stopped.Load() || !time.Now().Before(c.r.deadline)
}

// runPing runs the ping workload and returns every client's stats.
func runPing(ctx context.Context, addr string, r *run) []*stats {
	clients := make([]*pingClient, r.cfg.Clients)
	var wg sync.WaitGroup
	for i := range clients {
		c := newPingClient(r, addr, i)
		clients[i] = c
		wg.Go(func() { c.loop(ctx) })
	}
	wg.Wait()
	all := make([]*stats, len(clients))
	for i, c := range clients {
		all[i] = c.st
	}
	return all
}
