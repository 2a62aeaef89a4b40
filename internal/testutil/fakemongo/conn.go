package fakemongo

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// Reasons a connection stops serving that are not I/O errors.
var (
	errCloseConn = errors.New("fakemongo: connection closed by script")
	errKilled    = errors.New("fakemongo: server killed")
	// errInterrupted ends the wait of a write that a replica-set stepdown
	// killed; the write is answered InterruptedDueToReplStateChange.
	errInterrupted = errors.New("fakemongo: operation interrupted by a stepdown")
)

// maxKeptBuffer is the largest read or write buffer a connection keeps
// between requests, so one huge message does not pin memory for the
// connection's whole life.
const maxKeptBuffer = 4 << 20

// maxAwaitTime bounds maxAwaitTimeMS in awaitable hello.
const maxAwaitTime = time.Hour

// conn serves one client connection. Everything but mu-guarded fields and
// closed/closeOnce is touched only by the connection's own goroutine.
type conn struct {
	s  *Server
	id int64
	nc net.Conn
	br *bufio.Reader

	closed    chan struct{}
	closeOnce sync.Once

	in, dec, out, comp []byte // reusable message buffers
	msg                wire.Msg
	req                Request
	counters           map[string]*cmdCounter // cache of s.cmdCounts
	lastDB             string                 // last $db seen, reused to avoid allocating
	nextRequestID      int32

	mu sync.Mutex
	// appName is the client.application.name of the first hello. Guarded
	// by mu for readers on other goroutines; the connection's goroutine,
	// its only writer, reads it without locking.
	appName string
	// compressors were agreed in hello. Guarded by mu: Server.Builtin on a
	// cloned request may set them from another goroutine.
	compressors []string
	// awaiting is true while an awaitable hello waits, so
	// BumpTopologyVersion knows whose read deadline it may cut short.
	// Guarded by mu.
	awaiting bool
	// killable is true while the connection runs a write on a replica-set
	// member, which a stepdown interrupts (interrupted); intr wakes a wait
	// that is sleeping rather than reading. Guarded by mu.
	killable, interrupted bool
	intr                  chan struct{}

	// auth is the connection's login state (auth.go).
	auth connAuth
}

func newConn(s *Server, nc net.Conn) *conn {
	return &conn{
		s:        s,
		id:       s.nextConnID.Add(1),
		nc:       nc,
		br:       bufio.NewReaderSize(nc, 16<<10),
		closed:   make(chan struct{}),
		counters: make(map[string]*cmdCounter),
		intr:     make(chan struct{}, 1),
	}
}

// beginOp marks whether the request now starting is a write a stepdown may
// interrupt, and forgets the previous request's interruption.
func (c *conn) beginOp(killable bool) {
	c.mu.Lock()
	if c.interrupted {
		// The interruption may have landed outside a wait: lift the
		// deadline it set, or the next read would fail.
		_ = c.nc.SetReadDeadline(time.Time{})
	}
	c.killable, c.interrupted = killable, false
	c.mu.Unlock()
	select {
	case <-c.intr:
	default:
	}
}

// interruptWrite kills the write the connection is running, if any, as a
// stepdown does: its wait ends and it is answered with an error.
func (c *conn) interruptWrite() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.killable || c.interrupted {
		return
	}
	c.interrupted = true
	_ = c.nc.SetReadDeadline(time.Now())
	select {
	case c.intr <- struct{}{}:
	default:
	}
}

// wasInterrupted reports whether a stepdown killed the current write.
func (c *conn) wasInterrupted() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.interrupted
}

// close closes the socket; the serving goroutine then exits. Safe from any
// goroutine, any number of times.
func (c *conn) close() {
	c.closeOnce.Do(func() {
		close(c.closed)
		_ = c.nc.Close()
	})
}

func (c *conn) info() ConnInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	return ConnInfo{ID: c.id, AppName: c.appName, Compressors: slices.Clone(c.compressors), Remote: c.nc.RemoteAddr().String()}
}

// wakeAwait cuts short a pending awaitable hello.
func (c *conn) wakeAwait() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.awaiting {
		_ = c.nc.SetReadDeadline(time.Now())
	}
}

