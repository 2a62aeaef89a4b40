// The "topology changed" log line across a failover: one line for every
// change, saying from what to what, and no secret in any line.
package topology

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/sdam"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// logged is one captured log record, its attributes rendered as text.
type logged struct {
	level slog.Level
	msg   string
	attrs map[string]string
	text  string // the message and every attribute, for searching
}

// capture is a slog.Handler that keeps every record, at every level.
type capture struct {
	mu   *sync.Mutex
	recs *[]logged // guarded by mu
	pre  []slog.Attr
}

func newCapture() *capture { return &capture{mu: &sync.Mutex{}, recs: &[]logged{}} }

func (c *capture) Enabled(context.Context, slog.Level) bool { return true }

func (c *capture) Handle(_ context.Context, r slog.Record) error {
	l := logged{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	var b strings.Builder
	b.WriteString(r.Message)
	add := func(a slog.Attr) bool {
		v := a.Value.Resolve().String()
		l.attrs[a.Key] = v
		fmt.Fprintf(&b, " %s=%s", a.Key, v)
		return true
	}
	for _, a := range c.pre {
		add(a)
	}
	r.Attrs(add)
	l.text = b.String()
	c.mu.Lock()
	*c.recs = append(*c.recs, l)
	c.mu.Unlock()
	return nil
}

func (c *capture) WithAttrs(as []slog.Attr) slog.Handler {
	return &capture{mu: c.mu, recs: c.recs, pre: append(slices.Clip(c.pre), as...)}
}

func (c *capture) WithGroup(string) slog.Handler { return c }

// records returns the records with message msg, or all of them when msg
// is empty, in the order they were logged.
func (c *capture) records(msg string) []logged {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []logged
	for _, l := range *c.recs {
		if msg == "" || l.msg == msg {
			out = append(out, l)
		}
	}
	return out
}

// typeOf returns the topology type a summary starts with.
func typeOf(summary string) string {
	typ, _, _ := strings.Cut(summary, " ")
	return strings.TrimSuffix(typ, ":")
}

// A failover (stepdown, then the election of another member) moves the
// topology from ReplicaSetWithPrimary to ReplicaSetNoPrimary and back. The
// log must tell each change once, from what to what: the lines chain (each
// one starts where the previous one ended, from the seed list to the final
// description), none repeats or changes nothing, and the changes of type
// are at Info. The pools log in with a password that no line may carry.
func TestTopologyChangeLoggedOncePerChange(t *testing.T) {
	const secret = "s3cret-Pa55word"
	rs := fakemongo.StartReplicaSet(t, fakemongo.ReplicaSetOptions{
		ElectionDelay: 200 * time.Millisecond,
		Base:          fakemongo.Options{Users: []fakemongo.User{{Name: "app", Password: secret}}},
	})
	capt := newCapture()
	logger := slog.New(capt)
	o := rsOptions(&recorder{}, rs, 1)
	o.Logger = logger
	o.Pool.MinPoolSize = 1 // every member's pool logs in
	o.Dialer = upstream.NewDialer(upstream.Options{AppName: poolApp, ConnectTimeout: 2 * time.Second, Logger: logger,
		Authenticator: scramAs(t, "app", secret)})
	topo := newTopology(t, o)
	m0, m1, m2 := rs.Member(0).Addr(), rs.Member(1).Addr(), rs.Member(2).Addr()
	within(t, "three members usable", func() bool {
		r := roles(topo)
		return r[m0] == KindRSPrimary && r[m1] == KindRSSecondary && r[m2] == KindRSSecondary
	})
	eventually(t, "every pool logged in", func() bool {
		for _, m := range rs.Members() {
			in := false
			for _, u := range m.Server().AuthenticatedUsers() {
				in = in || u == "admin.app"
			}
			if !in {
				return false
			}
		}
		return true
	})
	idx, err := rs.Failover()
	if err != nil {
		t.Fatal(err)
	}
	np := rs.Member(idx).Addr()
	within(t, "the new primary known", func() bool {
		r := roles(topo)
		return len(r) == 3 && r[np] == KindRSPrimary && r[m0] == KindRSSecondary
	})
	final := summary(new(topo.Description()))
	within(t, "the last change logged", func() bool {
		lines := capt.records("topology changed")
		return len(lines) > 0 && lines[len(lines)-1].attrs["to"] == final
	})

	lines := capt.records("topology changed")
	var dump strings.Builder
	for _, l := range lines {
		fmt.Fprintf(&dump, "\n  %v from=%q to=%q", l.level, l.attrs["from"], l.attrs["to"])
	}
	prev := summary(new(sdam.NewTopology(topo.cfg)))
	types := []string{typeOf(prev)}
	for i, l := range lines {
		from, to := l.attrs["from"], l.attrs["to"]
		if l.attrs["topology"] != "test" {
			t.Errorf("line %d names topology %q", i, l.attrs["topology"])
		}
		if from != prev {
			t.Fatalf("line %d starts from %q, but the previous change ended at %q (a change logged twice or not at all):%s",
				i, from, prev, dump.String())
		}
		if from == to {
			t.Fatalf("line %d changes nothing:%s", i, dump.String())
		}
		if typeOf(from) != typeOf(to) {
			if l.level != slog.LevelInfo {
				t.Errorf("line %d, a change of topology type, is at %v, not Info", i, l.level)
			}
			types = append(types, typeOf(to))
		}
		prev = to
	}
	want := []string{"ReplicaSetNoPrimary", "ReplicaSetWithPrimary", "ReplicaSetNoPrimary", "ReplicaSetWithPrimary"}
	if !slices.Equal(types, want) {
		t.Fatalf("topology types %v, want %v:%s", types, want, dump.String())
	}
	if !strings.Contains(prev, np+" RSPrimary") || !strings.Contains(prev, m0+" RSSecondary") {
		t.Fatalf("the last line ends at %q, want %s primary and %s secondary", prev, np, m0)
	}
	for _, l := range capt.records("") {
		if strings.Contains(l.text, secret) {
			t.Fatalf("a log line carries the password: %s", l.text)
		}
	}
	t.Logf("%d 'topology changed' lines:%s", len(lines), dump.String())
}
