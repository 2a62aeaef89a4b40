package upstream

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// Conn is an established upstream connection: dialled, handshaken and, when
// configured, authenticated.
//
// Concurrency: one goroutine may write (WriteMessage) while another reads
// (ReadMessage); RoundTrip does both and must not overlap either. Close and
// SetDeadline may be called at any time from any goroutine, and Close
// interrupts I/O in progress.
type Conn struct {
	nc net.Conn
	// raw is nc without TLS; Close closes it directly because tls.Conn.Close
	// may block for seconds sending close_notify to a peer that is not
	// reading, and upstreams do not need the alert.
	raw net.Conn
	// br buffers reads so that a small reply (header and body) costs one
	// read system call instead of two; only the reading goroutine uses it.
	br   *bufio.Reader
	addr string
	id   int64

	// Set during the handshake, read-only afterwards.
	hello      *Hello
	compressor wire.CompressorID
	compress   bool
	maxMsg     int

	// reqID numbers the requests RoundTrip sends.
	reqID atomic.Int32
	// strays are moreToCome requests whose replies may still come (Fence,
	// Stray); answers is set once the server was seen answering such a
	// request. Used by the connection's user only.
	strays  []int32
	answers bool

	// wbuf is the writer's compression scratch; only
	// the writing goroutine touches it.
	wbuf []byte
	// zbuf is the reader's decompression scratch and rbuf RoundTrip's reply
	// buffer; only the reading goroutine touches them.
	zbuf []byte
	rbuf []byte
	// qbuf holds RoundTrip's request.
	qbuf []byte

	// attachment is the user's per-connection state (the proxy's event loop
	// keeps its registration there).
	attachment atomic.Value

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error // written once inside closeOnce
}

// readBufferSize is the read buffer of each upstream connection: enough for
// most replies in one read, and cheap because upstream connections are few.
const readBufferSize = 8 * 1024

func newConn(nc, raw net.Conn, addr string, id int64, maxMsg int) *Conn {
	return &Conn{nc: nc, raw: raw, br: bufio.NewReaderSize(nc, readBufferSize), addr: addr, id: id, maxMsg: maxMsg}
}

// Hello returns the server's handshake reply. The caller must not modify it.
func (c *Conn) Hello() *Hello { return c.hello }

// Address returns the address the connection was dialled with.
func (c *Conn) Address() string { return c.addr }

// ID returns the connection id given to Connect.
func (c *Conn) ID() int64 { return c.id }

// Compressor returns the compressor negotiated in the handshake, if any.
func (c *Conn) Compressor() (wire.CompressorID, bool) { return c.compressor, c.compress }

// ServiceID returns the serviceId of a load-balanced upstream. It implements
// pool.ServiceIDer.
func (c *Conn) ServiceID() (bson.ObjectID, bool) {
	if c.hello == nil {
		return bson.ObjectID{}, false
	}
	return c.hello.ServiceID, c.hello.HasServiceID
}

// NetConn returns the underlying connection, for callers that splice bytes
// themselves. Reading or writing it directly bypasses compression.
func (c *Conn) NetConn() net.Conn { return c.nc }

// Buffered returns how many bytes were read from the socket and not yet
// returned by ReadMessage. After a whole exchange anything here is a reply
// nobody asked for, which would be taken for the next request's: the
// connection must not be reused.
func (c *Conn) Buffered() int { return c.br.Buffered() }

// MaxMessageSize returns the largest message ReadMessage accepts: the
// server's maxMessageSizeBytes once the handshake has completed.
func (c *Conn) MaxMessageSize() int { return c.maxMsg }

// SetDeadline sets the read and write deadline of the underlying connection.
func (c *Conn) SetDeadline(t time.Time) error { return c.nc.SetDeadline(t) }

// Close closes the connection. It is idempotent, safe to call concurrently
// with I/O (which it interrupts) and does not block on the network.
//
// An attachment with an UpstreamClosed method hears of the close
// afterwards: closing a descriptor removes it from every epoll set, and may
// drop an event already pending there, so an event loop waiting for a reply
// on this connection would otherwise never learn that none will come.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() {
		c.closed.Store(true)
		c.closeErr = c.raw.Close()
		if h, ok := c.attachment.Load().(interface{ UpstreamClosed() }); ok {
			h.UpstreamClosed()
		}
	})
	return c.closeErr
}

