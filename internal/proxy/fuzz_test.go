package proxy

// Fuzz tests of the request parsers, admit, and a pre-login OP_COMPRESSED.

import (
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/auth"
	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/gate"
	"github.com/mongobouncer/mongobouncer/internal/routing"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// FuzzRequestParsers feeds arbitrary bytes to what the proxy itself still
// reads of replies (the parsers of commands and replies are command's,
// FuzzInspect; of a hello, hello's FuzzParse; of a pipeline, routing's
// FuzzPipelineWrites): stateChangeError reads upstream replies, which are
// relayed without validation, so it must survive anything.
func FuzzRequestParsers(f *testing.F) {
	for _, d := range []bson.D{
		{{Key: "find", Value: "c"}, {Key: "$db", Value: "d"}, {Key: "lsid", Value: bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: make([]byte, 16)}}}},
			{Key: "txnNumber", Value: int64(1)}, {Key: "startTransaction", Value: true}, {Key: "autocommit", Value: false}},
		{{Key: "getMore", Value: int64(7)}, {Key: "collection", Value: "c"}, {Key: "$db", Value: "d"}},
		{{Key: "killCursors", Value: "c"}, {Key: "cursors", Value: bson.A{int64(1), int64(2)}}, {Key: "$db", Value: "d"}},
		{{Key: "hello", Value: 1}, {Key: "compression", Value: bson.A{"zstd"}}, {Key: "client", Value: bson.D{{Key: "application", Value: bson.D{{Key: "name", Value: "x"}}}}}},
		{{Key: "cursor", Value: bson.D{{Key: "id", Value: int64(9)}}}, {Key: "ok", Value: 1.0}, {Key: "code", Value: int32(2)}},
		{{Key: "ok", Value: 0.0}, {Key: "code", Value: int32(10107)}, {Key: "topologyVersion", Value: bson.D{{Key: "processId", Value: bson.NewObjectID()}, {Key: "counter", Value: int64(3)}}}},
		{{Key: "ok", Value: 1.0}, {Key: "writeConcernError", Value: bson.D{{Key: "code", Value: int32(91)}}}},
		{{Key: "aggregate", Value: "c"}, {Key: "pipeline", Value: bson.A{bson.D{{Key: "$out", Value: "o"}}}}, {Key: "$readPreference", Value: bson.D{{Key: "mode", Value: "secondary"}}}},
	} {
		b, _ := bson.Marshal(d)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		doc := bsoncore.Document(b)
		ri := command.InspectReply(doc)
		if code := ri.StateChange(); code != 0 {
			_ = stateChangeError(code, doc)
		}
	})
}

// FuzzAdmit gives admit arbitrary command bodies, flags and sizes, for a
// client before and after its login: whatever it is sent, a client that
// has not logged in gets nothing forwarded, a refusal is a well-formed
// error reply, and what the loop may serve is a plain request within the
// route's max_message_size.
func FuzzAdmit(f *testing.F) {
	for _, d := range []bson.D{
		{{Key: "ping", Value: 1}, {Key: "$db", Value: "shop"}, {Key: "lsid", Value: bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: make([]byte, 16)}}}}, {Key: "txnNumber", Value: int64(3)}},
		{{Key: "buildInfo", Value: 1}, {Key: "$db", Value: "admin"}},
		{{Key: "find", Value: "c"}, {Key: "$db", Value: "shop"}, {Key: "$db", Value: "other"}},
		{{Key: "insert", Value: "c"}, {Key: "$db", Value: "shop"}, {Key: "lsid", Value: bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: make([]byte, 16)}}}},
			{Key: "txnNumber", Value: int64(1)}, {Key: "startTransaction", Value: true}, {Key: "autocommit", Value: false}},
		{{Key: "saslStart", Value: 1}, {Key: "$db", Value: "admin"}},
		{{Key: "showClients", Value: 1}, {Key: "$db", Value: AdminDatabase}},
		{{Key: "endSessions", Value: bson.A{}}, {Key: "$db", Value: "admin"}},
	} {
		b, _ := bson.Marshal(d)
		f.Add(b, uint32(0), 100, false)
		f.Add(b, uint32(wire.FlagExhaustAllowed), 20_000, true)
	}
	route := limitsRoute(f, "shop", "127.0.0.1:1")
	route.SetClientLimits(route.IdleLimit(), 16*1024)
	users, err := auth.ParseFile([]byte(`"app@admin" "pw"`), "t")
	if err != nil {
		f.Fatal(err)
	}
	s := &Server{opts: Options{Auth: &ClientAuth{Users: auth.New(users, nil, nil)}, Admin: stubAdmin{}}}
	f.Fuzz(func(t *testing.T, body []byte, flags uint32, size int, loggedIn bool) {
		if wire.ValidateDocument(body) != nil {
			return // the wire layer validates every body first
		}
		c := &client{s: s}
		c.bind()
		if loggedIn {
			c.login.Ident = &auth.Identity{User: "app", DB: "admin"}
		}
		var req command.Request
		req.Inspect(body)
		for _, r := range []*routing.Route{route, nil} {
			v := c.s.admit(c.login.Ident, &c.sess, size, wire.MsgFlags(flags), &req, r)
			switch v.kind {
			case admitRefuse:
				if wire.ValidateDocument(v.reply) != nil || codeOf(v.reply) == 0 {
					t.Fatalf("refusal %v", bson.Raw(v.reply))
				}
			case admitLoop, admitForward:
				if !loggedIn {
					t.Fatalf("%s forwarded before login", req.Name())
				}
				if r == nil || size > r.MessageLimit() {
					t.Fatalf("%s of %d bytes forwarded to route %v", req.Name(), size, r)
				}
			}
			if v.kind == admitLoop && (wire.MsgFlags(flags)&(wire.FlagExhaustAllowed|wire.FlagMoreToCome) != 0 || req.StartTxn) {
				t.Fatalf("the loop may serve %s with flags %#x", req.Name(), flags)
			}
		}
	})
}

