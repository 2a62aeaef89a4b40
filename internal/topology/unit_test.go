package topology

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/sdam"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

func TestOptionsValidation(t *testing.T) {
	base := func() Options {
		o := testOptions(&recorder{}, "127.0.0.1:27017")
		o.HeartbeatInterval, o.MinHeartbeatInterval, o.HeartbeatTimeout = 0, 0, 0
		o.ServerSelectionTimeout, o.LocalThreshold, o.Logger = 0, 0, nil
		return o
	}
	d, err := base().withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if d.HeartbeatInterval != DefaultHeartbeatInterval || d.MinHeartbeatInterval != DefaultMinHeartbeatInterval ||
		d.HeartbeatTimeout != DefaultHeartbeatTimeout || d.ServerSelectionTimeout != DefaultServerSelectionTimeout ||
		d.LocalThreshold != DefaultLocalThreshold || d.Selection != SelectLeastBusy || d.Logger == nil {
		t.Errorf("defaults not applied: %+v", d)
	}

	norm := base()
	norm.Hosts = []string{" MongoS1.Example ", "mongos2:27018", "/tmp/mongodb-27017.sock", "%2Ftmp%2Fother.sock", "[::1]:27019"}
	n, err := norm.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"mongos1.example:27017", "mongos2:27018", "/tmp/mongodb-27017.sock", "/tmp/other.sock", "[::1]:27019"}
	if strings.Join(n.Hosts, ",") != strings.Join(want, ",") {
		t.Errorf("normalized hosts %q, want %q", n.Hosts, want)
	}

	bad := map[string]func(*Options){
		"no hosts":           func(o *Options) { o.Hosts = nil },
		"empty host":         func(o *Options) { o.Hosts = []string{" "} },
		"duplicate":          func(o *Options) { o.Hosts = []string{"a:27017", "A"} },
		"bad port":           func(o *Options) { o.Hosts = []string{"a:"} },
		"no dialer":          func(o *Options) { o.Dialer = nil },
		"no monitor dialer":  func(o *Options) { o.MonitorDialer = nil },
		"heartbeat too fast": func(o *Options) { o.HeartbeatInterval = 100 * time.Millisecond },
		"negative timeout":   func(o *Options) { o.HeartbeatTimeout = -1 },
		"unknown selection":  func(o *Options) { o.Selection = "random" },
	}
	for name, mod := range bad {
		o := base()
		mod(&o)
		if _, err := New(name, o); err == nil {
			t.Errorf("%s: New accepted %+v", name, o)
		}
	}
	o := base()
	o.Pool.MaxConnecting = 0
	if _, err := New("bad pool", o); !errors.Is(err, pool.ErrInvalidOptions) {
		t.Errorf("invalid pool options: %v", err)
	}
}

func TestNames(t *testing.T) {
	if KindRSSecondary.String() != "RSSecondary" || Kind(99).String() != "ServerType(99)" ||
		Usable.String() != "Usable" || Unknown.String() != "Unknown" || ServerState(7).String() != "ServerState(7)" ||
		ServerChanged.String() != "ServerChanged" || EventType(9).String() != "EventType(9)" {
		t.Error("String methods")
	}
}

func TestStateChangeCodes(t *testing.T) {
	for _, c := range []int32{10107, 13435, 11600, 11602, 13436, 189, 91} {
		if !IsStateChangeCode(c) {
			t.Errorf("%d is a state-change code", c)
		}
	}
	for _, c := range []int32{0, 6, 89, 9001, 11000, 262} {
		if IsStateChangeCode(c) {
			t.Errorf("%d is not a state-change code", c)
		}
	}
}

