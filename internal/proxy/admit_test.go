package proxy

// admit's verdicts on each request (allocation-free), and the bounds on a
// client that has not logged in (pre-login size, compressors, draining ping).

import (
	"bytes"
	"log/slog"
	"net"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/auth"
	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/gate"
	"github.com/mongobouncer/mongobouncer/internal/hello"
	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/routing"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

type stubAdmin struct{}

func (stubAdmin) HandleAdmin(net.Addr, bsoncore.Document) bsoncore.Document { return command.OKReply }

// The verdict table of admit, which both I/O models ask: what is refused
// (and with which code), answered by mongobouncer, forwarded by the
// goroutine only, or left to the loop.
func TestAdmitVerdicts(t *testing.T) {
	route := limitsRoute(t, "shop", "127.0.0.1:1")
	route.SetClientLimits(route.IdleLimit(), 16*1024)
	session := limitsRoute(t, "sess", "127.0.0.1:1")
	session.SetPoolMode(ModeSession)
	c := authClient(t)
	c.s.opts.Admin = stubAdmin{}
	cmd := func(name, db string, extra ...bson.E) *command.Request {
		d := bson.D{{Key: name, Value: 1}}
		if db != "" {
			d = append(d, bson.E{Key: "$db", Value: db})
		}
		return reqOf(t, append(d, extra...))
	}
	lsid := bson.E{Key: "lsid", Value: bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: make([]byte, 16)}}}}
	type tc struct {
		name  string
		req   *command.Request
		route *routing.Route
		flags wire.MsgFlags
		size  int
		kind  admitKind
		code  int32
	}
	preLogin := []tc{
		{"hello", cmd("hello", "admin"), nil, 0, 100, admitAnswer, 0},
		{"isMaster without $db", cmd("isMaster", ""), nil, 0, 100, admitAnswer, 0},
		{"saslStart", cmd("saslStart", "admin"), nil, 0, 100, admitAnswer, 0},
		{"ping", cmd("ping", "shop"), route, 0, 100, admitAnswer, 0},
		{"ping with a session", cmd("ping", "shop", lsid, bson.E{Key: "txnNumber", Value: int64(1)}), route, 0, 100, admitAnswer, 0},
		{"ping in session mode", cmd("ping", "sess"), session, 0, 100, admitAnswer, 0},
		{"buildInfo", cmd("buildInfo", "admin"), nil, 0, 100, admitAnswer, 0},
		{"buildinfo", cmd("buildinfo", "x"), route, 0, 100, admitAnswer, 0},
		{"ping without $db", cmd("ping", ""), route, 0, 100, admitRefuse, 13},
		{"ping on the admin console", cmd("ping", AdminDatabase), nil, 0, 100, admitRefuse, 13},
		{"find", cmd("find", "shop"), route, 0, 100, admitRefuse, 13},
		{"endSessions", cmd("endSessions", "admin"), nil, 0, 100, admitRefuse, 13},
		{"showClients", cmd("showClients", AdminDatabase), nil, 0, 100, admitRefuse, 13},
	}
	for _, x := range preLogin {
		v := c.s.admit(c.login.Ident, &c.sess, x.size, x.flags, x.req, x.route)
		if v.kind != x.kind || x.kind == admitRefuse && codeOf(v.reply) != x.code {
			t.Errorf("before login, %s: verdict %d %v, want %d code %d", x.name, v.kind, bson.Raw(v.reply), x.kind, x.code)
		}
	}
	loggedIn := []tc{
		{"find", cmd("find", "shop"), route, 0, 100, admitLoop, 0},
		{"ping", cmd("ping", "shop"), route, 0, 100, admitLoop, 0},
		{"find over the route's max_message_size", cmd("find", "shop"), route, 0, 16*1024 + 1, admitRefuse, 10334},
		{"find over it, exhaust", cmd("getMore", "shop"), route, wire.FlagExhaustAllowed, 20000, admitRefuse, 10334},
		{"find without $db", cmd("find", ""), route, 0, 100, admitRefuse, 40571},
		{"find, no route", cmd("find", "nowhere"), nil, 0, 100, admitRefuse, 70},
		{"endSessions, no route", cmd("endSessions", "admin"), nil, 0, 100, admitAnswer, 0},
		{"endSessions", cmd("endSessions", "admin"), route, 0, 100, admitForward, 0},
		{"exhaust getMore", cmd("getMore", "shop"), route, wire.FlagExhaustAllowed, 100, admitForward, 0},
		{"moreToCome insert", cmd("insert", "shop"), route, wire.FlagMoreToCome, 100, admitForward, 0},
		{"startTransaction", cmd("insert", "shop", lsid, bson.E{Key: "txnNumber", Value: int64(1)},
			bson.E{Key: "startTransaction", Value: true}, bson.E{Key: "autocommit", Value: false}), route, 0, 100, admitForward, 0},
		{"session mode", cmd("find", "sess"), session, 0, 100, admitForward, 0},
		{"admin command, not an admin", cmd("showClients", AdminDatabase), nil, 0, 100, admitRefuse, 13},
	}
	c.login.Ident = &auth.Identity{User: "app", DB: "admin"}
	for _, x := range loggedIn {
		v := c.s.admit(c.login.Ident, &c.sess, x.size, x.flags, x.req, x.route)
		if v.kind != x.kind || x.kind == admitRefuse && codeOf(v.reply) != x.code {
			t.Errorf("logged in, %s: verdict %d %v, want %d code %d", x.name, v.kind, bson.Raw(v.reply), x.kind, x.code)
		}
	}
	c.login.Ident = &auth.Identity{User: "ops", DB: "admin"}
	if v := c.s.admit(c.login.Ident, &c.sess, 100, 0, cmd("showClients", AdminDatabase), nil); v.kind != admitAnswer {
		t.Errorf("admin command by an admin: %d %v", v.kind, bson.Raw(v.reply))
	}
	c.s.opts.Admin = nil
	if v := c.s.admit(c.login.Ident, &c.sess, 100, 0, cmd("showClients", AdminDatabase), nil); codeOf(v.reply) != 13 {
		t.Errorf("admin command, admin disabled: %d %v", v.kind, bson.Raw(v.reply))
	}
	c.s.draining.Store(true)
	if v := c.s.admit(c.login.Ident, &c.sess, 100, 0, cmd("find", "shop"), route); codeOf(v.reply) != 91 {
		t.Errorf("find while draining: %d %v", v.kind, bson.Raw(v.reply))
	}
	c.s.draining.Store(false)

	// Without client authentication nobody logs in: ping and find are
	// forwarded, and the admin console needs no user.
	c.s.opts.Auth, c.login.Ident, c.s.opts.Admin = nil, nil, stubAdmin{}
	for _, x := range []tc{
		{"ping", cmd("ping", "shop"), route, 0, 100, admitLoop, 0},
		{"find", cmd("find", "shop"), route, 0, 100, admitLoop, 0},
		{"showClients", cmd("showClients", AdminDatabase), nil, 0, 100, admitAnswer, 0},
		{"find over the route's max_message_size", cmd("find", "shop"), route, 0, 16*1024 + 1, admitRefuse, 10334},
	} {
		v := c.s.admit(c.login.Ident, &c.sess, x.size, x.flags, x.req, x.route)
		if v.kind != x.kind || x.kind == admitRefuse && codeOf(v.reply) != x.code {
			t.Errorf("no auth, %s: verdict %d %v, want %d code %d", x.name, v.kind, bson.Raw(v.reply), x.kind, x.code)
		}
	}
}

