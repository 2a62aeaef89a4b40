package proxy

// Awaitable hello and quiesce, as a mongos 4.4+ answers them (the SDAM
// monitoring specification's "awaitable hello" and "streaming protocol").
//
// Every hello reply carries the Server's topologyVersion {processId,
// counter}. A hello with topologyVersion and maxAwaitTimeMS whose
// topologyVersion is ours waits until our counter moves or the wait ends;
// with exhaustAllowed, the reply sets moreToCome and the client's
// goroutine streams a reply at each change or wait, without further
// requests, until a reply is an error (ok: 0) or the client is gone.
//
// The one change of a mongobouncer's topology is the start of its drain
// (Shutdown): the counter moves, every waiting hello returns at once, and
// every hello from then on is answered ShutdownInProgress (91) with the
// topologyVersion, as a mongos in quiesce mode answers: its drivers mark
// it Unknown and stop selecting it before their next request.
//
// The wait happens on the client's goroutine, never on the event loop: a
// hello is an admitAnswer (admit.go), which the loop hands to the
// goroutine as it hands everything it does not serve itself.
//
// Bounds. A waiting hello holds no upstream connection, only its client's
// goroutine and a timer, and its client counts against max_client_conn
// as any other. Each wait is at most maxHelloAwait, whatever
// maxAwaitTimeMS asks; streamed replies come no faster than one per
// minStreamInterval (the specification's minHeartbeatFrequencyMS), so a
// maxAwaitTimeMS of 0 costs no more than a monitor's heartbeat; each
// streamed reply must be written within streamWriteBound, so a peer that
// stops reading ends its stream. Monitoring connections never log in:
// client_login_timeout bounds the silence of a client waiting for its next
// message (logintimeout.go), and a streaming monitor waits for none, it
// is sent replies, each of which it takes; its silence ends with the
// stream, and the rule applies again to the next wait for a message.
// Close ends every wait (stopping).

import (
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

const (
	// maxHelloAwait bounds one wait of an awaitable hello, whatever
	// maxAwaitTimeMS asks: a driver's monitor takes an earlier reply as a
	// heartbeat, and a peer cannot park its goroutine for longer.
	maxHelloAwait = time.Minute
	// minStreamInterval is the least time between two streamed replies
	// when the topology has not changed: the SDAM specification's
	// minHeartbeatFrequencyMS, so that maxAwaitTimeMS: 0 with
	// exhaustAllowed is no busy loop.
	minStreamInterval = 500 * time.Millisecond
	// streamWriteBound bounds the write of a streamed reply.
	streamWriteBound = 10 * time.Second
)

// quiesceMessage is the errmsg of a hello during a drain, a mongos's
// wording in quiesce mode, which drivers and users recognise.
const quiesceMessage = "The server is in quiesce mode and will shut down"

// topoState is the Server's topologyVersion and the hellos waiting on it.
type topoState struct {
	// processID is made once per Server: a driver that sees another one
	// knows it talks to another mongobouncer process.
	processID bson.ObjectID
	// counter is read without mu; changed only under mu.
	counter atomic.Int64
	mu      sync.Mutex // guards changed
	// changed is closed, and replaced, when counter moves.
	changed chan struct{}
	// waiting counts the awaitable hellos being served now, waiting or
	// streaming: the drain is not over until each has written its last
	// reply (Server.drained), so that Close does not cut the quiesce
	// reply it wakes them to write.
	waiting atomic.Int64
	// drainDeadline is the drain's end in Unix nanoseconds, 0 if unknown
	// (remainingQuiesceTimeMillis).
	drainDeadline atomic.Int64
}

func (t *topoState) init() {
	t.processID = bson.NewObjectID()
	t.changed = make(chan struct{})
}

// watch returns the counter and a channel closed at its next change.
func (t *topoState) watch() (int64, <-chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.counter.Load(), t.changed
}

// bump moves the counter and wakes every waiting hello.
func (t *topoState) bump() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.counter.Add(1)
	close(t.changed)
	t.changed = make(chan struct{})
}

// HellosWaiting returns how many awaitable hellos wait now.
func (s *Server) HellosWaiting() int { return int(s.topo.waiting.Load()) }

// TopologyVersion returns the topologyVersion hello replies carry now.
func (s *Server) TopologyVersion() (processID bson.ObjectID, counter int64) {
	return s.topo.processID, s.topo.counter.Load()
}

// appendTopologyVersion appends the topologyVersion element with counter.
func (s *Server) appendTopologyVersion(doc []byte, counter int64) []byte {
	idx, d := bsoncore.AppendDocumentElementStart(doc, "topologyVersion")
	d = bsoncore.AppendObjectIDElement(d, "processId", s.topo.processID)
	d = bsoncore.AppendInt64Element(d, "counter", counter)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}

