package topology

import (
	"testing"

	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// Checked turns true once the first check has ended, whatever its outcome:
// with a hello, with an error, and with an error behind a load balancer,
// where nothing else records a failed check.
func TestCheckedAfterFirstCheck(t *testing.T) {
	fake := fakemongo.Start(t, fakemongo.Options{})
	rec := &recorder{}
	ok := newTopology(t, testOptions(rec, fake.Addr())).Servers()[0]
	eventually(t, "the reachable server checked", ok.Checked)
	if ok.Hello() == nil {
		t.Error("checked with no hello from a reachable server")
	}

	dead := newTopology(t, testOptions(rec, deadAddr(t))).Servers()[0]
	eventually(t, "the unreachable server checked", dead.Checked)
	if dead.Description().LastError == nil {
		t.Error("checked with no error from an unreachable server")
	}

	o := testOptions(rec, deadAddr(t))
	o.Pool.LoadBalanced = true
	o.Dialer = upstream.NewDialer(upstream.Options{AppName: poolApp, LoadBalanced: true, Logger: testLogger()})
	o.MonitorDialer = upstream.NewDialer(upstream.Options{AppName: monitorApp, LoadBalanced: true, Logger: testLogger()})
	lb := newTopology(t, o).Servers()[0]
	eventually(t, "the unreachable load balancer checked", lb.Checked)
	if lb.Hello() != nil {
		t.Error("a hello from an unreachable load balancer")
	}
}