func (c *conn) serve() {
	defer c.s.wg.Done()
	defer c.s.removeConn(c)
	defer c.close()
	for {
		if err := c.serveOne(); err != nil {
			switch {
			case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed), errors.Is(err, errCloseConn), errors.Is(err, errKilled):
				c.s.log.Debug("fakemongo: connection done", "conn", c.id, "reason", err)
			default:
				c.s.log.Info("fakemongo: dropping connection", "conn", c.id, "err", err)
			}
			return
		}
	}
}

// serveOne reads one message and answers it. An error ends the connection.
func (c *conn) serveOne() error {
	maxSize := int(c.s.opts.MaxMessageSizeBytes)
	msg, err := wire.ReadMessage(c.br, c.in, maxSize)
	if err != nil {
		return err
	}
	if cap(msg) <= maxKeptBuffer {
		c.in = msg[:0]
	}
	h, err := wire.ParseHeader(msg)
	if err != nil {
		return err
	}
	req := &c.req
	*req = Request{ConnID: c.id, AppName: c.appName, RequestID: h.RequestID, conn: c}
	var compressor wire.CompressorID
	compressed := false
	if h.OpCode == wire.OpCompressed {
		ch, err := wire.ParseCompressedHeader(msg)
		if err != nil {
			return err
		}
		c.mu.Lock()
		agreed := ch.Compressor == wire.CompressorNoop || slices.Contains(c.compressors, ch.Compressor.String())
		c.mu.Unlock()
		if !agreed {
			return fmt.Errorf("fakemongo: compressor %s was not negotiated", ch.Compressor)
		}
		c.dec, err = wire.Decompress(c.dec[:0], msg, maxSize)
		if err != nil {
			return err
		}
		msg = c.dec
		if cap(c.dec) > maxKeptBuffer {
			c.dec = nil
		}
		if h, err = wire.ParseHeader(msg); err != nil {
			return err
		}
		compressor, compressed = ch.Compressor, true
		req.Compressor = ch.Compressor.String()
	}
	req.OpCode = h.OpCode
	switch h.OpCode {
	case wire.OpMsg:
		if err := wire.ParseMsgInto(msg, &c.msg); err != nil {
			return err
		}
		req.Flags = c.msg.Flags &^ wire.FlagChecksumPresent
		req.Body = c.msg.Body
		req.Sequences = c.msg.Sequences
		if v, err := req.Body.LookupErr("$db"); err == nil {
			req.DB = c.dbName(v)
		}
	case wire.OpQuery:
		q, err := wire.ParseQuery(msg)
		if err != nil {
			return err
		}
		req.Body = unwrapQuery(q.Query)
		req.DB, _ = strings.CutSuffix(q.FullCollectionName, ".$cmd")
	default:
		return fmt.Errorf("fakemongo: unsupported opcode %s", h.OpCode)
	}

	name := firstKey(req.Body)
	if name == nil {
		return c.finish(req, Error(codeBadValue, "", "empty command document"), compressor, compressed)
	}
	cnt := c.counters[string(name)]
	if cnt == nil {
		cnt = c.s.counter(name)
		c.counters[cnt.name] = cnt
	}
	cnt.n.Add(1)
	req.Command = cnt.name

	if isHello(req.Command) && c.appName == "" {
		if app, ok := helloAppName(req.Body); ok {
			c.mu.Lock()
			c.appName = app
			c.mu.Unlock()
			req.AppName = app
		}
	}
	if req.OpCode == wire.OpQuery && !isHello(req.Command) {
		return c.finish(req, Error(codeUnsupportedOpQueryCommand, "",
			fmt.Sprintf("Unsupported OP_QUERY command: %s", req.Command)), compressor, compressed)
	}

	m := c.s.member
	var class cmdClass
	if m != nil {
		class = classify(req)
		c.beginOp(class == classWrite)
		defer c.beginOp(false)
	}

	if act, fire := c.s.checkFailPoint(req.Command, c.appName); fire {
		if act.block > 0 {
			if err := c.wait(act.block, false, 0); err != nil {
				return c.interruptedOr(req, err, compressor, compressed)
			}
		}
		if act.close {
			return errCloseConn
		}
		if act.errorCode != 0 {
			return c.finish(req, Error(act.errorCode, "", "Failing command via 'failCommand' failpoint", act.labels...), compressor, compressed)
		}
	}

	if c.s.capacity != nil && underCapacity(req.Command) {
		if err := c.s.capacity.serve(c.s.killed); err != nil {
			return err
		}
	}

	if m != nil {
		r, act := m.admit(req, class)
		switch act {
		case admitRefuse:
			return c.finish(req, c.s.withTopologyVersion(r), compressor, compressed)
		case admitHangUp:
			return errCloseConn
		}
		if class == classWrite && c.wasInterrupted() {
			return c.interruptedOr(req, errInterrupted, compressor, compressed)
		}
	}

	if st := c.s.store; st != nil && req.Command != "commitTransaction" && req.Command != "abortTransaction" {
		if ti := parseTxnInfo(req.Body); ti.inTxn {
			if r, ok := st.trackTxn(req, ti); !ok {
				return c.finish(req, r, compressor, compressed)
			}
		}
	}

	if r, refuse := c.s.needsAuth(req, c); refuse {
		return c.finish(req, r, compressor, compressed)
	}
	if h := (*c.s.handlers.Load())[req.Command]; h != nil {
		return c.finish(req, h(req), compressor, compressed)
	}
	if isHello(req.Command) && c.s.opts.TopologyVersion && req.OpCode == wire.OpMsg {
		if tv, ok := req.Lookup("topologyVersion").DocumentOK(); ok {
			return c.awaitHello(req, tv, compressor, compressed)
		}
	}
	return c.finish(req, c.s.builtin(req, c), compressor, compressed)
}

