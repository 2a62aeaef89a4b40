package proxy

// The hello glue: a client's hello/isMaster read, and its replies written
// on the client's socket. The protocol (the reply, a mongos's refusals,
// the topologyVersion, the awaitable hello and the quiesce of a drain) is
// internal/hello's; this file holds what needs the client: its
// connection's agreements, its first hello's bookkeeping, the wait on its
// goroutine, and the stream of replies.
//
// The wait happens on the client's goroutine, never on the event loop: a
// hello is an admitAnswer (admit.go), which the loop hands to the
// goroutine as it hands everything it does not serve itself.
//
// Bounds. A waiting hello holds no upstream connection, only its client's
// goroutine and a timer, and its client counts against max_client_conn as
// any other. Each wait is at most hello.MaxAwait (and hello_max_await);
// streamed replies come no faster than one per hello.MinStreamInterval;
// each reply must be written within streamWriteBound, so a peer that stops
// reading ends its stream. Monitoring connections never log in:
// client_login_timeout bounds the silence of a client waiting for its next
// message (logintimeout.go), and a streaming monitor waits for none, it is
// sent replies; its silence ends with the stream, and the rule applies
// again to the next wait for a message. Close ends every wait (stopping);
// a drain's wakes them to write the quiesce reply, and Shutdown waits for
// those (HellosWaiting).