// withTopologyVersion returns doc, a whole document, with our
// topologyVersion appended: a state change error reply carries it, as
// hello replies do.
func (s *Server) withTopologyVersion(doc bsoncore.Document) bsoncore.Document {
	out := make([]byte, 0, len(doc)+64)
	out = append(out, doc[:len(doc)-1]...)
	out = s.appendTopologyVersion(out, s.topo.counter.Load())
	out = append(out, 0)
	bsoncore.UpdateLength(out, 0, int32(len(out)))
	return out
}

// shutdownReply is the 91 ShutdownInProgress a drain answers req with:
// labelled as a real server labels it (a retryable write's
// RetryableWriteError, so that drivers retry it elsewhere instead of
// surfacing it), with the topologyVersion of a state change error.
func (s *Server) shutdownReply(req *command.Request, inTxn bool) bsoncore.Document {
	var labels []string
	if req != nil {
		labels = command.Labels(req, inTxn)
	}
	return s.withTopologyVersion(command.ErrorReply(command.CodeShutdownInProgress, "ShutdownInProgress", "mongobouncer: shutting down", labels...))
}

// quiesceReply is a hello's reply during a drain, as a mongos in quiesce
// mode answers: 91 with the topologyVersion and the time left.
func (s *Server) quiesceReply() bsoncore.Document {
	doc := command.ErrorReply(command.CodeShutdownInProgress, "ShutdownInProgress", "mongobouncer: "+quiesceMessage)
	doc = s.withTopologyVersion(doc)
	if dl := s.topo.drainDeadline.Load(); dl != 0 {
		left := max(time.Until(time.Unix(0, dl)).Milliseconds(), 0)
		out := make([]byte, 0, len(doc)+40)
		out = append(out, doc[:len(doc)-1]...)
		out = bsoncore.AppendInt64Element(out, "remainingQuiesceTimeMillis", left)
		out = append(out, 0)
		bsoncore.UpdateLength(out, 0, int32(len(out)))
		doc = out
	}
	return doc
}

// stampTopologyVersion rewrites in place the topologyVersion of a relayed
// upstream reply body (a member's state change error) to ours, now, and
// reports whether it did. A driver compares an error's topologyVersion
// with the one it holds for the server that sent it, mongobouncer, and
// ignores an error that is not newer: a member's stepdown is then what it
// is to the client, a retryable error, and not a change of mongobouncer's
// own state (which would make a streaming driver mark mongobouncer Unknown
// until its next streamed heartbeat). A reply without a topologyVersion
// (a server before 4.4), or with one of other types, is left as it is.
func (s *Server) stampTopologyVersion(body []byte) bool {
	if len(body) < 5 {
		return false
	}
	rest := body[4 : len(body)-1]
	for len(rest) > 0 {
		el, next, ok := bsoncore.ReadElement(rest)
		if !ok {
			return false
		}
		rest = next
		if el.Key() != "topologyVersion" {
			continue
		}
		d, ok := el.Value().DocumentOK()
		if !ok {
			return false
		}
		pid, err1 := d.LookupErr("processId")
		cnt, err2 := d.LookupErr("counter")
		if err1 != nil || err2 != nil || pid.Type != bsoncore.TypeObjectID || len(pid.Data) != 12 ||
			cnt.Type != bsoncore.TypeInt64 || len(cnt.Data) != 8 {
			return false
		}
		// Data alias body.
		copy(pid.Data, s.topo.processID[:])
		binary.LittleEndian.PutUint64(cnt.Data, uint64(s.topo.counter.Load()))
		return true
	}
	return false
}

// helloAwait is what a hello asks of the awaitable protocol.
type helloAwait struct {
	hasTV, hasMax bool
	processID     bson.ObjectID
	counter       int64
	maxAwait      time.Duration
	// err is the error reply for malformed fields, nil when they are fine.
	err bsoncore.Document
}

// awaitable reports whether the hello may wait.
func (a *helloAwait) awaitable() bool { return a.hasTV && a.hasMax && a.err == nil }