// A request admit lets through costs no allocation: the loop asks it for
// every request.
func TestAdmitAllocatesNothing(t *testing.T) {
	route := limitsRoute(t, "shop", "127.0.0.1:1")
	c := authClient(t)
	c.login.Ident = &auth.Identity{User: "app", DB: "admin"}
	req := reqOf(t, bson.D{{Key: "find", Value: "c"}, {Key: "$db", Value: "shop"}})
	if n := testing.AllocsPerRun(100, func() { _ = c.s.admit(c.login.Ident, &c.sess, 100, 0, req, route) }); n != 0 {
		t.Fatalf("admit allocates %v times per request", n)
	}
}

// The first $db names the database, as mongod reads it.
func TestInspectFirstDB(t *testing.T) {
	r := reqOf(t, bson.D{{Key: "find", Value: "c"}, {Key: "$db", Value: "first"}, {Key: "$db", Value: "second"}})
	if string(r.DB) != "first" {
		t.Fatalf("$db %q, want the first", r.DB)
	}
	r = reqOf(t, bson.D{{Key: "find", Value: "c"}, {Key: "$db", Value: 1}, {Key: "$db", Value: "second"}})
	if len(r.DB) != 0 {
		t.Fatalf("$db %q from a second field after one that is not a string", r.DB)
	}
}