// FuzzPreLoginCompressed gives a client's OP_COMPRESSED path arbitrary
// messages before and after a login, with any set of agreed compressors:
// nothing is inflated with a compressor the client did not agree on, and
// nothing to more than the client may send now.
func FuzzPreLoginCompressed(f *testing.F) {
	ping := wire.AppendMsg(nil, 1, 0, 0, mustDoc(f, bson.D{{Key: "ping", Value: 1}, {Key: "pad", Value: strings.Repeat("z", 70_000)}, {Key: "$db", Value: "x"}}))
	small := wire.AppendMsg(nil, 1, 0, 0, mustDoc(f, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "x"}}))
	for _, id := range []wire.CompressorID{wire.CompressorNoop, wire.CompressorSnappy, wire.CompressorZlib, wire.CompressorZstd} {
		for _, m := range [][]byte{ping, small} {
			z, err := wire.Compress(nil, m, id)
			if err != nil {
				f.Fatal(err)
			}
			if len(z) > 4096 {
				continue // large inputs slow the fuzzer down: the compressible ones suffice
			}
			f.Add(z, uint8(1)<<id, false)
			f.Add(z, uint8(0xf), true)
		}
	}
	users, err := auth.ParseFile([]byte(`"app@admin" "pw"`), "t")
	if err != nil {
		f.Fatal(err)
	}
	s := &Server{opts: Options{Auth: &ClientAuth{Users: auth.New(users, nil, nil)}}}
	f.Fuzz(func(t *testing.T, msg []byte, comp uint8, loggedIn bool) {
		c := &client{s: s, maxMsg: 128 << 10, conn: conn{comp: comp & 0xf}}
		c.bind()
		if loggedIn {
			c.login.Ident = &auth.Identity{User: "app", DB: "admin"}
		}
		limit := c.login.readLimit(c.s, c.maxMsg)
		if want := 128 << 10; !loggedIn && limit != gate.DefaultMaxPreLoginMessageSize || loggedIn && limit != want {
			t.Fatalf("limit %d (logged in %v)", limit, loggedIn)
		}
		if n, err := wire.MessageLength(msg, limit); err == nil && n > limit {
			t.Fatalf("a header of %d bytes passes a limit of %d", n, limit)
		}
		if c.checkCompressed(msg) != nil {
			return
		}
		out, err := wire.Decompress(nil, msg, limit)
		if err != nil {
			return
		}
		if len(out) > limit {
			t.Fatalf("inflated to %d bytes, over %d", len(out), limit)
		}
		if id := msg[wire.HeaderLen+8]; comp&0xf&(1<<id) == 0 {
			t.Fatalf("inflated with compressor %d, agreed %b", id, comp)
		}
	})
}
