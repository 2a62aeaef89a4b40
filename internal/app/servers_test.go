package app

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/admin"
	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/wait"
	"github.com/mongobouncer/mongobouncer/internal/topology"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// routesApp builds and starts an App with the given routes (name to
// connection string) and waits for every server's first check. The
// heartbeat is long: after that check only RequestCheck changes a server.
func routesApp(t *testing.T, routes map[string]string) *App {
	t.Helper()
	cfg := config.Default()
	cfg.Global.Listen = "127.0.0.1:0"
	cfg.Global.AdminListen = "127.0.0.1:0"
	cfg.Global.HeartbeatInterval = time.Hour
	cfg.Databases = map[string]config.Route{}
	for name, uri := range routes {
		cfg.Databases[name] = config.Route{ConnectionString: config.URI(uri)}
	}
	a, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeApp(a) })
	a.Start()
	for _, topo := range a.Topologies() {
		for _, s := range topo.Servers() {
			wait.Until(t, "the first check of "+s.Address(), 10*time.Second, 5*time.Millisecond, s.Checked)
		}
	}
	return a
}

// deadAddr is a loopback address nothing listens on: dials are refused.
func deadAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func httpGet(t *testing.T, a *App, path string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + a.AdminAddr().String() + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// A route whose only member is a secondary cannot serve a primary read:
// /readyz answers 503 naming the route, the member and its role.
func TestReadyzSecondaryOnly(t *testing.T) {
	sec := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.ReplicaSetMember, SetName: "rs0", Secondary: true})
	a := routesApp(t, map[string]string{"*": "mongodb://" + sec.Addr() + "/?replicaSet=rs0"})
	srv := a.Topologies()[0].Servers()[0]
	if srv.State() != topology.Usable || srv.Kind() != topology.KindRSSecondary {
		t.Fatalf("precondition: the member is %v %v, want a usable secondary", srv.State(), srv.Kind())
	}
	want := fmt.Sprintf(`route "*": no primary: %s secondary`, srv.Address())
	if ok, why := a.Ready(); ok || len(why) != 1 || why[0] != want {
		t.Fatalf("Ready() = %v, %q; want not ready, %q", ok, why, want)
	}
	if code, body := httpGet(t, a, "/readyz"); code != http.StatusServiceUnavailable || body != want+"\n" {
		t.Fatalf("/readyz: %d %q, want 503 %q", code, body, want+"\n")
	}
}

// With a secondary and a member that refuses connections, the reason names
// both, the second with the root cause of its monitor's error.
func TestReadyzReasonNamesEveryMember(t *testing.T) {
	sec := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.ReplicaSetMember, SetName: "rs0", Secondary: true})
	dead := deadAddr(t)
	a := routesApp(t, map[string]string{"*": "mongodb://" + sec.Addr() + "," + dead + "/?replicaSet=rs0"})
	// Servers are listed by address, as the topology keeps them.
	parts := []string{sec.Addr() + " secondary", dead + " unknown (connection refused)"}
	if dead < sec.Addr() {
		parts[0], parts[1] = parts[1], parts[0]
	}
	want := `route "*": no primary: ` + strings.Join(parts, ", ")
	if ok, why := a.Ready(); ok || len(why) != 1 || why[0] != want {
		t.Fatalf("Ready() = %v, %q; want not ready, %q", ok, why, want)
	}
}

// A primary, a mongos and a standalone each make their route ready; the
// readiness of one route does not hide another's lack.
func TestReadyzPerRoute(t *testing.T) {
	prim := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.ReplicaSetMember, SetName: "rs0"})
	mongos := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos})
	standalone := fakemongo.Start(t, fakemongo.Options{})
	sec := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.ReplicaSetMember, SetName: "rs1", Secondary: true})
	a := routesApp(t, map[string]string{
		"orders":  "mongodb://" + prim.Addr() + "/?replicaSet=rs0",
		"sharded": "mongodb://" + mongos.Addr() + "/",
		"single":  standalone.URI(),
		"*":       "mongodb://" + sec.Addr() + "/?replicaSet=rs1",
	})
	ok, why := a.Ready()
	if ok || len(why) != 1 || !strings.HasPrefix(why[0], `route "*": no primary: `) {
		t.Fatalf("Ready() = %v, %q; want only the secondary's route not ready", ok, why)
	}
}