// finish carries out a Reply.
func (c *conn) finish(req *Request, r Reply, compressor wire.CompressorID, compressed bool) error {
	if r.Delay > 0 {
		if err := c.wait(r.Delay, false, 0); err != nil {
			return c.interruptedOr(req, err, compressor, compressed)
		}
	}
	if r.Kill {
		c.s.Kill()
		return errKilled
	}
	if r.CloseConn {
		return errCloseConn
	}
	if r.NoReply || len(r.Docs) == 0 {
		return nil
	}
	if req.MoreToCome() {
		if !c.s.opts.AnswerMoreToCome {
			return nil
		}
		if d := c.s.opts.AnswerMoreToComeAfter; d > 0 {
			if err := c.wait(d, false, 0); err != nil {
				return err
			}
		}
	}
	docs := r.Docs
	if !req.ExhaustAllowed() || req.OpCode != wire.OpMsg {
		docs = docs[:1]
	}
	respTo := req.RequestID
	for i, d := range docs {
		if i > 0 && r.Interval > 0 {
			if err := c.wait(r.Interval, false, 0); err != nil {
				return err
			}
		}
		var flags wire.MsgFlags
		if i < len(docs)-1 {
			flags = wire.FlagMoreToCome
		}
		id, err := c.send(req, d, respTo, flags, compressor, compressed)
		if err != nil {
			return err
		}
		respTo = id
	}
	return nil
}

// interruptedOr answers a write a stepdown interrupted with
// InterruptedDueToReplStateChange, keeping the connection open as mongod
// 4.2+ does; an unacknowledged write has no reply to carry the error, so
// its connection is closed. Any other error is returned as it is.
func (c *conn) interruptedOr(req *Request, err error, compressor wire.CompressorID, compressed bool) error {
	if !errors.Is(err, errInterrupted) || c.s.member == nil {
		return err
	}
	if req.MoreToCome() {
		return errCloseConn
	}
	c.beginOp(false)
	return c.finish(req, c.s.withTopologyVersion(interruptedReply(req)), compressor, compressed)
}

// send writes one reply and returns its requestID.
func (c *conn) send(req *Request, body bsoncore.Document, respTo int32, flags wire.MsgFlags, compressor wire.CompressorID, compressed bool) (int32, error) {
	c.nextRequestID++
	id := c.nextRequestID
	if req.OpCode == wire.OpQuery {
		c.out = wire.AppendReply(c.out[:0], id, respTo, body)
	} else {
		c.out = wire.AppendMsg(c.out[:0], id, respTo, flags, body)
	}
	out := c.out
	if compressed && !wire.MustNotCompress(req.Command) {
		var err error
		c.comp, err = wire.Compress(c.comp[:0], c.out, compressor)
		if err != nil {
			return 0, err
		}
		out = c.comp
	}
	_, err := c.nc.Write(out)
	if cap(c.out) > maxKeptBuffer {
		c.out = nil
	}
	if cap(c.comp) > maxKeptBuffer {
		c.comp = nil
	}
	return id, err
}