// RawConn returns the socket for callers that do their own non-blocking I/O
// (the proxy's event loop), when there is no TLS layer, no compression and
// no buffered input: ok is false otherwise. Reading or writing it must
// stay in step with ReadMessage and WriteMessage: only whole exchanges may
// be done one way or the other.
func (c *Conn) RawConn() (rc syscall.RawConn, ok bool) {
	if c.nc != c.raw || c.compress || c.br.Buffered() != 0 {
		return nil, false
	}
	sc, isSC := c.raw.(syscall.Conn)
	if !isSC {
		return nil, false
	}
	rc, err := sc.SyscallConn()
	return rc, err == nil
}

// Attachment returns what SetAttachment stored, or nil.
func (c *Conn) Attachment() any { return c.attachment.Load() }

// SetAttachment stores the user's state for this connection. v must always
// have the same concrete type.
func (c *Conn) SetAttachment(v any) { c.attachment.Store(v) }

// IOError wraps an error of I/O done on RawConn as ReadMessage and
// WriteMessage wrap theirs: a *NetworkError, with ErrClosed as the cause
// after Close.
func (c *Conn) IOError(op string, err error) error { return c.ioError(op, err) }

// WriteMessage writes one whole wire message. When a compressor was
// negotiated, messages that may be compressed (wire.CanCompress) are sent as
// OP_COMPRESSED; hello and the authentication commands never are. msg is not
// modified or retained.
func (c *Conn) WriteMessage(msg []byte) error {
	out := msg
	if c.compress && wire.CanCompress(msg) {
		z, err := wire.Compress(c.wbuf[:0], msg, c.compressor)
		if err != nil {
			return &NetworkError{Addr: c.addr, Op: "write", Err: err}
		}
		c.wbuf = z
		out = z
	}
	if _, err := c.nc.Write(out); err != nil {
		return c.ioError("write", err)
	}
	return nil
}

// ReadMessage reads one whole message, bounded by MaxMessageSize, into buf
// (growing it when too small) and returns it. An OP_COMPRESSED message is
// returned decompressed, with its original opcode. Every error is a
// *NetworkError: after one the connection must be closed.
func (c *Conn) ReadMessage(buf []byte) ([]byte, error) {
	msg, err := wire.ReadMessage(c.br, buf, c.maxMsg)
	if err != nil {
		return nil, c.ioError("read", err)
	}
	h, err := wire.ParseHeader(msg)
	if err != nil {
		return nil, c.ioError("read", err)
	}
	if h.OpCode != wire.OpCompressed {
		return msg, nil
	}
	z, err := wire.Decompress(c.zbuf[:0], msg, c.maxMsg)
	if err != nil {
		return nil, c.ioError("read", err)
	}
	c.zbuf = z
	// Hand the result back in the caller's buffer so that ownership stays
	// where ReadMessage's contract puts it; zbuf remains ours.
	return append(msg[:0], z...), nil
}

// ioError wraps an I/O failure. After Close, the cause is ErrClosed rather
// than whatever the interrupted syscall reported.
func (c *Conn) ioError(op string, err error) error {
	if c.closed.Load() && !errors.Is(err, os.ErrDeadlineExceeded) {
		err = fmt.Errorf("%w: %w", ErrClosed, err)
	}
	return &NetworkError{Addr: c.addr, Op: op, Err: err}
}

