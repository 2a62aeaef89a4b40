package e2e

// client_login_timeout end to end: sockets that say nothing, clients that
// do not log in, unfinished SASL conversations, partial messages and TLS
// handshakes are closed; drivers' monitoring connections, which never log
// in but speak every heartbeat, are not.

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/logbuf"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// loginTimeoutTOML is the [mongobouncer] line of these tests: 1s.
const loginTimeoutTOML = "client_login_timeout = \"1s\"\n"

// closedAfter reads (and drops) what the server sends on nc until it closes
// the connection, and returns how long after start that was; it fails the
// test if nc is still open at start+limit.
func closedAfter(t *testing.T, nc net.Conn, start time.Time, limit time.Duration) time.Duration {
	t.Helper()
	_ = nc.SetReadDeadline(start.Add(limit))
	var buf [4096]byte
	for {
		_, err := nc.Read(buf[:])
		if err == nil {
			continue
		}
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("connection still open %v after start", limit)
		}
		return time.Since(start)
	}
}

// checkClosedOnTime checks that nc is closed by the login timeout (1s):
// not before (900ms, for the clock's grain) and not much after.
func checkClosedOnTime(t *testing.T, what string, nc net.Conn, start time.Time) {
	t.Helper()
	if d := closedAfter(t, nc, start, 4*time.Second); d < 900*time.Millisecond {
		t.Fatalf("%s: closed after %v, before client_login_timeout (1s)", what, d)
	}
}

// A driver's monitoring connection never logs in and sends a hello every
// heartbeat: it is never closed, so the driver sees no failed heartbeat,
// while a socket that sends nothing, and one that said hello and then
// nothing without logging in, are closed after client_login_timeout.
func TestLoginTimeoutSparesMonitorsClosesSilentClients(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		var logs logbuf.Buffer
		a, addr, _ := authSetupWith(t, up.URI(), &logs, loginTimeoutTOML)
		waitUsable(t, a, 1)

		var failed, succeeded atomic.Int64
		var lastFailure atomic.Value
		mon := &event.ServerMonitor{
			ServerHeartbeatFailed: func(e *event.ServerHeartbeatFailedEvent) {
				failed.Add(1)
				lastFailure.Store(e.Failure.Error())
			},
			ServerHeartbeatSucceeded: func(*event.ServerHeartbeatSucceededEvent) { succeeded.Add(1) },
		}
		withMonitor := func(o *options.ClientOptions) {
			o.SetHeartbeatInterval(500 * time.Millisecond).SetServerMonitor(mon)
		}
		// One driver logged in, one that never logs in (auth on, no
		// credentials): neither's monitor logs in.
		loggedIn := driverWith(t, addr, "", func(o *options.ClientOptions) {
			withMonitor(o)
			o.SetAuth(options.Credential{AuthSource: "admin", Username: "app", Password: authUsers["app"]})
		})
		anonymous := driverWith(t, addr, "", withMonitor)
		coll := loggedIn.Database("shop").Collection("lt")
		if _, err := coll.InsertOne(ctxT(t, 10*time.Second), bson.D{{Key: "n", Value: 1}}); err != nil {
			t.Fatal(err)
		}
		_ = anonymous // its monitor only: a pooled connection that never logs in is closed like any

		start := time.Now()
		silent := dialRaw(t, addr)
		hello := dialRaw(t, addr)
		if okOf(hello.hello()) != 1 {
			t.Fatal("hello refused")
		}
		helloAt := time.Now()
		checkClosedOnTime(t, "silent socket", silent.c, start)
		checkClosedOnTime(t, "hello, then silent without logging in", hello.c, helloAt)

		// The monitors kept going meanwhile, and still do.
		time.Sleep(time.Until(start.Add(3500 * time.Millisecond)))
		if _, err := coll.InsertOne(ctxT(t, 10*time.Second), bson.D{{Key: "n", Value: 2}}); err != nil {
			t.Fatal(err)
		}
		if n := failed.Load(); n != 0 {
			t.Fatalf("%d heartbeats failed (last: %v), want 0", n, lastFailure.Load())
		}
		if n := succeeded.Load(); n < 6 {
			t.Fatalf("%d heartbeats succeeded in 3.5s at 500ms, want at least 6", n)
		}
		if n := a.Server().LoginTimeouts(); n != 2 {
			t.Fatalf("%d clients closed by client_login_timeout, want 2", n)
		}
		l := logs.String()
		for _, want := range []string{"reason=first_message", "reason=not_logged_in"} {
			if !strings.Contains(l, "client closed: client_login_timeout") || !strings.Contains(l, want) {
				t.Fatalf("no info line for %s:\n%s", want, l)
			}
		}
	})
}