// awaitHello answers an awaitable hello: at once if the client's
// topologyVersion is stale, else after maxAwaitTimeMS or when the topology
// changes; with exhaustAllowed it keeps streaming replies until the client
// goes away.
func (c *conn) awaitHello(req *Request, tv bsoncore.Document, compressor wire.CompressorID, compressed bool) error {
	ms, ok := req.Lookup("maxAwaitTimeMS").AsInt64OK()
	if !ok {
		return c.finish(req, c.s.builtin(req, c), compressor, compressed)
	}
	if ms < 0 || time.Duration(ms)*time.Millisecond > maxAwaitTime {
		return c.finish(req, Error(codeBadValue, "", "maxAwaitTimeMS out of range"), compressor, compressed)
	}
	pid, _ := tv.Lookup("processId").ObjectIDOK()
	counter, _ := tv.Lookup("counter").AsInt64OK()
	stream := req.ExhaustAllowed() && !req.MoreToCome()
	respTo := req.RequestID
	var body []byte
	for {
		if pid == c.s.processID && counter == c.s.topologyVersion() {
			if err := c.wait(time.Duration(ms)*time.Millisecond, true, counter); err != nil {
				return err
			}
		}
		counter = c.s.topologyVersion()
		pid = c.s.processID
		body = c.s.appendHello(body[:0], req, nil, counter)
		if req.MoreToCome() {
			return nil
		}
		var flags wire.MsgFlags
		if stream {
			flags = wire.FlagMoreToCome
		}
		id, err := c.send(req, body, respTo, flags, compressor, compressed)
		if err != nil || !stream {
			return err
		}
		respTo = id
	}
}

// wait pauses the connection for d. It returns early, with an error, when
// the client closes its end or the server closes the connection, so no
// block outlives its client. With wakeable, BumpTopologyVersion (a counter
// different from since) ends the wait early without error.
//
// The wait is a read with a deadline: that is the only way to notice a
// peer's close without a second goroutine. Bytes that arrive meanwhile stay
// in the bufio.Reader for the next request, and the rest of d is slept.
func (c *conn) wait(d time.Duration, wakeable bool, since int64) error {
	if d <= 0 {
		return nil
	}
	deadline := time.Now().Add(d)
	c.mu.Lock()
	if wakeable {
		if c.s.topologyVersion() != since {
			c.mu.Unlock()
			return nil
		}
		c.awaiting = true
	} else if c.interrupted {
		c.mu.Unlock()
		return errInterrupted
	}
	err := c.nc.SetReadDeadline(deadline)
	c.mu.Unlock()
	if err != nil {
		return err
	}
	_, err = c.br.Peek(1)
	c.mu.Lock()
	c.awaiting = false
	interrupted := !wakeable && c.interrupted
	derr := c.nc.SetReadDeadline(time.Time{})
	c.mu.Unlock()
	if interrupted {
		return errInterrupted
	}
	intr := c.intr // only writes are interrupted; hello waits ignore it
	if wakeable {
		intr = nil
	}
	var ne net.Error
	switch {
	case err == nil:
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		select {
		case <-t.C:
		case <-intr:
			return errInterrupted
		case <-c.closed:
			return net.ErrClosed
		case <-c.s.killed:
			return errKilled
		}
	case errors.As(err, &ne) && ne.Timeout():
	default:
		return err
	}
	return derr
}

// dbName returns $db as a string, reusing the previous one when equal so
// the steady state does not allocate.
func (c *conn) dbName(v bsoncore.Value) string {
	if v.Type != bsoncore.TypeString || len(v.Data) < 5 {
		return ""
	}
	b := v.Data[4 : len(v.Data)-1]
	if string(b) != c.lastDB {
		c.lastDB = string(b)
	}
	return c.lastDB
}