// showPools (and /admin/pools) give each member's role, RTT and last
// error; showServers gives each connection's server role.
func TestPoolsShowRoleRTTAndLastError(t *testing.T) {
	prim := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.ReplicaSetMember, SetName: "rs0"})
	sec := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.ReplicaSetMember, SetName: "rs1", Secondary: true})
	dead := deadAddr(t)
	a := routesApp(t, map[string]string{
		"orders": "mongodb://" + prim.Addr() + "/?replicaSet=rs0",
		"*":      "mongodb://" + sec.Addr() + "," + dead + "/?replicaSet=rs1",
	})
	type want struct {
		route, role string
		usable      bool
		lastError   string // a part of it; "" for none
	}
	wants := map[string]want{
		prim.Addr(): {"orders", admin.RolePrimary, true, ""},
		sec.Addr():  {"*", admin.RoleSecondary, true, ""},
		dead:        {"*", admin.RoleUnknown, false, "connection refused"},
	}
	check := func(via string, pools []admin.PoolInfo) {
		t.Helper()
		if len(pools) != len(wants) {
			t.Fatalf("%s: %d pools, want %d: %+v", via, len(pools), len(wants), pools)
		}
		for _, p := range pools {
			w, ok := wants[p.Server]
			if !ok || p.Route != w.route || p.Role != w.role || p.Usable != w.usable {
				t.Errorf("%s: pool %+v, want %+v", via, p, w)
				continue
			}
			if w.lastError == "" && p.LastError != "" || !strings.Contains(p.LastError, w.lastError) {
				t.Errorf("%s: %s lastError %q, want %q in it", via, p.Server, p.LastError, w.lastError)
			}
			// A reachable member has had one hello, so an RTT; the dead one
			// none.
			if (p.RTTMs > 0) != w.usable || p.RTTMs > 10_000 {
				t.Errorf("%s: %s rttMs %v", via, p.Server, p.RTTMs)
			}
		}
	}
	check("Pools", a.Pools())
	code, body := httpGet(t, a, "/admin/pools")
	var reply struct{ Pools []admin.PoolInfo }
	if err := json.Unmarshal([]byte(body), &reply); code != http.StatusOK || err != nil {
		t.Fatalf("/admin/pools: %d %v\n%s", code, err, body)
	}
	check("/admin/pools", reply.Pools)

	// One request through the proxy gives the primary a connection, which
	// showServers lists with the primary's role.
	ping(t, a, "orders")
	conns := a.Servers()
	if len(conns) == 0 {
		t.Fatal("no upstream connection after a request")
	}
	for _, c := range conns {
		if want := wants[c.Server].role; c.Role != want {
			t.Errorf("connection %d to %s: role %q, want %q", c.ID, c.Server, c.Role, want)
		}
	}
}

// The last error never shows the route's secrets, is one line and is
// bounded.
func TestErrorTextMasksSecrets(t *testing.T) {
	cs, err := config.ParseConnString("mongodb://app:s3cr%2Ft@127.0.0.1:1/?authMechanism=MONGODB-AWS&authMechanismProperties=AWS_SESSION_TOKEN:tok3n")
	if err != nil {
		t.Fatal(err)
	}
	if cs.Password != "s3cr/t" || cs.AuthMechanismProperties["AWS_SESSION_TOKEN"] != "tok3n" {
		t.Fatalf("precondition: parsed %q %v", cs.Password, cs.AuthMechanismProperties)
	}
	got := errorText(errors.New("auth failed for s3cr/t (s3cr%2Ft)\nsession tok3n"), cs)
	if want := "auth failed for xxxxx (xxxxx) session xxxxx"; got != want {
		t.Fatalf("errorText = %q, want %q", got, want)
	}
	if got := errorText(nil, cs); got != "" {
		t.Fatalf("errorText(nil) = %q", got)
	}
	long := errorText(errors.New(strings.Repeat("é", maxErrorText)), cs)
	if len(long) > maxErrorText+len("…") || !strings.HasSuffix(long, "…") || !strings.HasPrefix(long, "éé") {
		t.Fatalf("long error: %d bytes %q...", len(long), long[:16])
	}
}