// A client that has not logged in stays as long as it speaks at least
// every client_login_timeout (a monitor's hellos); a SASL conversation it
// began must finish within the timeout of its saslStart, whatever it
// sends meanwhile.
func TestLoginTimeoutSASLConversationMustFinish(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		a, addr, _ := authSetupWith(t, up.URI(), nil, loginTimeoutTOML)
		waitUsable(t, a, 1)

		// Hellos every 300ms for 2.5s: never closed.
		talker := dialRaw(t, addr)
		for range 9 {
			if okOf(talker.hello()) != 1 {
				t.Fatal("hello refused")
			}
			time.Sleep(300 * time.Millisecond)
		}
		talker.c.Close()

		// A saslStart, then hellos every 300ms but no saslContinue.
		r := dialRaw(t, addr)
		r.hello()
		start := time.Now()
		rep := r.cmd(bson.D{{Key: "saslStart", Value: 1}, {Key: "mechanism", Value: "SCRAM-SHA-256"},
			{Key: "payload", Value: bson.Binary{Data: []byte("n,,n=app,r=fyko+d2lbbFgONRv9qkxdawL")}},
			{Key: "$db", Value: "admin"}})
		if okOf(rep) != 1 {
			t.Fatalf("saslStart: %v", rep)
		}
		var d time.Duration
		for {
			r.id++
			msg := wire.AppendMsg(nil, r.id, 0, 0, docOf(t, limHello()))
			_ = r.c.SetWriteDeadline(time.Now().Add(time.Second))
			if _, err := r.c.Write(msg); err != nil {
				d = time.Since(start)
				break
			}
			if _, err := r.tryRecv(time.Second); err != nil {
				d = time.Since(start)
				break
			}
			if time.Since(start) > 4*time.Second {
				t.Fatal("a SASL conversation left unfinished for 4s is still open")
			}
			time.Sleep(300 * time.Millisecond)
		}
		if d < 900*time.Millisecond {
			t.Fatalf("closed %v after saslStart, before client_login_timeout (1s)", d)
		}
	})
}

// partialMessage is the first part bytes of an OP_MSG ping whose header
// declares size bytes.
func partialMessage(t *testing.T, size, part int) []byte {
	msg := wire.AppendMsg(nil, 9, 0, 0, docOf(t, bson.D{{Key: "ping", Value: 1},
		{Key: "pad", Value: strings.Repeat("x", max(0, size-100))}, {Key: "$db", Value: "admin"}}))
	binary.LittleEndian.PutUint32(msg, uint32(size))
	if len(msg) < part {
		t.Fatalf("message of %d bytes, cannot send %d", len(msg), part)
	}
	return msg[:part]
}

// A message whose first bytes came must be whole within client_login_timeout
// (slowloris), on a client that has said hello (so that it is the event
// loop's where there is one) and on one that has not: a header declaring
// 1000 bytes (more than the loop's inline buffer: the goroutine reads it),
// one declaring 100 (it waits in the loop), and half a header. With
// authentication off, a client that said hello and then nothing stays: after
// its first message it is governed by client_idle_timeout only.
func TestLoginTimeoutPartialMessages(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		var logs logbuf.Buffer
		a, addr, _ := fileBouncerLogging(t, baseTOML(up.URI(), loginTimeoutTOML), &logs)
		waitUsable(t, a, 1)

		quiet := dialRaw(t, addr)
		if okOf(quiet.hello()) != 1 {
			t.Fatal("hello refused")
		}
		cases := []struct {
			name        string
			size, part  int
			helloBefore bool
		}{
			{"1000 bytes declared, 26 sent", 1000, 26, true},
			{"100 bytes declared, 26 sent", 100, 26, true},
			{"half a header", 100, 8, true},
			{"100 bytes declared, 26 sent, first message", 100, 26, false},
		}
		conns := make([]*rawClient, len(cases))
		starts := make([]time.Time, len(cases))
		for i, tc := range cases {
			r := dialRaw(t, addr)
			if tc.helloBefore && okOf(r.hello()) != 1 {
				t.Fatal("hello refused")
			}
			// The hello is answered before the client enters the loop:
			// give it the time to, so the partial message is the loop's.
			time.Sleep(20 * time.Millisecond)
			r.sendRaw(partialMessage(t, tc.size, tc.part))
			conns[i], starts[i] = r, time.Now()
		}
		for i, tc := range cases {
			checkClosedOnTime(t, tc.name, conns[i].c, starts[i])
		}
		if okOf(quiet.cmd(malPingCmd())) != 1 {
			t.Fatal("a client that said hello, then nothing, was closed with authentication off")
		}
		if n := strings.Count(logs.String(), "reason=partial_message"); n < 3 {
			t.Fatalf("%d partial_message closes logged, want 3 at least:\n%s", n, logs.String())
		}
	})
}

