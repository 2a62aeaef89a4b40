package app

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/srv"
	"github.com/mongobouncer/mongobouncer/internal/testutil/logbuf"
)

func TestAdminListenWithoutHostIsLoopback(t *testing.T) {
	cfg := config.Default()
	cfg.Global.Listen = "127.0.0.1:0"
	cfg.Global.AdminListen = ":0"
	cfg.Databases = map[string]config.Route{"*": {ConnectionString: "mongodb://127.0.0.1:1/"}}
	a, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		a.Close(ctx)
	}()
	host := a.AdminAddr().String()
	if host[:len("127.0.0.1:")] != "127.0.0.1:" {
		t.Fatalf("admin listener bound to %s, want loopback", host)
	}
}

// A listen address in use fails New before any route is built, so no
// upstream is dialled or monitored for a process that cannot serve.
func TestListenInUseFailsBeforeRoutes(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	var logs logbuf.Buffer
	cfg := config.Default()
	cfg.Global.Listen = busy.Addr().String()
	cfg.Databases = map[string]config.Route{"*": {ConnectionString: "mongodb://127.0.0.1:1/"}}
	_, err = New(cfg, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	var le *ListenError
	if !errors.As(err, &le) {
		t.Fatalf("New: %v, want a *ListenError", err)
	}
	if strings.Contains(logs.String(), "route configured") || strings.Contains(logs.String(), "127.0.0.1:1") {
		t.Fatalf("a route was built before the listen error:\n%s", logs.String())
	}
}

// When a route cannot be built, New releases the listeners it had bound.
func TestRouteErrorReleasesListeners(t *testing.T) {
	addrs := make([]string, 2)
	for i := range addrs {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addrs[i] = l.Addr().String()
		l.Close()
	}
	cfg := config.Default()
	cfg.Global.Listen = addrs[0]
	cfg.Global.AdminListen = addrs[1]
	cfg.Databases = map[string]config.Route{"*": {ConnectionString: "mongodb://user:secret@127.0.0.1:1/?authMechanism=PLAIN"}}
	if _, err := New(cfg, nil); err == nil || !strings.Contains(err.Error(), "authentication") {
		t.Fatalf("New: %v, want the upstream authentication error", err)
	}
	for _, addr := range addrs {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("%s still bound after the failed New: %v", addr, err)
		}
		l.Close()
	}
}

// fakeResolver answers SRV and TXT lookups from fixed records, so a test
// resolves mongodb+srv:// without DNS.
type fakeResolver struct {
	srv []*net.SRV
	txt []string
}

func (f fakeResolver) LookupSRV(_ context.Context, service, proto, name string) (string, []*net.SRV, error) {
	if len(f.srv) == 0 {
		return "", nil, &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
	}
	return name, f.srv, nil
}

func (f fakeResolver) LookupTXT(_ context.Context, name string) ([]string, error) {
	if f.txt == nil {
		return nil, &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
	}
	return f.txt, nil
}

// A mongodb+srv:// route whose records cannot be found is refused at New
// with an error naming the host; the string's warnings are logged with
// their file position first, without the password.
func TestSRVRouteUnresolvedAndWarningsLogged(t *testing.T) {
	var logs logbuf.Buffer
	cfg := config.Default()
	cfg.Global.Listen = "127.0.0.1:0"
	cfg.Path = "t.toml"
	cfg.Databases = map[string]config.Route{"*": {ConnectionString: "mongodb+srv://u:Hunter2Zz@cluster.example.net/?maxPoolSize=x"}}
	_, err := NewWithOptions(cfg, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Resolver: fakeResolver{}})
	if !errors.Is(err, srv.ErrNoRecords) || !strings.Contains(err.Error(), "cluster.example.net") {
		t.Fatalf("New: %v, want ErrNoRecords naming the host", err)
	}
	if !strings.Contains(logs.String(), `maxPoolSize=\"x\" ignored`) || strings.Contains(logs.String(), "Hunter2Zz") {
		t.Fatalf("warning not logged, or with the password:\n%s", logs.String())
	}
}