// Which servers take writes, by topology type: the primary of a replica
// set, every mongos, a load balancer, and any data-bearing server of a
// Single topology (directConnection).
func TestWritablePolicy(t *testing.T) {
	want := map[sdam.TopologyType][]sdam.ServerType{
		sdam.Single:                {sdam.Standalone, sdam.Mongos, sdam.RSPrimary, sdam.RSSecondary, sdam.LoadBalancer},
		sdam.ReplicaSetWithPrimary: {sdam.RSPrimary},
		sdam.ReplicaSetNoPrimary:   nil,
		sdam.Sharded:               {sdam.Mongos},
		sdam.LoadBalanced:          {sdam.LoadBalancer},
		sdam.TopologyUnknown:       nil,
	}
	for tt, yes := range want {
		for st := sdam.Unknown; st <= sdam.LoadBalancer; st++ {
			if got := writable(tt, st); got != slices.Contains(yes, st) {
				t.Errorf("writable(%v, %v) = %v", tt, st, got)
			}
		}
	}
}

// nopConnector is never called: the pools in these tests are never readied.
type nopConnector struct{}

func (nopConnector) Connect(context.Context, string, int64) (pool.Upstream, error) {
	return nil, errors.New("not used")
}

// manualTopology builds selectable servers with the given RTTs without
// monitors, for exercising pick.
func manualTopology(t *testing.T, selection string, threshold time.Duration, rtts ...time.Duration) (*Topology, []*Server) {
	t.Helper()
	topo := &Topology{opts: Options{Selection: selection, LocalThreshold: threshold}}
	var servers []*Server
	for i, rtt := range rtts {
		s := newServer(topo, "h"+string(rune('a'+i))+":1")
		p, err := pool.New(s.addr, nopConnector{}, pool.DefaultOptions())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		s.pool = p
		s.rtt.Store(int64(rtt))
		servers = append(servers, s)
	}
	return topo, servers
}

func TestPickLatencyWindow(t *testing.T) {
	ms := time.Millisecond
	for _, sel := range []string{SelectLeastBusy, SelectRoundRobin} {
		topo, servers := manualTopology(t, sel, 15*ms, 2*ms, 40*ms, 16*ms, 18*ms)
		counts := map[string]int{}
		for range 300 {
			counts[topo.pick(servers).addr]++
		}
		// ha (2ms) and hc (16ms) are within 15ms of the fastest; hb (40ms)
		// and hd (18ms) are not.
		if counts["hb:1"] != 0 || counts["hd:1"] != 0 || counts["ha:1"] == 0 || counts["hc:1"] == 0 {
			t.Errorf("%s: picks %v, want only ha and hc", sel, counts)
		}
		// Without the window every server takes a turn.
		topo.opts.LocalThreshold = -1
		clear(counts)
		for range 400 {
			counts[topo.pick(servers).addr]++
		}
		for _, a := range []string{"ha:1", "hb:1", "hc:1", "hd:1"} {
			if counts[a] != 100 {
				t.Errorf("%s without window: picks %v, want 100 each", sel, counts)
				break
			}
		}
	}
	if got := (&Topology{}).pick(nil); got != nil {
		t.Errorf("pick(nil) = %v", got)
	}
}

func TestSelectionErrorMessage(t *testing.T) {
	e := &SelectionError{Topology: "r", Waited: 1500 * time.Millisecond, Err: ErrSelectionTimeout, Servers: []ServerStatus{
		{Address: "a:1", State: Unknown, Err: errors.New("connection refused")},
		{Address: "b:1", State: Usable, Kind: KindRSSecondary},
	}}
	want := `no usable server for "r" after 1.5s: server selection timed out: a:1 is Unknown (connection refused); b:1 is Usable RSSecondary (not selectable)`
	if e.Error() != want {
		t.Errorf("got  %s\nwant %s", e.Error(), want)
	}
}

