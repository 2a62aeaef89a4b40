package topology

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/logbuf"
)

// badUpstream runs a topology of o, logging to a buffer, for several
// heartbeats (o's interval is 100ms), and returns the selection error and
// the log.
func badUpstream(t *testing.T, o Options) (*Topology, error, string) {
	t.Helper()
	var buf logbuf.Buffer
	o.Logger = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	o.ServerSelectionTimeout = 600 * time.Millisecond
	topo := newTopology(t, o)
	_, err := topo.SelectServer(context.Background(), Criteria{})
	if err == nil {
		t.Fatal("a server was selected")
	}
	if !errors.Is(err, ErrSelectionTimeout) {
		t.Fatalf("SelectServer = %v, want a selection timeout", err)
	}
	return topo, err, buf.String()
}

func count(log, s string) int { return strings.Count(log, s) }

// Each kind of bad upstream is handled as SDAM says, named in the
// selection error, logged once, and leaves the topology working (it closes
// cleanly, and selection answers at once with the reason).
func TestBadUpstreams(t *testing.T) {
	t.Run("standalone seed of a replica set", func(t *testing.T) {
		fake := fakemongo.Start(t, fakemongo.Options{})
		o := testOptions(&recorder{}, fake.Addr())
		o.ReplicaSet = "rs0"
		topo, err, log := badUpstream(t, o)
		if !strings.Contains(err.Error(), fake.Addr()+" was removed: it is a Standalone") {
			t.Errorf("error %q does not say why", err)
		}
		if n := count(log, "server removed from the topology"); n != 1 {
			t.Errorf("logged %d times:\n%s", n, log)
		}
		if len(topo.Servers()) != 0 {
			t.Errorf("servers %v", topo.Servers())
		}
	})
	t.Run("member of another set", func(t *testing.T) {
		fake := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.ReplicaSetMember, SetName: "rs1"})
		o := testOptions(&recorder{}, fake.Addr())
		o.ReplicaSet = "rs0"
		_, err, log := badUpstream(t, o)
		if !strings.Contains(err.Error(), `it is a member of replica set "rs1", not "rs0"`) {
			t.Errorf("error %q does not say why", err)
		}
		if n := count(log, "server removed from the topology"); n != 1 {
			t.Errorf("logged %d times:\n%s", n, log)
		}
	})
	t.Run("me differs from its address", func(t *testing.T) {
		fake := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.ReplicaSetMember, SetName: "rs0", Secondary: true,
			HelloExtra: bson.D{{Key: "me", Value: "elsewhere:27017"}}})
		o := testOptions(&recorder{}, fake.Addr())
		o.ReplicaSet = "rs0"
		_, err, log := badUpstream(t, o)
		if !strings.Contains(err.Error(), `it calls itself "elsewhere:27017"`) {
			t.Errorf("error %q does not say why", err)
		}
		if n := count(log, "server removed from the topology"); n != 1 {
			t.Errorf("logged %d times:\n%s", n, log)
		}
	})
	for _, v := range [][2]int32{{0, 7}, {99, 100}} {
		t.Run(fmt.Sprintf("incompatible wire versions %d-%d", v[0], v[1]), func(t *testing.T) {
			fake := fakemongo.Start(t, fakemongo.Options{MinWireVersion: v[0], MaxWireVersion: v[1]})
			_, err, log := badUpstream(t, testOptions(&recorder{}, fake.Addr()))
			if !strings.Contains(err.Error(), "wire version") {
				t.Errorf("error %q does not name the wire versions", err)
			}
			if n := count(log, "topology is incompatible"); n != 1 {
				t.Errorf("logged %d times:\n%s", n, log)
			}
		})
	}
	t.Run("server too old to speak OP_MSG", func(t *testing.T) {
		fake := fakemongo.Start(t, fakemongo.Options{MinWireVersion: 0, MaxWireVersion: 2})
		_, err, log := badUpstream(t, testOptions(&recorder{}, fake.Addr()))
		if !strings.Contains(err.Error(), "server too old") {
			t.Errorf("error %q does not say why", err)
		}
		if n := count(log, "server check failed"); n != 1 {
			t.Errorf("logged %d times:\n%s", n, log)
		}
	})
	t.Run("malformed hello", func(t *testing.T) {
		fake := fakemongo.Start(t, fakemongo.Options{Kind: fakemongo.ReplicaSetMember, SetName: "rs0",
			HelloExtra: bson.D{{Key: "setVersion", Value: "seven"}}})
		topo, err, log := badUpstream(t, testOptions(&recorder{}, fake.Addr()))
		if !strings.Contains(err.Error(), "setVersion") {
			t.Errorf("error %q does not name the bad field", err)
		}
		if n := count(log, "server check failed") + count(log, "topology changed"); n > 1 {
			t.Errorf("logged %d times over several checks:\n%s", n, log)
		}
		if s := topo.Servers(); len(s) != 1 || s[0].State() != Unknown {
			t.Errorf("servers %v", s)
		}
	})
}