// parseAwait reads topologyVersion and maxAwaitTimeMS from a hello, with
// a mongos's checks and codes.
func parseAwait(body bsoncore.Document) helloAwait {
	var a helloAwait
	if v, err := body.LookupErr("topologyVersion"); err == nil {
		a.hasTV = true
		d, ok := v.DocumentOK()
		if !ok {
			a.err = typeMismatch("topologyVersion", v.Type, "object")
			return a
		}
		pid, err := d.LookupErr("processId")
		if err != nil {
			a.err = missingField("TopologyVersion.processId")
			return a
		}
		if a.processID, ok = pid.ObjectIDOK(); !ok {
			a.err = typeMismatch("TopologyVersion.processId", pid.Type, "objectId")
			return a
		}
		cnt, err := d.LookupErr("counter")
		if err != nil {
			a.err = missingField("TopologyVersion.counter")
			return a
		}
		if a.counter, ok = cnt.Int64OK(); !ok {
			a.err = typeMismatch("TopologyVersion.counter", cnt.Type, "long")
			return a
		}
	}
	if v, err := body.LookupErr("maxAwaitTimeMS"); err == nil {
		a.hasMax = true
		ms, ok := wholeNumber(v)
		if !ok {
			a.err = typeMismatch("maxAwaitTimeMS", v.Type, "long")
			return a
		}
		if ms < 0 {
			a.err = command.ErrorReply(51759, "Location51759", "mongobouncer: maxAwaitTimeMS must be a non-negative integer")
			return a
		}
		a.maxAwait = time.Duration(min(ms, int64(maxHelloAwait/time.Millisecond))) * time.Millisecond
	}
	switch {
	case a.hasTV && !a.hasMax:
		a.err = command.ErrorReply(51760, "Location51760", "mongobouncer: A request with a 'topologyVersion' must include 'maxAwaitTimeMS'")
	case a.hasMax && !a.hasTV:
		a.err = command.ErrorReply(51760, "Location51760", "mongobouncer: A request with 'maxAwaitTimeMS' must include a 'topologyVersion'")
	case a.hasTV && a.counter < 0:
		a.err = command.ErrorReply(51758, "Location51758", "mongobouncer: topologyVersion must have a non-negative counter")
	}
	return a
}

// wholeNumber reads an int32, an int64 or a whole double.
func wholeNumber(v bsoncore.Value) (int64, bool) {
	switch v.Type {
	case bsoncore.TypeInt32:
		n, ok := v.Int32OK()
		return int64(n), ok
	case bsoncore.TypeInt64:
		return v.Int64OK()
	case bsoncore.TypeDouble:
		f, ok := v.DoubleOK()
		if !ok || f != f || f < -9e18 || f > 9e18 || f != float64(int64(f)) {
			return 0, false
		}
		return int64(f), true
	}
	return 0, false
}

func typeMismatch(field string, got bsoncore.Type, want string) bsoncore.Document {
	return command.ErrorReply(14, "TypeMismatch",
		fmt.Sprintf("mongobouncer: BSON field '%s' is the wrong type '%s', expected type '%s'", field, bsonTypeName(got), want))
}

func missingField(field string) bsoncore.Document {
	return command.ErrorReply(40414, "Location40414", fmt.Sprintf("mongobouncer: BSON field '%s' is missing but a required field", field))
}

// checkAwait is the error reply to a's fields against our topologyVersion
// (a counter ahead of ours), nil when the hello may go on.
func (s *Server) checkAwait(a *helloAwait) bsoncore.Document {
	if a.err != nil {
		return a.err
	}
	if a.hasTV && a.processID == s.topo.processID {
		if ours := s.topo.counter.Load(); a.counter > ours {
			return command.ErrorReply(51761, "Location51761", fmt.Sprintf(
				"mongobouncer: Received a topology version with counter: %d which is greater than the mongos topology version counter: %d", a.counter, ours))
		}
	}
	return nil
}

// awaitChange waits while our topologyVersion is {processID, counter},
// for at most d: until the counter moves, d passes or the server stops.
// It returns errClientGone when Close (not a drain) stops the server.
func (c *client) awaitChange(processID bson.ObjectID, counter int64, d time.Duration) error {
	s := c.s
	if processID != s.topo.processID {
		return nil
	}
	cur, changed := s.topo.watch()
	if cur != counter || d <= 0 {
		return nil
	}
	gone, stop := c.watchPeer()
	defer stop()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-changed:
	case <-t.C:
	case <-gone:
		return errClientGone
	case <-s.stopping:
		if !s.draining.Load() {
			return errClientGone
		}
	}
	return nil
}

// watchPeer reads the client's socket while its hello waits, so that a
// client that closes its connection (a driver closes its monitor's at
// will) frees its goroutine and its max_client_conn slot at once rather
// than at the next reply's write. gone is closed when the connection ends;
// a byte that comes (a client sends nothing while its hello is answered,
// but nothing is lost if it does) is kept for the next read, and
// ends the watch only (in the read window, lc.Win). stop ends the watch and returns once the reader
// has, with no read deadline left on the connection.
func (c *client) watchPeer() (gone <-chan struct{}, stop func()) {
	win := &c.lc.Win
	if len(win.Free()) == 0 {
		return nil, func() {}
	}
	nc := c.nc
	// The deadline of the read that brought the hello (client_idle_timeout,
	// the login rule) does not bound the wait: the watch runs until stop.
	_ = nc.SetReadDeadline(time.Time{})
	ch := make(chan struct{})
	done := make(chan struct{})
	var got int
	go func() {
		defer close(done)
		// Owned by this goroutine until done is closed: the client's
		// goroutine waits in awaitChange and touches neither.
		n, err := nc.Read(win.Free()[:1])
		got = n
		if n == 0 && err != nil && !isTimeout(err) {
			close(ch)
		}
	}()
	return ch, func() {
		_ = nc.SetReadDeadline(time.Now())
		<-done
		win.Hi += got
		_ = nc.SetReadDeadline(time.Time{})
		c.deadline = false
	}
}