// TestSelectServerNoAlloc pins the hot path's zero allocations.
func TestSelectServerNoAlloc(t *testing.T) {
	single := fakemongo.Start(t, fakemongo.Options{})
	m1 := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos})
	m2 := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos})
	for name, o := range map[string]Options{
		"single":     testOptions(&recorder{}, single.Addr()),
		"least-busy": testOptions(&recorder{}, m1.Addr(), m2.Addr()),
		"round-robin": func() Options {
			o := testOptions(&recorder{}, m1.Addr(), m2.Addr())
			o.Selection = SelectRoundRobin
			return o
		}(),
	} {
		o.OnEvent, o.Pool.Monitor = nil, nil
		topo := newTopology(t, o)
		waitAllUsable(t, topo)
		ctx := context.Background()
		allocs := testing.AllocsPerRun(1000, func() {
			if _, err := topo.SelectServer(ctx, Criteria{}); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Errorf("%s: SelectServer allocates %.1f times per call", name, allocs)
		}
	}
}

func BenchmarkSelectServer(b *testing.B) {
	single := fakemongo.Start(b, fakemongo.Options{})
	var mongos []string
	for range 3 {
		mongos = append(mongos, fakemongo.Start(b, fakemongo.Options{Kind: fakemongo.Mongos}).Addr())
	}
	cases := []struct {
		name  string
		hosts []string
		sel   string
	}{
		{"single", []string{single.Addr()}, ""},
		{"3mongos-least-busy", mongos, SelectLeastBusy},
		{"3mongos-round-robin", mongos, SelectRoundRobin},
	}
	for _, c := range cases {
		o := testOptions(&recorder{}, c.hosts...)
		o.OnEvent, o.Pool.Monitor, o.Selection = nil, nil, c.sel
		o.HeartbeatInterval = time.Second
		topo, err := New(c.name, o)
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		if _, err := topo.SelectServer(ctxTimeout(b, 10*time.Second), Criteria{}); err != nil {
			b.Fatal(err)
		}
		eventually(b, "all usable", func() bool { return len(topo.sel.Load().writable) == len(c.hosts) })
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := topo.SelectServer(ctx, Criteria{}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(c.name+"-parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := topo.SelectServer(ctx, Criteria{}); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
		topo.Close()
	}
}

func TestParseHello(t *testing.T) {
	oid := bson.ObjectID{1, 2, 3}
	raw := fakemongo.Doc(map[string]any{
		"ok": 1.0, "isWritablePrimary": true, "msg": "isdbgrid",
		"maxWireVersion": int64(25), "minWireVersion": 0.0, "maxBsonObjectSize": int32(16777216),
		"maxMessageSizeBytes": int32(48000000), "maxWriteBatchSize": int32(100000),
		"logicalSessionTimeoutMinutes": int32(30), "connectionId": int32(7),
		"topologyVersion": map[string]any{"processId": oid, "counter": int64(3)},
	})
	hs := &upstream.Hello{Compression: []string{"zstd"}, ServiceID: oid, HasServiceID: true}
	h, err := parseHello(raw, hs)
	if err != nil {
		t.Fatal(err)
	}
	if !h.IsWritablePrimary || h.Msg != "isdbgrid" || h.MaxWireVersion != 25 || h.MaxBSONObjectSize != 16777216 ||
		h.MaxMessageSizeBytes != 48000000 || h.MaxWriteBatchSize != 100000 || h.LogicalSessionTimeoutMinutes == nil ||
		*h.LogicalSessionTimeoutMinutes != 30 || h.ConnectionID != 7 || h.TopologyVersion == nil || h.TopologyVersion.Counter != 3 {
		t.Errorf("parsed %+v", h)
	}
	if len(h.Compression) != 1 || !h.HasServiceID || h.ServiceID != oid {
		t.Errorf("handshake fields not carried over: %+v", h)
	}
	legacy, err := parseHello(fakemongo.Doc(map[string]any{"ismaster": true}), nil)
	if err != nil || !legacy.IsWritablePrimary || legacy.LogicalSessionTimeoutMinutes != nil {
		t.Errorf("legacy reply: %+v, %v", legacy, err)
	}
	if _, err := parseHello(fakemongo.Doc(map[string]any{"maxWireVersion": "25"}), nil); err == nil {
		t.Error("a string maxWireVersion was accepted")
	}
}
