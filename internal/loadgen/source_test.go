package loadgen

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestParseSourceAddrs(t *testing.T) {
	addrs := func(ss ...string) []netip.Addr {
		var out []netip.Addr
		for _, s := range ss {
			out = append(out, netip.MustParseAddr(s))
		}
		return out
	}
	for _, c := range []struct {
		in   string
		want []netip.Addr
	}{
		{"", nil},
		{" , ", nil},
		{"127.0.0.1", addrs("127.0.0.1")},
		{"127.0.0.1-127.0.0.3", addrs("127.0.0.1", "127.0.0.2", "127.0.0.3")},
		{"127.0.0.255-127.0.1.1", addrs("127.0.0.255", "127.0.1.0", "127.0.1.1")},
		{"127.0.0.5, 127.0.0.9-127.0.0.10", addrs("127.0.0.5", "127.0.0.9", "127.0.0.10")},
		{"::1", addrs("::1")},
	} {
		got, err := ParseSourceAddrs(c.in)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("ParseSourceAddrs(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
	if got, err := ParseSourceAddrs(DefaultSourceAddrs); err != nil || len(got) != 8 {
		t.Errorf("default %q: %v, %v; want 8 addresses", DefaultSourceAddrs, got, err)
	}
	for _, bad := range []string{"nope", "127.0.0.3-127.0.0.1", "127.0.0.1-::1", "127.0.0.1-x", "127.0.0.0-127.0.255.255"} {
		if got, err := ParseSourceAddrs(bad); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("ParseSourceAddrs(%q) = %v, %v; want ErrInvalidConfig", bad, got, err)
		}
	}
}

func TestSourceAddrRules(t *testing.T) {
	srcs, err := ParseSourceAddrs("127.0.0.1-127.0.0.3")
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.1"} {
		if a := sourceAddr(srcs, "127.0.0.1:27017", i); a == nil || a.IP.String() != want || a.Port != 0 {
			t.Errorf("connection %d: source %v, want %s:0", i, a, want)
		}
	}
	// Not applied: no sources, a non-loopback target, a name, another
	// family, or a malformed address.
	for _, target := range []string{"10.0.0.1:27017", "db.example.com:27017", "[::1]:27017", "nope"} {
		if a := sourceAddr(srcs, target, 0); a != nil {
			t.Errorf("target %s: source %v, want none", target, a)
		}
	}
	if a := sourceAddr(nil, "127.0.0.1:1", 0); a != nil {
		t.Errorf("no sources: %v", a)
	}
	if a := sourceAddr([]netip.Addr{netip.MustParseAddr("192.0.2.1")}, "127.0.0.1:1", 0); a != nil {
		t.Errorf("non-loopback source for a loopback target: %v", a)
	}
}

// acceptedFrom returns a function listing the distinct source addresses of
// r's open connections.
func acceptedFrom(t *testing.T, r *responder) func() []string {
	t.Helper()
	return func() []string {
		r.mu.Lock()
		defer r.mu.Unlock()
		var out []string
		for c := range r.conns {
			h, _, _ := net.SplitHostPort(c.RemoteAddr().String())
			out = append(out, h)
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
}

// Connections of the idle probe and of the ping workload come from every
// source address, round-robin.
func TestSourceAddrsSpreadConnections(t *testing.T) {
	srcs, err := ParseSourceAddrs("127.0.0.1-127.0.0.4")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"}

	r := startResponder(t, responderOpts{})
	from := acceptedFrom(t, r)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conns, err := openIdle(ctx, r.addr(), IdleConfig{Conns: 8, Parallel: 4, DialTimeout: 5 * time.Second, SourceAddrs: srcs})
	defer func() {
		for _, c := range conns {
			if c != nil {
				_ = c.Close()
			}
		}
	}()
	if err != nil {
		t.Fatal(err)
	}
	if got := from(); !slices.Equal(got, want) {
		t.Errorf("idle connections came from %v, want %v", got, want)
	}

	r2 := startResponder(t, responderOpts{delay: 20 * time.Millisecond})
	from2 := acceptedFrom(t, r2)
	var mu sync.Mutex
	var seen []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 200 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
			mu.Lock()
			seen = slices.Compact(slices.Sorted(slices.Values(append(seen, from2()...))))
			mu.Unlock()
		}
	}()
	res, err := Run(ctx, r2.addr(), Config{Clients: 4, Duration: 500 * time.Millisecond, Rounds: 1, SourceAddrs: srcs})
	cancel()
	<-done
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if res.Ops == 0 {
		t.Fatalf("no operations: %+v", res)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(seen, want) {
		t.Errorf("ping clients came from %v, want %v", seen, want)
	}
}

// FuzzParseSourceAddrs: no input panics, a result never exceeds the bound,
// and an accepted list is all valid addresses.
func FuzzParseSourceAddrs(f *testing.F) {
	for _, s := range []string{"", DefaultSourceAddrs, "127.0.0.1", "::1-::9", "127.0.0.5,127.0.0.9-127.0.0.10",
		"127.0.0.0-127.0.255.255", "1.2.3.4-::1", "-", ",,", "127.0.0.1-"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseSourceAddrs(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidConfig) || got != nil {
				t.Fatalf("ParseSourceAddrs(%q) = %v, %v", s, got, err)
			}
			return
		}
		if len(got) > maxSourceAddrs {
			t.Fatalf("ParseSourceAddrs(%q): %d addresses", s, len(got))
		}
		for _, a := range got {
			if !a.IsValid() {
				t.Fatalf("ParseSourceAddrs(%q): invalid %v", s, a)
			}
		}
	})
}