// SetHelloMaxAwait sets hello_max_await: the longest an awaitable hello
// waits without a change before it is answered, whatever maxAwaitTimeMS
// asks, within [minStreamInterval, maxHelloAwait]. A reply with nothing
// changed is a heartbeat to the driver, so answering sooner than asked is
// allowed and costs one small reply. It matters behind a balancer with the
// plain URI: a 91 from one draining instance marks the balancer's one
// address Unknown, and the driver does not cancel its streaming check on
// that (only on a network error), so the address stays Unknown until the
// healthy instance's next streamed reply. Waits already begun keep theirs.
func (s *Server) SetHelloMaxAwait(d time.Duration) {
	s.helloMaxAwait.Store(int64(min(max(d, minStreamInterval), maxHelloAwait)))
}

// maxAwait is how long a hello that asked for a may wait.
func (s *Server) maxAwait(a time.Duration) time.Duration {
	if m := time.Duration(s.helloMaxAwait.Load()); m > 0 {
		return min(a, m)
	}
	return a
}

// serveHello answers an OP_MSG hello: at once, or after the awaitable
// protocol's wait, and as a stream of replies when the request allows
// exhaust.
func (c *client) serveHello(responseTo int32, compressed bool, compID wire.CompressorID, req *command.Request) error {
	body := c.msg.Body
	a := parseAwait(body)
	if a.awaitable() && c.s.checkAwait(&a) == nil {
		c.s.topo.waiting.Add(1)
		defer c.s.topo.waiting.Add(-1)
		if err := c.awaitChange(a.processID, a.counter, c.s.maxAwait(a.maxAwait)); err != nil {
			return err
		}
	}
	hr := parseHello(body, req.Name())
	// Read before the reply is built: a change in between makes the next
	// wait end at once (a reply twice, never a change missed).
	counter := c.s.topo.counter.Load()
	doc := c.answerHello(body, req.Name())
	if req.More {
		return nil
	}
	if !req.Exhaust || !a.awaitable() || okOf(doc) != 1 {
		return c.boundedReply(responseTo, 0, compressed, compID, req.Name(), doc)
	}
	// The stream: each reply answers the previous one, and its
	// topologyVersion is what the next wait compares with (the
	// specification: as if the client had sent the same hello again with
	// that topologyVersion).
	interval := max(c.s.maxAwait(a.maxAwait), minStreamInterval)
	for {
		if err := c.boundedReply(responseTo, wire.FlagMoreToCome, compressed, compID, req.Name(), doc); err != nil {
			return err
		}
		responseTo = c.nextID
		putBuffer(c.out)
		c.out = nil
		// Only a change answers sooner than interval, which is at least
		// minStreamInterval.
		if err := c.awaitChange(c.s.topo.processID, counter, interval); err != nil {
			return err
		}
		counter = c.s.topo.counter.Load()
		doc = c.helloState(hr)
		if okOf(doc) != 1 {
			// The last reply: without moreToCome.
			return c.boundedReply(responseTo, 0, compressed, compID, req.Name(), doc)
		}
	}
}

// boundedReply is replyFlags within streamWriteBound: a peer that does
// not read its replies does not hold a waiting hello's goroutine, nor the
// drain.
func (c *client) boundedReply(responseTo int32, flags wire.MsgFlags, compressed bool, compID wire.CompressorID, name string, doc bsoncore.Document) error {
	_ = c.nc.SetWriteDeadline(time.Now().Add(streamWriteBound))
	err := c.replyFlags(responseTo, flags, compressed, compID, name, doc)
	_ = c.nc.SetWriteDeadline(time.Time{})
	return err
}

// helloState is a streamed hello reply: the state of now, without the
// first reply's side effects (a login's first step, the handshake's
// bookkeeping).
func (c *client) helloState(hr helloRequest) bsoncore.Document {
	if c.s.draining.Load() {
		return c.s.quiesceReply()
	}
	return c.s.plainHello(hr, c.s.waitLimits(), c.id, c.agreedCompressor(hr))
}

// agreedCompressor is the compressor a hello reply names: the first of
// hr's that we offer.
func (c *client) agreedCompressor(hr helloRequest) string {
	for _, want := range hr.compression {
		if c.s.offers(want) {
			return want
		}
	}
	return ""
}

// okOf is a reply's ok as a number.
func okOf(d bsoncore.Document) float64 {
	v, _ := d.Lookup("ok").AsFloat64OK()
	return v
}