// resolveSRV takes the hosts from the SRV records and the replica set from
// the TXT record unless the string names one; a TXT loadBalanced=true is
// refused while load balancers are not supported.
func TestResolveSRV(t *testing.T) {
	r := fakeResolver{
		srv: []*net.SRV{{Target: "B.cluster.example.net.", Port: 27018}, {Target: "a.cluster.example.net.", Port: 27017}},
		txt: []string{"replicaSet=rs0&authSource=admin"},
	}
	cs, err := config.ParseConnString("mongodb+srv://cluster.example.net/")
	if err != nil {
		t.Fatal(err)
	}
	got, poll, err := resolveSRV(cs, r)
	if err != nil {
		t.Fatal(err)
	}
	var hosts []string
	for _, h := range got.Hosts {
		hosts = append(hosts, h.Address)
	}
	if want := []string{"a.cluster.example.net:27017", "b.cluster.example.net:27018"}; !slices.Equal(hosts, want) {
		t.Errorf("hosts %v, want %v", hosts, want)
	}
	if got.ReplicaSet != "rs0" || poll == nil || poll.Host != "cluster.example.net" {
		t.Errorf("replicaSet %q, polling %+v", got.ReplicaSet, poll)
	}
	if got.AuthSource != "admin" {
		t.Errorf("authSource %q, want the TXT record's", got.AuthSource)
	}
	cs2, _ := config.ParseConnString("mongodb+srv://cluster.example.net/?replicaSet=mine")
	if got, _, err := resolveSRV(cs2, r); err != nil || got.ReplicaSet != "mine" {
		t.Errorf("the string's replicaSet lost to the TXT record: %q, %v", got.ReplicaSet, err)
	}
	cs3, _ := config.ParseConnString("mongodb+srv://cluster.example.net/?authSource=mine")
	if got, _, err := resolveSRV(cs3, r); err != nil || got.AuthSource != "mine" {
		t.Errorf("the string's authSource lost to the TXT record: %q, %v", got.AuthSource, err)
	}
	r.txt = []string{"loadBalanced=true"}
	if _, _, err := resolveSRV(cs, r); err == nil || !strings.Contains(err.Error(), "loadBalanced") {
		t.Errorf("TXT loadBalanced=true: %v", err)
	}
}

// The pools log the CMAP messages whenever the logger's level allows, also
// when it was raised to debug after they were created (a reload).
func TestPoolLogsFollowTheLevel(t *testing.T) {
	var logs logbuf.Buffer
	level := new(slog.LevelVar)
	level.Set(slog.LevelInfo)
	cfg := config.Default()
	cfg.Global.Listen = "127.0.0.1:0"
	cfg.Databases = map[string]config.Route{"*": {ConnectionString: "mongodb://127.0.0.1:1/"}}
	a, err := NewWithOptions(cfg, Options{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: level})), Level: level})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), "Connection pool created") {
		t.Fatalf("CMAP debug message at info level:\n%s", logs.String())
	}
	level.Set(slog.LevelDebug)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a.Close(ctx)
	if !strings.Contains(logs.String(), `msg="Connection pool closed" route=* component=connection`) {
		t.Fatalf("no CMAP message after the level went to debug:\n%s", logs.String())
	}
}

func TestKeepRunningWarnsAndRestores(t *testing.T) {
	var logs logbuf.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	file := "127.0.0.1:9300"
	keepRunning(log, "admin_listen", &file, "127.0.0.1:9216")
	if file != "127.0.0.1:9216" || !strings.Contains(logs.String(), `msg="reload: admin_listen changes need a restart" running=127.0.0.1:9216 file=127.0.0.1:9300`) {
		t.Fatalf("file %q, log %q", file, logs.String())
	}
	same := true
	keepRunning(log, "event_loop", &same, true)
	if strings.Count(logs.String(), "need a restart") != 1 {
		t.Fatalf("warned for an unchanged setting: %q", logs.String())
	}
}

// The admin listener has the admin package's bounds, so slow or idle HTTP
// clients cannot hold its connections.
func TestAdminHTTPServerIsBounded(t *testing.T) {
	cfg := config.Default()
	cfg.Global.Listen = "127.0.0.1:0"
	cfg.Global.AdminListen = "127.0.0.1:0"
	cfg.Databases = map[string]config.Route{"*": {ConnectionString: "mongodb://127.0.0.1:1/"}}
	a, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeApp(a)
	s := a.adminHTTP
	if s.ReadHeaderTimeout <= 0 || s.ReadTimeout <= 0 || s.WriteTimeout <= 0 || s.IdleTimeout <= 0 || s.MaxHeaderBytes <= 0 {
		t.Fatalf("admin HTTP server unbounded: header %v read %v write %v idle %v max header %d",
			s.ReadHeaderTimeout, s.ReadTimeout, s.WriteTimeout, s.IdleTimeout, s.MaxHeaderBytes)
	}
}