// A flood of sockets that send nothing, as many as max_client_conn, locks
// real clients out only until client_login_timeout closes them.
func TestLoginTimeoutShedsIdleFlood(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		a, addr, _ := fileBouncer(t, baseTOML(up.URI(), loginTimeoutTOML+"max_client_conn = 20\n"))
		waitUsable(t, a, 1)
		start := time.Now()
		flood := make([]net.Conn, 20)
		for i := range flood {
			flood[i] = dialRaw(t, addr).c
		}
		malWaitClients(t, a, 20, 5*time.Second)

		refused := dialRaw(t, addr)
		id := refused.send(0, limHello())
		rep, err := malRecv(refused.c, 10*time.Second)
		if err != nil || rep.responseTo != id {
			t.Fatalf("client over max_client_conn: want an error reply, got %v", err)
		}
		malCheckError(t, rep.body, 0, "too many client connections (max_client_conn = 20)")

		for i, nc := range flood {
			if d := closedAfter(t, nc, start, 5*time.Second); d < 900*time.Millisecond {
				t.Fatalf("idle socket %d closed after %v, before client_login_timeout", i, d)
			}
		}
		malWaitClients(t, a, 0, 5*time.Second)
		c := driver(t, addr, "")
		if err := c.Ping(ctxT(t, 10*time.Second), nil); err != nil {
			t.Fatalf("a real client after the flood was shed: %v", err)
		}
	})
}

// The TLS handshake counts towards client_login_timeout, which is shorter
// here than tls_handshake_timeout: a client that starts a handshake and
// stalls is closed after the login timeout, and so is one that completes
// the handshake and then sends nothing.
func TestLoginTimeoutBoundsTLSClients(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		f := newTLSFiles(t, t.TempDir(), "lt")
		a, addr, _ := fileBouncer(t, baseTOML(up.URI(), f.tlsTOML("require", false)+
			"tls_handshake_timeout = \"10s\"\n"+loginTimeoutTOML))
		waitUsable(t, a, 1)

		start := time.Now()
		stalled := dialRaw(t, addr)
		stalled.sendRaw([]byte{0x16, 0x03, 0x01}) // a TLS record header, begun
		tc, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tc.Close() })
		checkClosedOnTime(t, "stalled TLS handshake", stalled.c, start)
		// A TLS client's close is the end of its connection, or an alert.
		_ = tc.SetReadDeadline(start.Add(4 * time.Second))
		_, err = tc.Read(make([]byte, 1))
		if ne, ok := err.(net.Error); ok && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatal("a TLS client that sent nothing after its handshake is still connected after 4s")
		}
		if d := time.Since(start); d < 900*time.Millisecond {
			t.Fatalf("TLS client closed after %v, before client_login_timeout", d)
		}
		if n := a.Server().LoginTimeouts(); n != 2 {
			t.Fatalf("%d clients closed by client_login_timeout, want 2", n)
		}
	})
}

// A reload changes client_login_timeout for connected clients too: a
// client waiting (on its goroutine or in the loop) under 60s is closed
// once a reload sets 1s, and SHOW CONFIG says so.
func TestLoginTimeoutReload(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := fakemongo.Start(t, fakemongo.Options{InMemory: true})
		var logs logbuf.Buffer
		a, addr, _ := authSetupWith(t, up.URI(), &logs, "client_login_timeout = \"60s\"\n")
		waitUsable(t, a, 1)
		if got := a.Config()["client_login_timeout"]; got != "1m0s" {
			t.Fatalf("SHOW CONFIG client_login_timeout %v, want 1m0s", got)
		}
		silent := dialRaw(t, addr)
		hello := dialRaw(t, addr)
		if okOf(hello.hello()) != 1 {
			t.Fatal("hello refused")
		}
		time.Sleep(100 * time.Millisecond) // both wait now, under 60s

		path := a.Config()["path"].(string)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		next := strings.Replace(string(b), "client_login_timeout = \"60s\"", loginTimeoutTOML, 1)
		if err := os.WriteFile(path, []byte(next), 0o600); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := a.Reload(); err != nil {
			t.Fatal(err)
		}
		if got := a.Config()["client_login_timeout"]; got != "1s" {
			t.Fatalf("SHOW CONFIG client_login_timeout %v after reload, want 1s", got)
		}
		closedAfter(t, silent.c, start, 3*time.Second)
		closedAfter(t, hello.c, start, 3*time.Second)
		if !strings.Contains(logs.String(), "client_login_timeout 1s") {
			t.Fatalf("the reload's changes do not name client_login_timeout:\n%s", logs.String())
		}
	})
}
