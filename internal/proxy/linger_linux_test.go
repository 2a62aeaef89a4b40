package proxy

// Lingering at close (linger_linux.go), with a client that goes on sending
// after Server.Close has let go of it: the case the wait for the socket's
// queue exists for. A plain close of a socket with replies still queued
// delivers them on loopback, as long as no more input arrives: what
// arrives at a closed socket resets the connection, which drops every
// byte still queued.

import (
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// tcpClientBufs is tcpClient with the proxy side's send buffer (sndbuf)
// and the test side's receive buffer (rcvbuf) set apart: a large send
// buffer in front of a small receive buffer keeps most of what the proxy
// wrote queued in its own socket.
func (r *loopRig) tcpClientBufs(sndbuf, rcvbuf int) *affConn {
	r.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		r.t.Fatal(err)
	}
	defer ln.Close()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvbuf) })
	}}
	ours, err := d.Dial("tcp", ln.Addr().String())
	if err != nil {
		r.t.Fatal(err)
	}
	theirs, err := ln.Accept()
	if err != nil {
		ours.Close()
		r.t.Fatal(err)
	}
	if err := theirs.(*net.TCPConn).SetWriteBuffer(sndbuf); err != nil {
		ours.Close()
		theirs.Close()
		r.t.Fatal(err)
	}
	return r.serve(ours, theirs, "tcp")
}

// The server shuts down while tens of kilobytes of replies wait in the
// socket of a client that reads slowly, and the client sends more requests
// after Close has let go of its connection, before it has read the
// replies: on every I/O model, Close keeps the socket open until the
// replies have left (its input discarded), so the client reads every reply,
// whole and in order, then the hang-up. Without the wait (a plain close at
// once) the requests arriving at the closed socket reset the connection,
// and the replies still queued are lost.
func TestCloseKeepsRepliesForAClientStillSending(t *testing.T) {
	eachModel(t, func(t *testing.T, o rigOptions) {
		var seen atomic.Int64
		o.maxPool = 2
		r := newRig(t, o, func(req *fakemongo.Request) fakemongo.Reply {
			if n, ok := req.Body.Lookup("n").AsInt64OK(); ok {
				seen.Store(n)
			}
			return paddedReply(req)
		})
		l := r.s.loopsPtr.Load()
		cl := r.tcpClientBufs(64<<10, 4096)
		sent := fillNonReader(t, cl, &seen)
		done := startShutdown(t, r)

		_ = cl.c.SetDeadline(time.Now().Add(20 * time.Second))
		i := 1 // the next message to read
		read := func() error {
			rep, err := wire.ReadMessage(cl.c, nil, wire.DefaultMaxMessageSize)
			if err != nil {
				return err
			}
			m, err := wire.ParseMsg(rep)
			if err != nil {
				t.Fatalf("message %d: %v", i, err)
			}
			if i >= sent {
				// The request the proxy had not taken yet: refused by the
				// drain (on io_uring it is never read).
				if code, _ := bson.Raw(m.Body).Lookup("code").AsInt64OK(); m.Header.ResponseTo != int32(i) || code != command.CodeShutdownInProgress || i > sent {
					t.Fatalf("message %d after the replies: %v", i, bson.Raw(m.Body))
				}
			} else if n, _ := bson.Raw(m.Body).Lookup("n").AsInt64OK(); m.Header.ResponseTo != int32(i) || n != int64(i) {
				t.Fatalf("reply %d is to request %d (n %d)", i, m.Header.ResponseTo, n)
			}
			i++
			return nil
		}
		// Read slowly until Close has let go of the client: the drain
		// waits for the reply the proxy was writing, and on io_uring
		// Close for the ring's send, each of which needs some room.
		let := func() bool {
			return r.s.ClientCount() == 0 && (l == nil || l.Lingering() == 0)
		}
		for !let() {
			if i >= sent {
				t.Fatalf("all %d replies read before Close let go of the client", sent-1)
			}
			if err := read(); err != nil {
				t.Fatalf("reply %d of %d before Close let go of the client: %v", i, sent-1, err)
			}
			// Slowly: a reply read is room for the proxy's, and the
			// drain and Close need a moment to act on it.
			for end := time.Now().Add(5 * time.Millisecond); !let() && time.Now().Before(end); {
				time.Sleep(time.Millisecond)
			}
		}
		// What the client has not read is in its own receive buffer (a
		// few kilobytes) and in the proxy's send queue, which the test is
		// about: tens of kilobytes unread leave it full.
		left := sent - i
		if left < 100 {
			t.Fatalf("only %d replies left unread once Close let go of the client, want tens of kilobytes", left)
		}
		// More requests, with the replies still queued (the client reads
		// nothing meanwhile).
		for k := range 5 {
			time.Sleep(10 * time.Millisecond)
			msg := wire.AppendMsg(nil, int32(sent+1+k), 0, 0, mustDoc(t, ping()))
			if _, err := cl.c.Write(msg); err != nil {
				t.Fatalf("request %d after Close: %v, with %d replies still to read", sent+1+k, err, sent-i)
			}
		}
		time.Sleep(20 * time.Millisecond)
		for {
			err := read()
			if err == io.EOF && i >= sent {
				break
			}
			if err != nil {
				t.Fatalf("message %d (%d replies, %d unread when Close let go of the client): %v", i, sent-1, left, err)
			}
		}
		if err := <-done; err != nil {
			t.Fatalf("shutdown: %v", err)
		}
	})
}
