package upstream

import (
	"errors"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/wire"
)

var okDoc, _ = bson.Marshal(bson.D{{Key: "ok", Value: 1.0}})

// fenceServer answers the hello, then hands every later request to serve.
func fenceServer(t *testing.T, serve func(c *fakeConn, req request) bool) string {
	t.Helper()
	srv := newFakeServer(t, func(c *fakeConn) {
		req, ok := c.read()
		if !ok || !c.reply(req, helloReply(nil), nil) {
			return
		}
		for {
			req, ok := c.read()
			if !ok || !serve(c, req) {
				return
			}
		}
	})
	return srv.addr()
}

// sendMoreToCome writes a {ping: 1} with moreToCome, as id.
func sendMoreToCome(t *testing.T, c *Conn, id int32) {
	t.Helper()
	body, _ := bson.Marshal(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}})
	if err := c.WriteMessage(wire.AppendMsg(nil, id, 0, wire.FlagMoreToCome, body)); err != nil {
		t.Fatal(err)
	}
}

// Fence drops a reply to the fire-and-forget request, whether the server
// sends one (FerretDB) or not (MongoDB), and leaves the connection clean.
func TestFence(t *testing.T) {
	for _, answer := range []bool{false, true} {
		addr := fenceServer(t, func(c *fakeConn, req request) bool {
			if req.flags&wire.FlagMoreToCome != 0 && !answer {
				return true
			}
			return c.reply(req, okDoc, nil)
		})
		c := dialDev(t, Options{}, addr)
		sendMoreToCome(t, c, 77)
		if err := c.Fence(testCtx(t), 77); err != nil {
			t.Fatalf("answer=%v: %v", answer, err)
		}
		if c.Buffered() != 0 {
			t.Fatalf("answer=%v: %d bytes left after the fence", answer, c.Buffered())
		}
		if _, err := c.RoundTrip(testCtx(t), "admin", ping()); err != nil {
			t.Fatalf("answer=%v: the next exchange: %v", answer, err)
		}
	}
}

// A reply to anything else, or a second reply to the request, means the
// connection cannot be trusted.
func TestFenceRefusesStrayReplies(t *testing.T) {
	for name, serve := range map[string]func(c *fakeConn, req request) bool{
		"reply to another request": func(c *fakeConn, req request) bool {
			if req.flags&wire.FlagMoreToCome != 0 {
				msg := wire.AppendMsg(nil, 1, 12345, 0, okDoc)
				return c.write(msg)
			}
			return c.reply(req, okDoc, nil)
		},
		"two replies": func(c *fakeConn, req request) bool {
			if req.flags&wire.FlagMoreToCome != 0 {
				return c.reply(req, okDoc, nil) && c.reply(req, okDoc, nil)
			}
			return c.reply(req, okDoc, nil)
		},
	} {
		c := dialDev(t, Options{}, fenceServer(t, serve))
		sendMoreToCome(t, c, 77)
		err := c.Fence(testCtx(t), 77)
		if !errors.Is(err, ErrBadReply) || !IsNetworkError(err) {
			t.Errorf("%s: %v, want a bad-reply network error", name, err)
		}
	}
}

// FerretDB, the dev upstream, answers requests sent with moreToCome.
func TestDevmongoFence(t *testing.T) {
	c := dialDev(t, Options{}, dev.Addr())
	sendMoreToCome(t, c, 5)
	if err := c.Fence(testCtx(t), 5); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RoundTrip(testCtx(t), "admin", ping()); err != nil {
		t.Fatal(err)
	}
}

// A server that answers a moreToCome request only after later replies:
// the fence remembers the request, and the reply, when it comes, is known
// for a stray (Stray), once.
func TestFenceRemembersUnansweredRequests(t *testing.T) {
	c := dialDev(t, Options{}, fenceServer(t, func(c *fakeConn, req request) bool {
		if req.flags&wire.FlagMoreToCome != 0 {
			return true
		}
		return c.reply(req, okDoc, nil)
	}))
	sendMoreToCome(t, c, 77)
	if err := c.Fence(testCtx(t), 77); err != nil {
		t.Fatal(err)
	}
	if c.Stray(78) {
		t.Fatal("a reply to another request taken for a stray")
	}
	if !c.Stray(77) || c.Stray(77) {
		t.Fatal("the unanswered request is not remembered exactly once")
	}
	for id := int32(1); id <= maxStrays+1; id++ {
		sendMoreToCome(t, c, id)
		if err := c.Fence(testCtx(t), id); err != nil {
			t.Fatal(err)
		}
	}
	if c.Stray(1) || !c.Stray(maxStrays+1) {
		t.Fatal("the remembered requests are not bounded, oldest forgotten first")
	}
}

