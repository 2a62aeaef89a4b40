package admin

import (
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

var (
	loopback = &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 50000}
	remote   = &net.TCPAddr{IP: net.IPv4(10, 1, 2, 3), Port: 50000}
)

func cmdDoc(t testing.TB, d bson.D) bsoncore.Document {
	t.Helper()
	d = append(d, bson.E{Key: "$db", Value: "mongobouncer"})
	b, err := bson.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newTestHandler(f *fakeCtl) *Handler {
	h := NewHandler(f, nil)
	h.c.now = func() time.Time { return t0.Add(200 * time.Second) }
	return h
}

// run sends d from peer and returns the reply, checked to be valid BSON
// with a double ok.
func run(t *testing.T, h *Handler, peer net.Addr, d bson.D) bsoncore.Document {
	t.Helper()
	reply := h.HandleAdmin(peer, cmdDoc(t, d))
	if err := reply.Validate(); err != nil {
		t.Fatalf("reply is not valid BSON: %v", err)
	}
	if ok := reply.Lookup("ok"); ok.Type != bsoncore.TypeDouble {
		t.Fatalf("ok is %v, want a double: %v", ok.Type, reply)
	}
	return reply
}

func wantOK(t *testing.T, reply bsoncore.Document) {
	t.Helper()
	if reply.Lookup("ok").Double() != 1 {
		t.Fatalf("want ok: 1, got %v", reply)
	}
}

func wantErr(t *testing.T, reply bsoncore.Document, code int32, codeName, msgPart string) {
	t.Helper()
	var e struct {
		OK       float64 `bson:"ok"`
		Errmsg   string  `bson:"errmsg"`
		Code     int32   `bson:"code"`
		CodeName string  `bson:"codeName"`
	}
	if err := bson.Unmarshal(reply, &e); err != nil {
		t.Fatal(err)
	}
	if e.OK != 0 || e.Code != code || e.CodeName != codeName || !strings.HasPrefix(e.Errmsg, "mongobouncer: ") || !strings.Contains(e.Errmsg, msgPart) {
		t.Fatalf("got %+v, want ok 0, code %d %s, errmsg containing %q", e, code, codeName, msgPart)
	}
}

func TestShowPools(t *testing.T) {
	f := newFake()
	h := newTestHandler(f)
	reply := run(t, h, loopback, bson.D{{Key: "showPools", Value: 1}})
	wantOK(t, reply)
	if k := reply.Index(0).Key(); k != "pools" {
		t.Fatalf("first field %q, want pools", k)
	}
	var got struct{ Pools []PoolInfo }
	if err := bson.Unmarshal(reply, &got); err != nil {
		t.Fatal(err)
	}
	want := sortedPools(f.Pools())
	if !slices.Equal(got.Pools, want) || len(want) != 4 {
		t.Fatalf("pools\n got %+v\nwant %+v", got.Pools, want)
	}
	if got.Pools[0].Route != "*" || got.Pools[3].Route != "orders" || got.Pools[2].Server != "127.0.0.1:27017" {
		t.Fatalf("pools not sorted by route, server: %+v", got.Pools)
	}
	// Small integers are int32, so mongosh prints 4, not Long('4').
	p0 := reply.Lookup("pools", "0")
	for _, k := range []string{"generation", "inUse", "maxPoolSize"} {
		if typ := p0.Document().Lookup(k).Type; typ != bsoncore.TypeInt32 {
			t.Errorf("%s is %v, want int32", k, typ)
		}
	}
}

func TestShowPoolsEmpty(t *testing.T) {
	f := newFake()
	f.pools = []PoolInfo{}
	reply := run(t, newTestHandler(f), loopback, bson.D{{Key: "showPools", Value: 1}})
	if v := reply.Lookup("pools"); v.Type != bsoncore.TypeArray {
		t.Fatalf("pools is %v, want an empty array", v.Type)
	}
}

func TestShowStatsRates(t *testing.T) {
	f := newFake()
	h := newTestHandler(f)
	decode := func() StatsReport {
		reply := run(t, h, loopback, bson.D{{Key: "showStats", Value: 1}})
		wantOK(t, reply)
		var got struct{ Stats StatsReport }
		if err := bson.Unmarshal(reply, &got); err != nil {
			t.Fatal(err)
		}
		return got.Stats
	}
	// First call: step 1, 2 s of uptime, rates over the whole uptime.
	s1 := decode()
	if s1.Operations != 500 || s1.UptimeSec != 2 || s1.Rates.Since != SinceStart || s1.Rates.WindowSec != 2 ||
		s1.Rates.OperationsPerSec != 250 || s1.Rates.BytesInPerSec != 32000 || s1.Rates.ClientsPerSec != 5 {
		t.Fatalf("first showStats: %+v", s1)
	}
	if s1.WaitAvgMs != 0.5 || s1.WaitP99Ms != 3 || s1.QueryAvgMs != 1.5 || s1.QueryP99Ms != 9 || s1.QueryAvgNs != 1500000 {
		t.Fatalf("first showStats latencies: %+v", s1)
	}
	// Two more steps happen between the calls (the sampler or anyone else
	// may call Stats): the window is 4 s and 1000 operations.
	f.Stats()
	s2 := decode()
	if s2.Operations != 1500 || s2.Rates.Since != SincePrevious || s2.Rates.WindowSec != 4 ||
		s2.Rates.OperationsPerSec != 250 || s2.Rates.ErrorsPerSec != 0.5 || s2.Rates.BytesOutPerSec != 64000 {
		t.Fatalf("second showStats: %+v", s2)
	}
}

func TestRatesEdgeCases(t *testing.T) {
	cur := StatsInfo{Uptime: 4 * time.Second, Operations: 10}
	if r := rates(cur, cur, SincePrevious); r.OperationsPerSec != 0 || r.WindowSec != 0 {
		t.Errorf("empty window: %+v", r)
	}
	if r := rates(StatsInfo{Uptime: time.Second, Operations: 50}, cur, SincePrevious); r.OperationsPerSec != 0 {
		t.Errorf("counter went backwards: %+v", r)
	}
	if r := rates(StatsInfo{}, cur, SinceStart); r.OperationsPerSec != 2.5 {
		t.Errorf("from start: %+v", r)
	}
}

func TestShowClients(t *testing.T) {
	f := newFake()
	h := newTestHandler(f)
	reply := run(t, h, loopback, bson.D{{Key: "showClients", Value: 1}})
	wantOK(t, reply)
	var got struct{ Clients []ClientView }
	if err := bson.Unmarshal(reply, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Clients) != 40 {
		t.Fatalf("%d clients, want 40", len(got.Clients))
	}
	for i, c := range got.Clients {
		if c.ID != int64(i+1) {
			t.Fatalf("clients not sorted by id: %d at %d", c.ID, i)
		}
	}
	c3 := got.Clients[2]
	// Client 3 connected at t0+3s; now is t0+200s.
	if c3.Addr != "127.0.0.1:40003" || c3.ConnectedForSec != 197 || !c3.ConnectedAt.Equal(t0.Add(3*time.Second)) || c3.Requests != 30 {
		t.Fatalf("client 3: %+v", c3)
	}
	raw := reply.Lookup("clients", "2")
	if typ := raw.Document().Lookup("connectedAt").Type; typ != bsoncore.TypeDateTime {
		t.Errorf("connectedAt is %v, want a BSON date", typ)
	}
	for _, c := range got.Clients {
		if (c.State == ClientPinned) != (c.PinnedServer != "") {
			t.Errorf("client %d: state %s, pinnedServer %q", c.ID, c.State, c.PinnedServer)
		}
	}
	docs, _ := reply.Lookup("clients").Array().Values()
	for _, d := range docs {
		if d.Document().Lookup("state").StringValue() != string(ClientPinned) {
			if _, err := d.Document().LookupErr("pinnedServer"); err == nil {
				t.Errorf("unpinned client has a pinnedServer field: %v", d)
			}
		}
	}
}

func TestShowServers(t *testing.T) {
	h := newTestHandler(newFake())
	reply := run(t, h, loopback, bson.D{{Key: "showServers", Value: 1}})
	wantOK(t, reply)
	var got struct{ Servers []ServerConnView }
	if err := bson.Unmarshal(reply, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Servers) != 3 || got.Servers[0].ID != 7 || got.Servers[1].ID != 1 || got.Servers[2].ID != 2 {
		t.Fatalf("servers not sorted by route, server, id: %+v", got.Servers)
	}
	pending, used := got.Servers[0], got.Servers[2]
	if pending.LastUsed != nil || pending.IdleSec != nil || pending.AgeSec != 100 {
		t.Errorf("pending connection: %+v", pending)
	}
	if used.LastUsed == nil || !used.LastUsed.Equal(t0.Add(90*time.Second)) || used.IdleSec == nil || *used.IdleSec != 110 || used.AgeSec != 200 {
		t.Errorf("used connection: %+v", used)
	}
	if _, err := reply.Lookup("servers", "0").Document().LookupErr("lastUsed"); err == nil {
		t.Errorf("a never-used connection has a lastUsed field")
	}
}

func TestShowConfigSorted(t *testing.T) {
	h := newTestHandler(newFake())
	var first bsoncore.Document
	for range 5 { // map order is random: every call must still agree
		reply := run(t, h, loopback, bson.D{{Key: "showConfig", Value: 1}})
		wantOK(t, reply)
		if first == nil {
			first = reply
		} else if !slices.Equal(first, reply) {
			t.Fatalf("showConfig differs between calls:\n%v\n%v", first, reply)
		}
	}
	cfg := first.Lookup("config").Document()
	keys := func(d bsoncore.Document) []string {
		es, _ := d.Elements()
		var ks []string
		for _, e := range es {
			ks = append(ks, e.Key())
		}
		return ks
	}
	if got := keys(cfg); !slices.Equal(got, []string{"databases", "listeners", "mongobouncer"}) {
		t.Fatalf("config keys %v", got)
	}
	if got := keys(cfg.Lookup("databases").Document()); !slices.Equal(got, []string{"*", "orders"}) {
		t.Fatalf("databases keys %v", got)
	}
	if v := cfg.Lookup("mongobouncer", "max_pool_size"); v.Type != bsoncore.TypeInt32 || v.Int32() != 10 {
		t.Fatalf("max_pool_size %v", v)
	}
	if v := cfg.Lookup("listeners", "1").StringValue(); v != "/tmp/mb.sock" {
		t.Fatalf("listeners.1 %q", v)
	}
}

func TestActions(t *testing.T) {
	f := newFake()
	h := newTestHandler(f)
	for _, tc := range []struct {
		cmd  bson.D
		call string
		note string
	}{
		{bson.D{{Key: "pause", Value: 1}}, "pause ", "paused every route"},
		{bson.D{{Key: "pause", Value: 1}, {Key: "route", Value: "orders"}}, "pause orders", "paused route orders"},
		{bson.D{{Key: "resume", Value: true}, {Key: "route", Value: "orders"}}, "resume orders", "resumed route orders"},
		{bson.D{{Key: "resume", Value: 1}}, "resume ", "resumed every route"},
		{bson.D{{Key: "reconnect", Value: 1}}, "reconnect ", "reconnecting every route"},
		{bson.D{{Key: "reconnect", Value: 1}, {Key: "route", Value: "*"}}, "reconnect *", "reconnecting route *"},
		{bson.D{{Key: "reload", Value: 1}}, "reload", "reloaded"},
		{bson.D{{Key: "shutdown", Value: 1}}, "shutdown", "ShutdownInProgress (91)"},
		// mongosh users coming from PgBouncer.
		{bson.D{{Key: "PAUSE", Value: 1}}, "pause ", "paused"},
	} {
		before := len(f.Calls())
		reply := run(t, h, loopback, tc.cmd)
		wantOK(t, reply)
		if note := reply.Lookup("note").StringValue(); !strings.Contains(note, tc.note) {
			t.Errorf("%v: note %q, want %q", tc.cmd, note, tc.note)
		}
		if calls := f.Calls(); len(calls) != before+1 || calls[before] != tc.call {
			t.Errorf("%v: controller calls %q, want %q last", tc.cmd, calls, tc.call)
		}
	}
}

func TestErrors(t *testing.T) {
	f := newFake()
	f.reload = errBadFile
	h := newTestHandler(f)
	for _, tc := range []struct {
		name     string
		peer     net.Addr
		cmd      bson.D
		code     int32
		codeName string
		msg      string
	}{
		{"remote peer", remote, bson.D{{Key: "showPools", Value: 1}}, 13, "Unauthorized",
			"not authorized: admin commands are only accepted from loopback or the admin listener"},
		{"remote peer action", remote, bson.D{{Key: "shutdown", Value: 1}}, 13, "Unauthorized", "not authorized"},
		{"nil peer", nil, bson.D{{Key: "showPools", Value: 1}}, 13, "Unauthorized", "not authorized"},
		{"ipv6 remote", &net.TCPAddr{IP: net.ParseIP("2001:db8::1")}, bson.D{{Key: "pause", Value: 1}}, 13, "Unauthorized", "not authorized"},
		{"unknown command", loopback, bson.D{{Key: "dropDatabase", Value: 1}}, 59, "CommandNotFound",
			`no such admin command "dropDatabase"; valid commands: showPools, showStats, showClients, showServers, showConfig, pause, resume, reconnect, reload, shutdown`},
		{"route not a string", loopback, bson.D{{Key: "pause", Value: 1}, {Key: "route", Value: 3}}, 2, "BadValue", "route must be a string, not 32-bit integer"},
		{"route null", loopback, bson.D{{Key: "resume", Value: 1}, {Key: "route", Value: nil}}, 2, "BadValue", "route must be a string"},
		{"unknown route", loopback, bson.D{{Key: "reconnect", Value: 1}, {Key: "route", Value: "nope"}}, 2, "BadValue", `unknown route "nope"`},
		{"route on a show", loopback, bson.D{{Key: "showPools", Value: 1}, {Key: "route", Value: "orders"}}, 2, "BadValue", "showPools takes no route argument"},
		{"reload fails", loopback, bson.D{{Key: "reload", Value: 1}}, 96, "OperationFailed", "mongobouncer.toml:7: max_pool_size"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantErr(t, run(t, h, tc.peer, tc.cmd), tc.code, tc.codeName, tc.msg)
		})
	}
	if calls := f.Calls(); len(calls) != 0 {
		t.Fatalf("refused commands reached the controller: %q", calls)
	}
}

