package topology

import (
	"context"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/srv"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// srvTable is a resolver whose SRV records a test changes while the
// topology polls them.
type srvTable struct {
	mu      sync.Mutex
	targets []*net.SRV
}

func (s *srvTable) set(targets ...*net.SRV) {
	s.mu.Lock()
	s.targets = targets
	s.mu.Unlock()
}

func (s *srvTable) LookupSRV(_ context.Context, _, _, name string) (string, []*net.SRV, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return name, slices.Clone(s.targets), nil
}

func (s *srvTable) LookupTXT(_ context.Context, name string) ([]string, error) {
	return nil, &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
}

// loopbackDial sends every name to 127.0.0.1, keeping the port: the SRV
// targets of the test are names in the SRV host's domain.
func loopbackDial(ctx context.Context, network, addr string) (net.Conn, error) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	return d.DialContext(ctx, network, net.JoinHostPort("127.0.0.1", port))
}

func target(name string, f *fakemongo.Server) *net.SRV {
	_, port, _ := net.SplitHostPort(f.Addr())
	p, _ := strconv.Atoi(port)
	return &net.SRV{Target: name + ".db.test.", Port: uint16(p)}
}

// A mongos list from mongodb+srv:// follows its SRV records: a router
// added to DNS gets a server, pool and monitor; one removed is closed.
func TestSRVPollingFollowsTheRecords(t *testing.T) {
	m1 := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos})
	m2 := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.Mongos})
	table := &srvTable{}
	table.set(target("a", m1))
	o := testOptions(&recorder{}, "a.db.test:"+portOf(m1))
	o.Dialer = upstream.NewDialer(upstream.Options{AppName: poolApp, Dial: loopbackDial, Logger: testLogger()})
	o.MonitorDialer = upstream.NewDialer(upstream.Options{AppName: monitorApp, Dial: loopbackDial, Logger: testLogger()})
	o.SRV = &SRVPolling{Host: "cluster.db.test", Resolver: table, Interval: 20 * time.Millisecond}
	topo := newTopology(t, o)
	if s := mustSelect(t, topo); s.Address() != "a.db.test:"+portOf(m1) {
		t.Fatalf("selected %s", s.Address())
	}
	addrs := func() []string {
		var out []string
		for _, s := range topo.Servers() {
			out = append(out, s.Address())
		}
		return out
	}
	table.set(target("a", m1), target("b", m2))
	eventually(t, "b added", func() bool { return len(topo.WritableServers()) == 2 })
	table.set(target("b", m2))
	eventually(t, "a removed", func() bool {
		return slices.Equal(addrs(), []string{"b.db.test:" + portOf(m2)})
	})
	if s := mustSelect(t, topo); s.Address() != "b.db.test:"+portOf(m2) {
		t.Errorf("selected %s after a left", s.Address())
	}
	// An answer with no valid target keeps the list.
	table.set(&net.SRV{Target: "evil.example.com.", Port: 1})
	time.Sleep(100 * time.Millisecond) // several rescans; nothing may change
	if got := addrs(); !slices.Equal(got, []string{"b.db.test:" + portOf(m2)}) {
		t.Errorf("servers %v after an answer with no valid target", got)
	}
}

func portOf(f *fakemongo.Server) string {
	_, port, _ := net.SplitHostPort(f.Addr())
	return port
}

var _ srv.Resolver = (*srvTable)(nil)