// The moreToCome request's ID is the client's, so it may be the very ID
// the fence would give its own ping: a reply to the request must not then
// pass for the fence's, with the real one left behind it.
func TestFenceIDIsNotTheRequests(t *testing.T) {
	var held *request
	c := dialDev(t, Options{}, fenceServer(t, func(fc *fakeConn, req request) bool {
		if req.flags&wire.FlagMoreToCome != 0 {
			held = &req
			return true
		}
		if held == nil {
			return fc.reply(req, okDoc, nil)
		}
		// The reply to the moreToCome request, then the fence's, at once.
		both := wire.AppendMsg(nil, 1000, held.header.RequestID, 0, okDoc)
		both = wire.AppendMsg(both, 1001, req.header.RequestID, 0, okDoc)
		held = nil
		return fc.write(both)
	}))
	after := c.reqID.Load() + 1
	sendMoreToCome(t, c, after)
	if err := c.Fence(testCtx(t), after); err != nil {
		t.Fatal(err)
	}
	if c.Buffered() != 0 {
		t.Fatalf("%d bytes left after the fence", c.Buffered())
	}
	if _, err := c.RoundTrip(testCtx(t), "admin", ping()); err != nil {
		t.Fatalf("the next exchange: %v", err)
	}
}

// RoundTrip (the abort of a disconnected client's transaction) drops a
// late reply to a moreToCome request the fence remembered.
func TestRoundTripDropsRememberedStray(t *testing.T) {
	var pending *request
	c := dialDev(t, Options{}, fenceServer(t, func(c *fakeConn, req request) bool {
		if req.flags&wire.FlagMoreToCome != 0 {
			pending = &req
			return true
		}
		if pending != nil && req.body.Lookup("abortTransaction").Type != 0 {
			late := *pending
			pending = nil
			if !c.reply(late, okDoc, nil) {
				return false
			}
		}
		return c.reply(req, okDoc, nil)
	}))
	sendMoreToCome(t, c, 77)
	if err := c.Fence(testCtx(t), 77); err != nil {
		t.Fatal(err)
	}
	abort, _ := bson.Marshal(bson.D{{Key: "abortTransaction", Value: 1}})
	if _, err := c.RoundTrip(testCtx(t), "admin", abort); err != nil {
		t.Fatalf("the late reply was taken for the abort's: %v", err)
	}
	if c.Buffered() != 0 {
		t.Fatalf("%d bytes left", c.Buffered())
	}
}

// AwaitsStray holds a connection back from a request reusing a remembered
// ID only once its server was seen answering a moreToCome request: a
// server that never answers them (MongoDB) has the ID forgotten instead,
// so clients reusing low IDs do not cost connections.
func TestAwaitsStrayOnlyWhereTheServerAnswers(t *testing.T) {
	silent := dialDev(t, Options{}, fenceServer(t, func(c *fakeConn, req request) bool {
		if req.flags&wire.FlagMoreToCome != 0 {
			return true
		}
		return c.reply(req, okDoc, nil)
	}))
	sendMoreToCome(t, silent, 77)
	if err := silent.Fence(testCtx(t), 77); err != nil {
		t.Fatal(err)
	}
	if silent.AwaitsStray(77) || silent.Stray(77) {
		t.Fatal("a server never seen answering moreToCome: AwaitsStray kept the ID")
	}

	// This one answers the first moreToCome request at once, and the
	// second one never (or later than the fence).
	n := 0
	answering := dialDev(t, Options{}, fenceServer(t, func(c *fakeConn, req request) bool {
		if req.flags&wire.FlagMoreToCome != 0 {
			n++
			if n > 1 {
				return true
			}
		}
		return c.reply(req, okDoc, nil)
	}))
	sendMoreToCome(t, answering, 5)
	if err := answering.Fence(testCtx(t), 5); err != nil {
		t.Fatal(err)
	}
	if answering.AwaitsStray(5) {
		t.Fatal("a reply the fence dropped is still awaited")
	}
	sendMoreToCome(t, answering, 77)
	if err := answering.Fence(testCtx(t), 77); err != nil {
		t.Fatal(err)
	}
	if !answering.AwaitsStray(77) || !answering.AwaitsStray(77) || answering.AwaitsStray(78) {
		t.Fatal("AwaitsStray does not say (without forgetting it) that a reply to 77 may still come")
	}
	if !answering.Stray(77) || answering.AwaitsStray(77) {
		t.Fatal("the awaited reply is not dropped once")
	}
}