func TestControllerChoosesCode(t *testing.T) {
	f := newFake()
	f.reload = &Error{Code: CodeBadValue, Msg: "nothing to reload: started without a file"}
	wantErr(t, run(t, newTestHandler(f), loopback, bson.D{{Key: "reload", Value: 1}}), 2, "BadValue", "nothing to reload")
}

func TestUnixPeerAllowed(t *testing.T) {
	reply := run(t, newTestHandler(newFake()), &net.UnixAddr{Name: "/tmp/mb.sock", Net: "unix"}, bson.D{{Key: "showPools", Value: 1}})
	wantOK(t, reply)
}

func TestMalformedBodies(t *testing.T) {
	h := newTestHandler(newFake())
	for _, body := range []bsoncore.Document{
		nil,
		{5, 0, 0, 0, 0}, // {}
		{5, 0, 0, 0},
		{0xff, 0xff, 0xff, 0x7f, 0x10},
		{12, 0, 0, 0, 0x10, 'a', 0, 1, 0, 0, 0}, // missing terminator
	} {
		reply := h.HandleAdmin(loopback, body)
		if err := reply.Validate(); err != nil {
			t.Fatalf("%x: reply invalid: %v", body, err)
		}
		if reply.Lookup("ok").Double() != 0 || reply.Lookup("code").Int32() != CodeBadValue {
			t.Fatalf("%x: got %v, want BadValue", body, reply)
		}
	}
}

func FuzzHandleAdmin(f *testing.F) {
	for _, d := range []bson.D{
		{{Key: "showPools", Value: 1}},
		{{Key: "pause", Value: 1}, {Key: "route", Value: "orders"}},
		{{Key: "resume", Value: 1}, {Key: "route", Value: bson.D{{Key: "x", Value: 1}}}},
		{{Key: "showConfig", Value: 1}},
	} {
		b, _ := bson.Marshal(d)
		f.Add(b)
	}
	h := newTestHandler(newFake())
	f.Fuzz(func(t *testing.T, body []byte) {
		reply := h.HandleAdmin(loopback, body)
		if err := reply.Validate(); err != nil {
			t.Fatalf("invalid reply %x: %v", []byte(reply), err)
		}
		if _, err := reply.LookupErr("ok"); err != nil {
			t.Fatalf("reply without ok: %v", reply)
		}
	})
}

func BenchmarkHandleAdminShowPools(b *testing.B) {
	h := newTestHandler(newFake())
	body := cmdDoc(b, bson.D{{Key: "showPools", Value: 1}})
	b.ReportAllocs()
	for b.Loop() {
		h.HandleAdmin(loopback, body)
	}
}