// setCompressors records the compressors agreed in hello.
func (c *conn) setCompressors(agreed []string) {
	c.mu.Lock()
	c.compressors = agreed
	c.mu.Unlock()
}

// unwrapQuery returns the command of a legacy OP_QUERY, which drivers may
// wrap as {$query: {...}, $readPreference: ...}.
func unwrapQuery(q bsoncore.Document) bsoncore.Document {
	if k := firstKey(q); k != nil && (string(k) == "$query" || string(k) == "query") {
		if inner, ok := q.Lookup(string(k)).DocumentOK(); ok {
			return inner
		}
	}
	return q
}

// firstKey returns the first key of doc (aliasing it), or nil.
func firstKey(doc []byte) []byte {
	if len(doc) < 6 || doc[4] == 0 {
		return nil
	}
	k := bytes.IndexByte(doc[5:], 0)
	if k < 0 {
		return nil
	}
	return doc[5 : 5+k]
}

// builtin runs the built-in command; c is the connection or nil.
func (s *Server) builtin(req *Request, c *conn) Reply {
	if c == nil {
		c = req.conn
	}
	switch req.Command {
	case "hello", "isMaster", "ismaster":
		var agreed []string
		if _, err := req.Body.LookupErr("compression"); err == nil {
			agreed = s.negotiateCompression(req.Body)
			if c != nil {
				c.setCompressors(agreed)
			}
		}
		return Reply{Docs: []bsoncore.Document{s.appendHello(nil, req, agreed, s.topologyVersion())}}
	case "ping":
		return okReply()
	case "buildInfo", "buildinfo":
		v := versionFor(s.opts.MaxWireVersion)
		return OK(
			bson.E{Key: "version", Value: fmt.Sprintf("%d.%d.0", v[0], v[1])},
			bson.E{Key: "versionArray", Value: bson.A{v[0], v[1], int32(0), int32(0)}},
			bson.E{Key: "gitVersion", Value: "fakemongo"},
			bson.E{Key: "maxBsonObjectSize", Value: s.opts.MaxBSONObjectSize},
		)
	case "endSessions":
		if s.store != nil {
			s.store.endSessions(req.Body)
		}
		return okReply()
	case "saslStart":
		if c != nil && s.users != nil {
			return s.saslStart(c, req.Body, req.DB)
		}
	case "saslContinue":
		if c != nil && s.users != nil {
			return s.saslContinue(c, req)
		}
	case "authenticate":
		if c != nil && s.users != nil {
			return s.authenticateX509(c, req.Body, req.DB)
		}
	case "connectionStatus":
		return s.connectionStatus(c)
	case "usersInfo":
		if s.users != nil {
			return s.usersInfo(req)
		}
	case "configureFailPoint":
		fp, err := ParseFailPoint(req.Body)
		if err != nil {
			return Error(codeBadValue, "", err.Error())
		}
		s.SetFailPoint(fp)
		return okReply()
	}
	if st := s.store; st != nil {
		switch req.Command {
		case "insert":
			return st.insert(req)
		case "update":
			return st.update(req)
		case "delete":
			return st.deleteDocs(req)
		case "find":
			if s.member != nil {
				return s.member.stamp(st.findAt(req, s.member.horizon()))
			}
			return st.find(req)
		case "getMore":
			return st.getMore(req)
		case "killCursors":
			return st.killCursors(req)
		case "drop":
			return st.drop(req)
		case "commitTransaction":
			return st.endTxn(req, true, s.opts.Kind == Mongos)
		case "abortTransaction":
			return st.endTxn(req, false, s.opts.Kind == Mongos)
		}
	}
	return Error(codeCommandNotFound, "", fmt.Sprintf("no such command: '%s'", req.Command))
}

// versionFor maps a maxWireVersion to the server version that introduced it.
func versionFor(wv int32) [2]int32 {
	switch {
	case wv >= 25:
		return [2]int32{8, 0}
	case wv >= 21:
		return [2]int32{7, 0}
	case wv >= 17:
		return [2]int32{6, 0}
	case wv >= 13:
		return [2]int32{5, 0}
	case wv >= 9:
		return [2]int32{4, 4}
	}
	return [2]int32{4, 2}
}
