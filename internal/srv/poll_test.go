package srv

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

const cluster = "_mongodb._tcp.cluster0.example.com."

// logBuf collects a Poller's log lines.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

func (l *logBuf) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// changes records OnChange calls.
type changes struct {
	ch chan []string
}

func newChanges() *changes { return &changes{ch: make(chan []string, 64)} }

func (c *changes) onChange(hosts []string) {
	select {
	case c.ch <- hosts:
	default: // a test that lets 64 pile up has failed already
	}
}

// next waits up to 5s for the next change.
func (c *changes) next(t *testing.T) []string {
	t.Helper()
	select {
	case h := <-c.ch:
		return h
	case <-time.After(5 * time.Second):
		t.Fatal("no host list change in 5s")
		return nil
	}
}

// none fails if a change is reported.
func (c *changes) none(t *testing.T) {
	t.Helper()
	select {
	case h := <-c.ch:
		t.Fatalf("unexpected change to %q", h)
	default:
	}
}

// waitFor polls cond for up to 5s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 5s: %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func fastPoll(o PollOptions, log *slog.Logger, c *changes) PollOptions {
	o.Interval = 5 * time.Millisecond
	o.RetryInterval = 2 * time.Millisecond
	o.Timeout = 2 * time.Second
	o.Logger = log
	o.OnChange = c.onChange
	return o
}

func hostsRecs(names ...string) []srvRec {
	var recs []srvRec
	for _, n := range names {
		recs = append(recs, srvRec{target: n + ".example.com", port: 27017})
	}
	return recs
}

func TestPollerFollowsChanges(t *testing.T) {
	z, r := startDNS(t)
	z.setSRV(cluster, hostsRecs("a", "b")...)
	res, err := Resolve(testCtx(t), r, "cluster0.example.com", Options{})
	if err != nil {
		t.Fatal(err)
	}
	var log logBuf
	c := newChanges()
	p, err := StartPoller(context.Background(), r, "cluster0.example.com", res.Hosts, fastPoll(PollOptions{}, log.logger(), c))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	// Unchanged records: rescans happen, nothing is reported.
	n := z.queryCount()
	waitFor(t, "three rescans", func() bool { return z.queryCount() >= n+3 })
	c.none(t)

	z.setSRV(cluster, hostsRecs("b", "c", "d")...)
	want := []string{"b.example.com:27017", "c.example.com:27017", "d.example.com:27017"}
	if got := c.next(t); !slices.Equal(got, want) {
		t.Fatalf("change = %q, want %q", got, want)
	}
	if got := p.Hosts(); !slices.Equal(got, want) {
		t.Errorf("Hosts() = %q, want %q", got, want)
	}

	z.setSRV(cluster, hostsRecs("d")...)
	if got, want := c.next(t), []string{"d.example.com:27017"}; !slices.Equal(got, want) {
		t.Fatalf("change = %q, want %q", got, want)
	}
	if log.count("level=WARN") != 0 {
		t.Errorf("warnings without a failure:\n%s", log.b.String())
	}
}

func TestPollerKeepsHostsOnFailure(t *testing.T) {
	z, r := startDNS(t)
	initial := []string{"a.example.com:27017", "b.example.com:27017"}
	var log logBuf
	c := newChanges()
	p, err := StartPoller(context.Background(), r, "cluster0.example.com", initial, fastPoll(PollOptions{}, log.logger(), c))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	steps := []struct {
		name string
		set  func()
	}{
		{"SERVFAIL", func() { z.setServfail(true) }},
		{"NXDOMAIN", func() { z.setServfail(false); z.setSRV(cluster) }},
		{"only targets outside the domain", func() { z.setSRV(cluster, srvRec{target: "evil.example.org", port: 1}) }},
	}
	for _, s := range steps {
		s.set()
		n := z.queryCount()
		waitFor(t, s.name+": five rescans", func() bool { return z.queryCount() >= n+5 })
		c.none(t)
		if got := p.Hosts(); !slices.Equal(got, initial) {
			t.Fatalf("%s: Hosts() = %q, want the initial %q", s.name, got, initial)
		}
	}
	// One warning for the whole failing stretch, one for the rejected
	// target, however many rescans.
	if n := log.count("level=WARN"); n != 2 {
		t.Errorf("%d warnings, want 2:\n%s", n, log.b.String())
	}
	if log.count("evil.example.org") == 0 {
		t.Errorf("the rejected target is not logged:\n%s", log.b.String())
	}

	// Recovery: the records come back, with one bad target dropped.
	z.setSRV(cluster, append(hostsRecs("b", "c"), srvRec{target: "evil.example.org", port: 1})...)
	want := []string{"b.example.com:27017", "c.example.com:27017"}
	if got := c.next(t); !slices.Equal(got, want) {
		t.Fatalf("change = %q, want %q", got, want)
	}
	waitFor(t, "the recovery logged", func() bool { return log.count("rescan succeeded again") == 1 })
}