import (
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/evloop"
	"github.com/mongobouncer/mongobouncer/internal/hello"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// streamWriteBound bounds the write of a reply to an awaitable hello: a
// peer that does not read its replies does not hold a waiting hello's
// goroutine, nor the drain.
const streamWriteBound = 10 * time.Second

// HellosWaiting returns how many awaitable hellos are being served now,
// waiting or streaming.
func (s *Server) HellosWaiting() int { return s.topo.Serving() }

// TopologyVersion returns the topologyVersion hello replies carry now.
func (s *Server) TopologyVersion() (processID bson.ObjectID, counter int64) {
	tv := s.topo.Version()
	return tv.ProcessID, tv.Counter
}

// SetHelloMaxAwait sets hello_max_await (hello.State.SetMaxAwait). It
// matters behind a balancer with the plain URI: a 91 from one draining
// instance marks the balancer's one address Unknown, and the driver does
// not cancel its streaming check on that (only on a network error), so
// the address stays Unknown until the healthy instance's next streamed
// reply, which comes within hello_max_await.
func (s *Server) SetHelloMaxAwait(d time.Duration) { s.topo.SetMaxAwait(d) }

// shutdownReply is the 91 ShutdownInProgress a drain answers req with:
// labelled as a real server labels it (a retryable write's
// RetryableWriteError, so that drivers retry it elsewhere instead of
// surfacing it), with the topologyVersion of a state change error.
func (s *Server) shutdownReply(req *command.Request, inTxn bool) bsoncore.Document {
	var labels []string
	if req != nil {
		labels = command.Labels(req, inTxn)
	}
	return s.topo.WithVersion(command.ErrorReply(command.CodeShutdownInProgress, "ShutdownInProgress", "mongobouncer: shutting down", labels...))
}

// quiesceReply is a hello's reply during a drain.
func (s *Server) quiesceReply() bsoncore.Document {
	return s.topo.Quiesce(command.ErrorReply(command.CodeShutdownInProgress, "ShutdownInProgress", "mongobouncer: "+hello.QuiesceMessage))
}

// helloRefusal is the error reply of a refused hello.
func helloRefusal(e *hello.Error) bsoncore.Document {
	return command.ErrorReply(e.Code, e.CodeName, "mongobouncer: "+e.Msg)
}

// plainHello is the reply to hr outside a drain.
func (s *Server) plainHello(hr *hello.Request, lim hello.Limits, connID int64, compressor string) bsoncore.Document {
	return hello.Reply(hr, lim, connID, compressor, s.serviceID, s.topo.Version())
}

// helloNow is a streamed hello reply: the state of now, without the first
// reply's side effects (a login's first step, the connection's
// agreements).
func (s *Server) helloNow(hr *hello.Request, connID int64) bsoncore.Document {
	if s.draining.Load() {
		return s.quiesceReply()
	}
	return s.plainHello(hr, s.waitLimits(), connID, hello.Agree(hr.Compression, s.offers))
}

// offers reports whether mongobouncer accepts compressor name from clients.
func (s *Server) offers(name string) bool {
	for _, o := range s.opts.Compressors {
		if o == name {
			_, ok := wire.CompressorByName(name)
			return ok
		}
	}
	return false
}

// answerHello answers a client's handshake or heartbeat hr (body is its
// command), OP_MSG or OP_QUERY, and records on the client what its hello
// agreed: its appName (the first), the message size, the compressor.
func (c *client) answerHello(body bsoncore.Document, hr *hello.Request) bsoncore.Document {
	if e := c.s.topo.Check(hr); e != nil {
		return helloRefusal(e)
	}
	lim := c.s.waitLimits()
	if !c.hello {
		c.hello = true
		c.sess.SetHelloInfo(hr.AppName, hr.LoadBalanced)
		c.log = c.log.With("appName", hr.AppName)
	}
	if int(lim.MaxMsg) < c.maxMsg {
		c.maxMsg = int(lim.MaxMsg)
	}
	compressor := c.conn.agree(hr.Compression, c.s.offers)
	if c.s.draining.Load() {
		// Quiesce, as a mongos shutting down: drivers mark us Unknown and
		// select another mongobouncer.
		return c.s.quiesceReply()
	}
	return c.authStep().hello(body, c.s.plainHello(hr, lim, c.id, compressor))
}

// agree is the compressor a hello of the connection agrees on (the first
// of the client's that offered accepts, "" for none); the client may
// compress with it from then on (checkCompressed).
func (cn *conn) agree(client []string, offered func(string) bool) string {
	name := hello.Agree(client, offered)
	if id, ok := wire.CompressorByName(name); ok && name != "" {
		cn.comp |= 1 << id
	}
	return name
}

// serveHello answers an OP_MSG hello: at once, or after the awaitable
// protocol's wait, and as a stream of replies when the request allows
// exhaust.
func (c *client) serveHello(responseTo int32, compressed bool, compID wire.CompressorID, req *command.Request) error {
	name := req.Name()
	hr := hello.Parse(c.msg.Body, name)
	st := helloStream{s: c.s, cn: &c.conn, win: &c.lc.Win, hr: &hr, connID: c.id,
		send: func(responseTo int32, flags wire.MsgFlags, doc bsoncore.Document) error {
			return c.replyFlags(responseTo, flags, compressed, compID, name, doc)
		}}
	awaitable := hr.Awaitable() && c.s.topo.Check(&hr) == nil
	if awaitable {
		c.s.topo.Enter()
		defer c.s.topo.Leave()
		if err := st.await(hr.Version, c.s.topo.AwaitFor(hr.Wait)); err != nil {
			return err
		}
	}
	// Read before the reply is built: a change in between makes the next
	// wait end at once (a reply twice, never a change missed).
	tv := c.s.topo.Version()
	doc := c.answerHello(c.msg.Body, &hr)
	if req.More {
		return nil
	}
	if !req.Exhaust || !awaitable || okOf(doc) != 1 {
		return st.reply(responseTo, 0, doc)
	}
	return st.stream(responseTo, doc, tv)
}

// helloStream serves the waits and replies of one OP_MSG hello: it holds
// what they use of the client, its connection (socket, reply buffer and
// ids), its read window, and the reply writer of dispatch.go.
type helloStream struct {
	s      *Server
	cn     *conn
	win    *evloop.Window
	hr     *hello.Request
	connID int64
	// send writes one reply (replyFlags, with the request's compression
	// and command name); the reply's requestID is cn.nextID after.
	send func(responseTo int32, flags wire.MsgFlags, doc bsoncore.Document) error
}

// reply writes doc within streamWriteBound.
func (st *helloStream) reply(responseTo int32, flags wire.MsgFlags, doc bsoncore.Document) error {
	_ = st.cn.nc.SetWriteDeadline(time.Now().Add(streamWriteBound))
	err := st.send(responseTo, flags, doc)
	_ = st.cn.nc.SetWriteDeadline(time.Time{})
	return err
}

// stream writes doc, the first reply, with moreToCome, then one reply at
// each change or interval, until a reply is an error (the last one,
// without moreToCome) or the client is gone. Each reply answers the
// previous one, and its topologyVersion tv is what the next wait compares
// with (the specification: as if the client had sent the same hello again
// with that topologyVersion).
func (st *helloStream) stream(responseTo int32, doc bsoncore.Document, tv hello.TopologyVersion) error {
	// Only a change answers sooner than interval.
	interval := max(st.s.topo.AwaitFor(st.hr.Wait), hello.MinStreamInterval)
	for {
		if err := st.reply(responseTo, wire.FlagMoreToCome, doc); err != nil {
			return err
		}
		responseTo = st.cn.nextID
		putBuffer(st.cn.out)
		st.cn.out = nil
		if err := st.await(tv, interval); err != nil {
			return err
		}
		tv = st.s.topo.Version()
		doc = st.s.helloNow(st.hr, st.connID)
		if okOf(doc) != 1 {
			return st.reply(responseTo, 0, doc)
		}
	}
}

// await waits while our topologyVersion is tv, for at most d: until the
// counter moves, d passes, the client goes or the server stops. It
// returns errClientGone when the client goes, or when Close (not a drain,
// whose change is answered with the quiesce) stops the server.
func (st *helloStream) await(tv hello.TopologyVersion, d time.Duration) error {
	if d <= 0 || !st.s.topo.Current(tv) {
		return nil
	}
	gone, stop := st.cn.watchPeer(st.win)
	defer stop()
	switch st.s.topo.Wait(tv, d, gone, st.s.stopping) {
	case hello.Gone:
		return errClientGone
	case hello.Stopped:
		if !st.s.draining.Load() {
			return errClientGone
		}
	}
	return nil
}

// watchPeer reads the connection while its hello waits, so that a client
// that closes its connection (a driver closes its monitor's at will) frees
// its goroutine and its max_client_conn slot at once rather than at the
// next reply's write. gone is closed when the connection ends; a byte that
// comes (a client sends nothing while its hello is answered, but nothing
// is lost if it does) is kept in the read window win for the next read,
// and ends the watch only. stop ends the watch and returns once the reader
// has, with no read deadline left on the connection.
func (cn *conn) watchPeer(win *evloop.Window) (gone <-chan struct{}, stop func()) {
	if len(win.Free()) == 0 {
		return nil, func() {}
	}
	nc := cn.nc
	// The deadline of the read that brought the hello (client_idle_timeout,
	// the login rule) does not bound the wait: the watch runs until stop.
	_ = nc.SetReadDeadline(time.Time{})
	ch := make(chan struct{})
	done := make(chan struct{})
	var got int
	go func() {
		defer close(done)
		// Owned by this goroutine until done is closed: the client's
		// goroutine waits in await and touches neither.
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
		cn.deadline = false
	}
}

// okOf is a reply's ok as a number.
func okOf(d bsoncore.Document) float64 {
	v, _ := d.Lookup("ok").AsFloat64OK()
	return v
}
