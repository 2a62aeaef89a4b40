package proxy

// The exchange's failure exit clears a pool for network errors only.

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/wait"
	"github.com/mongobouncer/mongobouncer/internal/topology"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// The failure exit closes the connection in every case, but only a failure
// of the network tells the server (which clears its pool): a reply that
// breaks the protocol condemns its connection alone, and a quirky upstream
// does not cost every other client its connection.
func TestFailureExitClearsThePoolOnlyForNetworkErrors(t *testing.T) {
	r := newLoopRig(t, LoopIOEpoll, 2, func(*fakemongo.Request) fakemongo.Reply { return fakemongo.OK() })
	r.client(0)
	c := r.only()
	// The goroutine that served the hello owns the client until it parks
	// it in the loop; only then may the test act as the owner.
	r.waitState(c, lsIdle)
	srv := r.route.Topology.Servers()[0]
	for _, tc := range []struct {
		name  string
		err   error
		clear bool
	}{
		{"reply to another request", fmt.Errorf("%w: test", errUpstreamProtocol), false},
		{"bad fence", &upstream.NetworkError{Addr: srv.Address(), Op: "read", Err: fmt.Errorf("%w: test", upstream.ErrBadReply)}, false},
		{"network", &upstream.NetworkError{Addr: srv.Address(), Op: "read", Err: io.EOF}, true},
	} {
		gen := srv.Pool().Stats().Generation
		c.lc.Mu.Lock() // act as the client's owner
		x := &c.x
		x.begin(r.route, nil, 0, 1)
		x.srv = srv
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		pc, err := srv.Pool().CheckOut(ctx)
		cancel()
		if retry, err := x.checkedOut(pc, err); retry || err != nil {
			c.lc.Mu.Unlock()
			t.Fatalf("%s: checkout: %v (a pool cleared by an earlier case?)", tc.name, err)
		}
		x.fail(tc.err)
		x.end()
		c.lc.Mu.Unlock()
		cleared := srv.Pool().Stats().Generation != gen
		if cleared != tc.clear {
			t.Errorf("%s: pool cleared %v, want %v", tc.name, cleared, tc.clear)
		}
		if !tc.clear && srv.State() != topology.Usable {
			t.Errorf("%s: server %v, want still usable", tc.name, srv.State())
		}
		if tc.clear {
			wait.Until(t, "pool ready again", 10*time.Second, 5*time.Millisecond, func() bool {
				return srv.State() == topology.Usable && srv.Pool().Stats().State == pool.StateReady
			})
		}
	}
}