func TestPollerMaxHosts(t *testing.T) {
	z, r := startDNS(t)
	initial := []string{"a.example.com:27017", "b.example.com:27017"}
	c := newChanges()
	var log logBuf
	p, err := StartPoller(context.Background(), r, "cluster0.example.com", initial,
		fastPoll(PollOptions{Options: Options{MaxHosts: 2}}, log.logger(), c))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	// b goes; a stays; one of c, d, e joins to make two.
	z.setSRV(cluster, hostsRecs("a", "c", "d", "e")...)
	got := c.next(t)
	if len(got) != 2 || got[0] != "a.example.com:27017" ||
		!slices.Contains([]string{"c.example.com:27017", "d.example.com:27017", "e.example.com:27017"}, got[1]) {
		t.Fatalf("change = %q, want a and one of c, d, e", got)
	}
	// More valid hosts while already at the limit: nothing changes.
	z.setSRV(cluster, hostsRecs("a", "c", "d", "e", "f")...)
	n := z.queryCount()
	waitFor(t, "three rescans", func() bool { return z.queryCount() >= n+3 })
	c.none(t)
}

func TestUpdate(t *testing.T) {
	cases := []struct {
		cur, valid []string
		limit      int
		want       []string
	}{
		{[]string{"a", "b"}, []string{"b", "c"}, 0, []string{"b", "c"}},
		{[]string{"a", "b"}, []string{"a", "b"}, 0, []string{"a", "b"}},
		{[]string{"a", "b"}, []string{"c", "b", "a"}, 3, []string{"a", "b", "c"}},
		{[]string{"a", "b"}, []string{"c", "b", "a"}, 2, []string{"a", "b"}},
		{[]string{"a"}, []string{"a", "c"}, 1, []string{"a"}},
		{[]string{"a", "b", "c"}, []string{"c", "d"}, 2, []string{"c", "d"}},
		{nil, []string{"a"}, 0, []string{"a"}},
	}
	for _, c := range cases {
		if got := update(c.cur, c.valid, c.limit); !slices.Equal(got, c.want) {
			t.Errorf("update(%q, %q, %d) = %q, want %q", c.cur, c.valid, c.limit, got, c.want)
		}
	}
	// Random new hosts: two of four joining a kept one.
	seen := map[string]bool{}
	for range 40 {
		got := update([]string{"a"}, []string{"a", "b", "c", "d", "e"}, 3)
		if len(got) != 3 || got[0] != "a" || got[1] == got[2] {
			t.Fatalf("update = %q, want a and two of b..e", got)
		}
		seen[strings.Join(got, ",")] = true
	}
	if len(seen) < 2 {
		t.Errorf("update chose the same new hosts 40 times: %v", seen)
	}
}

func TestPollerStops(t *testing.T) {
	z, r := startDNS(t)
	z.setSRV(cluster, hostsRecs("a")...)
	base := goleak.IgnoreCurrent()

	t.Run("Close", func(t *testing.T) {
		p, err := StartPoller(context.Background(), r, "cluster0.example.com", nil,
			fastPoll(PollOptions{}, slog.New(slog.DiscardHandler), newChanges()))
		if err != nil {
			t.Fatal(err)
		}
		n := z.queryCount()
		waitFor(t, "a rescan", func() bool { return z.queryCount() > n })
		p.Close()
		p.Close()
		goleak.VerifyNone(t, base)
	})

	t.Run("context", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		_, err := StartPoller(ctx, r, "cluster0.example.com", nil,
			fastPoll(PollOptions{}, slog.New(slog.DiscardHandler), newChanges()))
		if err != nil {
			t.Fatal(err)
		}
		n := z.queryCount()
		waitFor(t, "a rescan", func() bool { return z.queryCount() > n })
		cancel()
		goleak.VerifyNone(t, base)
	})

	// net.Resolver stops a UDP read at a deadline only, not on cancellation,
	// so Close waits for the lookup, bounded by Timeout.
	t.Run("Close during a lookup", func(t *testing.T) {
		z.setSilent(true)
		defer z.setSilent(false)
		o := fastPoll(PollOptions{}, slog.New(slog.DiscardHandler), newChanges())
		o.Timeout = 300 * time.Millisecond
		p, err := StartPoller(context.Background(), r, "cluster0.example.com", nil, o)
		if err != nil {
			t.Fatal(err)
		}
		n := z.queryCount()
		waitFor(t, "a query", func() bool { return z.queryCount() > n })
		start := time.Now()
		p.Close()
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("Close took %v during a lookup", d)
		}
		goleak.VerifyNone(t, base)
	})

	t.Run("timeout", func(t *testing.T) {
		z.setSilent(true)
		defer z.setSilent(false)
		var log logBuf
		o := fastPoll(PollOptions{}, log.logger(), newChanges())
		o.Timeout = 20 * time.Millisecond
		p, err := StartPoller(context.Background(), r, "cluster0.example.com", []string{"x.example.com:1"}, o)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		waitFor(t, "a failure logged", func() bool { return log.count("level=WARN") == 1 })
		if got := p.Hosts(); !slices.Equal(got, []string{"x.example.com:1"}) {
			t.Errorf("Hosts() = %q after a timeout", got)
		}
	})

	if _, err := StartPoller(context.Background(), r, "bad host", nil, PollOptions{}); err == nil {
		t.Error("StartPoller accepted an invalid host name")
	}
}