// Before a login, the message size a header declares and the size a
// compressed message declares are bounded by max_prelogin_message_size,
// after it by max_message_size; a compressor the hello did not agree on is
// refused before anything is inflated.
func TestPreLoginLimitsAndCompressors(t *testing.T) {
	c := authClient(t)
	c.maxMsg = 48_000_000
	if got := c.login.readLimit(c.s, c.maxMsg); got != gate.DefaultMaxPreLoginMessageSize {
		t.Fatalf("limit before login %d, want %d", got, gate.DefaultMaxPreLoginMessageSize)
	}
	c.s.SetPreLoginMessageSize(20_000)
	if got := c.login.readLimit(c.s, c.maxMsg); got != 20_000 {
		t.Fatalf("limit before login %d, want the configured 20000", got)
	}
	if err := c.login.sizeError(c.s, 30_000, c.login.readLimit(c.s, c.maxMsg)); !strings.Contains(err.Error(), "max_prelogin_message_size") {
		t.Fatalf("size error before login: %v", err)
	}
	c.login.Ident = &auth.Identity{User: "app", DB: "admin"}
	if got := c.login.readLimit(c.s, c.maxMsg); got != 48_000_000 {
		t.Fatalf("limit after login %d, want max_message_size", got)
	}
	c.login.Ident = nil

	ping := wire.AppendMsg(nil, 1, 0, 0, mustDoc(t, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "x"}}))
	for _, id := range []wire.CompressorID{wire.CompressorNoop, wire.CompressorSnappy, wire.CompressorZlib, wire.CompressorZstd} {
		msg, err := wire.Compress(nil, ping, id)
		if err != nil {
			t.Fatal(err)
		}
		c.comp = 0
		if err := c.checkCompressed(msg); err == nil || !strings.Contains(err.Error(), "agreed: none") {
			t.Fatalf("%s with nothing agreed: %v", id, err)
		}
		c.comp = 1 << ((id + 1) % 4)
		if err := c.checkCompressed(msg); err == nil {
			t.Fatalf("%s with only %s agreed: accepted", id, (id+1)%4)
		}
		c.comp = 1 << id
		if err := c.checkCompressed(msg); err != nil {
			t.Fatalf("%s agreed: %v", id, err)
		}
	}
}