// RoundTrip sends cmd to database db as one OP_MSG and returns the reply
// body, an owned copy. "$db" is appended to cmd unless it has one. A reply
// with ok:0 returns a *CommandError (and the reply); the connection remains
// usable. Every other error is a *NetworkError and the connection must be
// discarded.
//
// ctx bounds the exchange: its deadline, if any, becomes the connection's
// deadline (and is cleared afterwards, replacing any set with SetDeadline), and its cancellation closes the connection, because
// an exchange cut in the middle leaves the stream out of step anyway.
// RoundTrip is meant for the handshake, monitoring, authentication and
// cleanup commands, not for proxying client traffic.
func (c *Conn) RoundTrip(ctx context.Context, db string, cmd bsoncore.Document) (bsoncore.Document, error) {
	if err := ctx.Err(); err != nil {
		return nil, &NetworkError{Addr: c.addr, Op: "write", Err: err}
	}
	if c.closed.Load() {
		return nil, &NetworkError{Addr: c.addr, Op: "write", Err: ErrClosed}
	}
	if dl, ok := ctx.Deadline(); ok {
		if err := c.nc.SetDeadline(dl); err != nil {
			return nil, c.ioError("write", err)
		}
		defer c.nc.SetDeadline(time.Time{})
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()

	reply, err := c.roundTrip(db, cmd)
	if err != nil {
		if ctxErr := ctxError(ctx, err); ctxErr != nil {
			// The context ended first: it is the real cause, the I/O error
			// (use of closed connection, timeout) only its symptom.
			var ne *NetworkError
			if errors.As(err, &ne) {
				return nil, &NetworkError{Addr: c.addr, Op: ne.Op, Err: fmt.Errorf("%w (%w)", ctxErr, ne.Err)}
			}
		}
		return reply, err
	}
	return reply, nil
}

func (c *Conn) roundTrip(db string, cmd bsoncore.Document) (bsoncore.Document, error) {
	id := c.reqID.Add(1)
	body, err := withDB(cmd, db)
	if err != nil {
		return nil, err
	}
	c.qbuf = wire.AppendMsg(c.qbuf[:0], id, 0, 0, body)
	if err := c.WriteMessage(c.qbuf); err != nil {
		return nil, err
	}
	msg, err := c.ReadMessage(c.rbuf[:0])
	if err != nil {
		return nil, err
	}
	c.rbuf = msg
	h, err := wire.ParseHeader(msg)
	if err != nil {
		return nil, c.ioError("read", err)
	}
	for h.ResponseTo != id && c.Stray(h.ResponseTo) {
		// A late reply to an earlier moreToCome request (Fence).
		if msg, err = c.ReadMessage(c.rbuf[:0]); err != nil {
			return nil, err
		}
		c.rbuf = msg
		if h, err = wire.ParseHeader(msg); err != nil {
			return nil, c.ioError("read", err)
		}
	}
	if h.OpCode != wire.OpMsg {
		return nil, c.badReply("reply opcode is %v, want OP_MSG", h.OpCode)
	}
	if h.ResponseTo != id {
		return nil, c.badReply("reply responseTo %d, want %d", h.ResponseTo, id)
	}
	m, err := wire.ParseMsg(msg)
	if err != nil {
		return nil, c.ioError("read", err)
	}
	if m.Flags.Has(wire.FlagMoreToCome) {
		// We never set exhaustAllowed, so a streamed reply means the
		// server and we disagree about the state of this connection.
		return nil, c.badReply("unrequested moreToCome reply")
	}
	reply := bsoncore.Document(append([]byte(nil), m.Body...))
	if cerr := commandError(reply); cerr != nil {
		return reply, cerr
	}
	return reply, nil
}

// Fence makes sure that nothing is left to read on the connection after a
// request sent with moreToCome (request ID after), before anyone else uses
// it. A server must not answer such a request, but MongoDB-compatible ones
// may (FerretDB does), at any time later: Fence sends its own {ping: 1}
// and reads up to its reply, dropping replies to after on the way. Any
// other message, or more than one reply to after, is a *NetworkError, and
// the connection must be discarded. ctx bounds the exchange as in
// RoundTrip.
func (c *Conn) Fence(ctx context.Context, after int32) error {
	if err := ctx.Err(); err != nil {
		return &NetworkError{Addr: c.addr, Op: "write", Err: err}
	}
	if dl, ok := ctx.Deadline(); ok {
		if err := c.nc.SetDeadline(dl); err != nil {
			return c.ioError("write", err)
		}
		defer c.nc.SetDeadline(time.Time{})
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	id := c.reqID.Add(1)
	if id == after {
		// after was the client's to choose: a reply to it would pass for
		// the fence's.
		id = c.reqID.Add(1)
	}
	c.qbuf = wire.AppendMsg(c.qbuf[:0], id, 0, 0, fencePing)
	if err := c.WriteMessage(c.qbuf); err != nil {
		return err
	}
	dropped := 0
	for {
		msg, err := c.ReadMessage(c.rbuf[:0])
		if err != nil {
			return err
		}
		c.rbuf = msg
		to := int32(binary.LittleEndian.Uint32(msg[8:]))
		switch {
		case to == id:
			if c.br.Buffered() > 0 {
				return c.badReply("more after the reply to the fence")
			}
			if dropped == 0 {
				// A server that answers moreToCome requests but reorders
				// its replies could still send this one.
				c.rememberStray(after)
			}
			return nil
		case to == after && dropped == 0:
			dropped++
			c.answers = true
		case c.Stray(to):
		default:
			return c.badReply("fence %d found a reply to %d", id, to)
		}
	}
}

// maxStrays bounds the request IDs a connection remembers for Stray; a
// real server never answers them, so the oldest are forgotten.
const maxStrays = 4

// rememberStray records a moreToCome request whose reply the fence did not
// see.
func (c *Conn) rememberStray(id int32) {
	if len(c.strays) == maxStrays {
		copy(c.strays[:], c.strays[1:])
		c.strays = c.strays[:maxStrays-1]
	}
	c.strays = append(c.strays, id)
}

// Stray reports whether a reply to responseTo answers a moreToCome request
// sent earlier on this connection, whose reply a fence did not see, and
// forgets that request: such a reply is dropped, not taken for the reply
// to the request in flight. Only the connection's user calls it.
func (c *Conn) Stray(responseTo int32) bool {
	for i, id := range c.strays {
		if id == responseTo {
			c.strays = append(c.strays[:i], c.strays[i+1:]...)
			c.answers = true
			return true
		}
	}
	return false
}

// AwaitsStray reports whether a reply to a moreToCome request with ID id,
// whose reply a fence did not see, may still come on this connection (and
// Stray would drop it). A request sent with that ID could not tell its own
// reply from that one. Only a connection whose server has been seen
// answering such requests (in a fence, or late) is taken to: MongoDB never
// does, and clients number their requests from 1 in every process, so a
// remembered ID comes back often (each time it would cost the connection);
// on any other connection the ID is forgotten and false returned. Only the
// connection's user calls it.
func (c *Conn) AwaitsStray(id int32) bool {
	i := slices.Index(c.strays, id)
	if i < 0 {
		return false
	}
	if c.answers {
		return true
	}
	c.strays = slices.Delete(c.strays, i, i+1)
	return false
}

// fencePing is the command Fence sends.
var fencePing = func() bsoncore.Document {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendInt32Element(d, "ping", 1)
	d = bsoncore.AppendStringElement(d, "$db", "admin")
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}()

func (c *Conn) badReply(format string, args ...any) error {
	return &NetworkError{Addr: c.addr, Op: "read", Err: fmt.Errorf("%w: "+format, append([]any{ErrBadReply}, args...)...)}
}

// withDB returns cmd with "$db": db appended, unless it already names one.
func withDB(cmd bsoncore.Document, db string) (bsoncore.Document, error) {
	if err := cmd.Validate(); err != nil {
		return nil, fmt.Errorf("upstream: invalid command document: %w", err)
	}
	if _, err := cmd.LookupErr("$db"); err == nil {
		return cmd, nil
	}
	out := make([]byte, 0, len(cmd)+len(db)+11)
	idx, out := bsoncore.AppendDocumentStart(out)
	out = append(out, cmd[4:len(cmd)-1]...)
	out = bsoncore.AppendStringElement(out, "$db", db)
	out, err := bsoncore.AppendDocumentEnd(out, idx)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// commandError returns a *CommandError when reply says ok:0 (or lacks a
// usable ok), nil when it says ok:1.
func commandError(reply bsoncore.Document) error {
	okv, err := reply.LookupErr("ok")
	if err == nil {
		if f, isNum := okv.AsFloat64OK(); isNum && f == 1 {
			return nil
		}
		if b, isBool := okv.BooleanOK(); isBool && b {
			return nil
		}
	}
	ce := &CommandError{}
	if v, err := reply.LookupErr("code"); err == nil {
		if n, ok := v.AsInt64OK(); ok && n == int64(int32(n)) {
			ce.Code = int32(n)
		}
	}
	ce.CodeName, _ = reply.Lookup("codeName").StringValueOK()
	ce.Message, _ = reply.Lookup("errmsg").StringValueOK()
	if labels, ok := stringArray(reply.Lookup("errorLabels")); ok {
		ce.Labels = labels
	}
	if ce.Message == "" && okv.Type == 0 {
		ce.Message = "reply has no ok field"
	}
	return ce
}

// ctxError returns ctx's error if ctx has ended, or is about to: the
// connection deadline set from ctx's deadline can fire a moment before ctx's
// own timer, and a timeout then is the context's deadline all the same.
func ctxError(ctx context.Context, ioErr error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) && errors.Is(ioErr, os.ErrDeadlineExceeded) {
		return context.DeadlineExceeded
	}
	return nil
}