// /metrics has one mongobouncer_server_info series per member, with its
// role, and its RTT; when the primary dies its series changes role (no
// "primary" series is left for it), and when its route is removed by a
// reload its series go.
func TestServerMetricsFollowRoles(t *testing.T) {
	prim := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.ReplicaSetMember, SetName: "rs0"})
	sec := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.ReplicaSetMember, SetName: "rs1", Secondary: true})
	a := routesApp(t, map[string]string{
		"orders": "mongodb://" + prim.Addr() + "/?replicaSet=rs0",
		"*":      "mongodb://" + sec.Addr() + "/?replicaSet=rs1",
	})
	infos := func() map[string]string { // "route|server" -> role
		t.Helper()
		out := map[string]string{}
		for _, m := range gather(t, a, "mongobouncer_server_info") {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if m.GetGauge().GetValue() != 1 {
				t.Errorf("server_info %v = %v, want 1", labels, m.GetGauge().GetValue())
			}
			key := labels["route"] + "|" + labels["server"]
			if _, dup := out[key]; dup {
				t.Errorf("two server_info series for %s", key)
			}
			out[key] = labels["role"]
		}
		return out
	}
	same := func(got, want map[string]string) bool {
		if len(got) != len(want) {
			return false
		}
		for k, v := range want {
			if got[k] != v {
				return false
			}
		}
		return true
	}
	want := map[string]string{"orders|" + prim.Addr(): "primary", "*|" + sec.Addr(): "secondary"}
	if got := infos(); !same(got, want) {
		t.Fatalf("server_info %v, want %v", got, want)
	}
	if rtts := gather(t, a, "mongobouncer_server_rtt_seconds"); len(rtts) != 2 {
		t.Fatalf("%d rtt series, want 2", len(rtts))
	} else {
		for _, m := range rtts {
			if v := m.GetGauge().GetValue(); v <= 0 || v > 10 {
				t.Errorf("rtt %v = %v s", m.GetLabel(), v)
			}
		}
	}

	// The primary dies: its next check fails, and it is unknown.
	prim.Kill()
	var primSrv *topology.Server
	for _, topo := range a.Topologies() {
		if s := topo.ServerByAddress(prim.Addr()); s != nil {
			primSrv = s
		}
	}
	wait.Until(t, "the primary to be marked unknown", 10*time.Second, 10*time.Millisecond, func() bool {
		primSrv.RequestCheck()
		return primSrv.State() == topology.Unknown
	})
	want["orders|"+prim.Addr()] = "unknown"
	if got := infos(); !same(got, want) {
		t.Fatalf("after the primary died: server_info %v, want %v", got, want)
	}

	// A reload that removes the route removes its series.
	a.mu.Lock()
	cfg := a.cfg
	a.mu.Unlock()
	cfg.Databases = map[string]config.Route{"*": cfg.Databases["*"]}
	routes, err := cfg.Routes()
	if err != nil {
		t.Fatal(err)
	}
	if err := a.apply(cfg, routes, nil); err != nil {
		t.Fatal(err)
	}
	delete(want, "orders|"+prim.Addr())
	if got := infos(); !same(got, want) {
		t.Fatalf("after the route was removed: server_info %v, want %v", got, want)
	}
}

// gather returns the series of one family from the app's registry.
func gather(t *testing.T, a *App, name string) []*dto.Metric {
	t.Helper()
	mfs, err := a.Metrics().Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()
		}
	}
	return nil
}

// ping sends one ping with $db db through the app's main listener and
// reads its reply.
func ping(t *testing.T, a *App, db string) {
	t.Helper()
	nc, err := net.DialTimeout("tcp", a.Addrs()[0].String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	body, err := bson.Marshal(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: db}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Write(wire.AppendMsg(nil, 1, 0, 0, body)); err != nil {
		t.Fatal(err)
	}
	if _, err := wire.ReadMessage(nc, nil, wire.DefaultMaxMessageSize); err != nil {
		t.Fatalf("ping on %s: %v", db, err)
	}
}

type emptyErr struct{}

func (emptyErr) Error() string { return "" }

// /readyz names an error by its innermost cause, unless that says nothing.
func TestRootCause(t *testing.T) {
	refused := fmt.Errorf("upstream: connect to h:1 (dial): %w",
		&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)})
	if got := rootCause(refused).Error(); got != "connection refused" {
		t.Errorf("rootCause = %q, want connection refused", got)
	}
	outer := fmt.Errorf("hello failed: %w", emptyErr{})
	if got := rootCause(outer); got != outer {
		t.Errorf("rootCause = %q, want the outer error", got)
	}
}