// A client that has not logged in never gets the upstream's own words:
// the route's service user and its hosts stay in the log.
func TestPreLoginFailureHidesUpstream(t *testing.T) {
	var logs bytes.Buffer
	c := authClient(t)
	c.s.log = slog.New(slog.NewTextHandler(&logs, nil))
	c.s.opts.Observer = nopObserver{}
	c.x.route = &routing.Route{Name: "orders"}
	c.x.req = *reqOf(t, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "shop"}})
	refused := &upstream.AuthError{Mechanism: "SCRAM-SHA-256", Username: "svc-user", Source: "admin", Code: 18, CodeName: "AuthenticationFailed"}
	err := &pool.ConnectionError{Address: "db1.internal:27017", Err: &upstream.ConnectError{Addr: "db1.internal:27017", Stage: "auth", Err: refused}}
	doc := c.x.fail(err)
	msg, _ := doc.Lookup("errmsg").StringValueOK()
	if strings.Contains(msg, "svc-user") || strings.Contains(msg, "db1.internal") || msg == "" {
		t.Fatalf("reply before login: %v", bson.Raw(doc))
	}
	if !strings.Contains(logs.String(), "svc-user") {
		t.Fatalf("the detail is not in the log: %s", logs.String())
	}
	c.login.Ident = &auth.Identity{User: "app", DB: "admin"}
	if msg, _ := c.x.fail(err).Lookup("errmsg").StringValueOK(); !strings.Contains(msg, "orders") {
		t.Fatalf("reply after login: %q", msg)
	}
}

// A user name over auth.MaxUserName fails the login at saslStart, before any
// lookup, and no log line carries more than auth.LogNameLen bytes of it; a
// saslSupportedMechs for one is not looked up.
func TestLongUserNameFailsLogin(t *testing.T) {
	var logs bytes.Buffer
	c := authClient(t)
	c.log = slog.New(slog.NewTextHandler(&logs, nil))
	long := strings.Repeat("u", auth.MaxUserName+1)
	start := func(user string) bsoncore.Document {
		return c.authStep().saslStart(mustDoc(t, bson.D{{Key: "saslStart", Value: 1}, {Key: "mechanism", Value: "SCRAM-SHA-256"},
			{Key: "payload", Value: bson.Binary{Data: []byte("n,,n=" + user + ",r=abcdefghijklmnop")}}}), "admin")
	}
	if d := start(long); codeOf(d) != 18 || c.login.Conv != nil {
		t.Fatalf("saslStart as a %d-byte user: %v", len(long), bson.Raw(d))
	}
	// Escapes count as the one byte they stand for.
	if d := start(strings.Repeat("=2C", auth.MaxUserName)); okOf(d) != 1 {
		t.Fatalf("saslStart as a %d-byte user: %v", auth.MaxUserName, bson.Raw(d))
	}
	if d := start(strings.Repeat("=3D", auth.MaxUserName+1)); codeOf(d) != 18 {
		t.Fatalf("saslStart as a %d-byte user: %v", auth.MaxUserName+1, bson.Raw(d))
	}
	for line := range strings.Lines(logs.String()) {
		if len(line) > 4*auth.LogNameLen {
			t.Fatalf("a log line of %d bytes: %.300s", len(line), line)
		}
	}
	reply := c.authStep().hello(mustDoc(t, bson.D{{Key: "hello", Value: 1}, {Key: "saslSupportedMechs", Value: "admin." + long}}),
		hello.Reply(&hello.Request{}, hello.DefaultLimits, 1, "", bson.ObjectID{}, hello.TopologyVersion{}))
	if _, err := bsoncore.Document(reply).LookupErr("saslSupportedMechs"); err == nil {
		t.Fatal("saslSupportedMechs answered for a name over the bound")
	}
}

// While draining, a ping from a client that has not logged in gets
// ShutdownInProgress (91), as a logged-in client's does: load balancers'
// health checks send such pings, and must see the drain.
func TestAdmitPreLoginPingWhileDraining(t *testing.T) {
	route := limitsRoute(t, "shop", "127.0.0.1:1")
	c := authClient(t)
	ping := reqOf(t, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "shop"}})
	c.s.draining.Store(true)
	defer c.s.draining.Store(false)
	if v := c.s.admit(c.login.Ident, &c.sess, 100, 0, ping, route); v.kind != admitRefuse || codeOf(v.reply) != 91 {
		t.Errorf("ping before login while draining: verdict %d %v, want refused with 91 (ShutdownInProgress)", v.kind, bson.Raw(v.reply))
	}
}
