package loadgen

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"testing"
	"time"
)

func relayKinds() []RelayKind {
	kinds := []RelayKind{RelayGoroutine}
	if runtime.GOOS == "linux" {
		kinds = append(kinds, RelayEpoll, RelayUring)
	}
	return kinds
}

// startRelay starts a responder and a relay of kind in front of it; the
// relay is closed when the test ends (Close is idempotent, so a test may
// close it earlier).
func startRelay(t *testing.T, kind RelayKind) (*responder, *Relay) {
	t.Helper()
	r := startResponder(t, responderOpts{})
	relay, err := ListenRelay("127.0.0.1:0", r.addr(), kind)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { relay.Close() })
	return r, relay
}

func TestRelayCarriesPings(t *testing.T) {
	for _, kind := range relayKinds() {
		t.Run(string(kind), func(t *testing.T) {
			r, relay := startRelay(t, kind)
			cfg := Config{Clients: 8, Duration: 500 * time.Millisecond, MaxOps: 20_000}
			res, err := Run(context.Background(), relay.Addr(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if res.Errors != 0 || res.Ops+res.WarmupOps == 0 {
				t.Fatalf("%d ops, %d errors %v", res.Ops, res.Errors, res.ErrorSamples)
			}
			// Every ping went through to the server: the relay answers nothing.
			if p, done := r.pings.Load(), res.Ops+res.WarmupOps; p < done {
				t.Fatalf("server answered %d pings, clients counted %d", p, done)
			}
			if h := r.hellos.Load(); h != int64(cfg.Clients) {
				t.Fatalf("server saw %d hellos, want %d", h, cfg.Clients)
			}
		})
	}
}

// A message over the bound, or under the header size, ends that client and
// only that client.
func TestRelayBadLengthClosesOnlyThatClient(t *testing.T) {
	for _, kind := range relayKinds() {
		t.Run(string(kind), func(t *testing.T) {
			_, relay := startRelay(t, kind)
			for _, n := range []uint32{MaxRelayMessage + 1, 8, 0xffffffff} {
				bad, err := net.Dial("tcp", relay.Addr())
				if err != nil {
					t.Fatal(err)
				}
				var hdr [16]byte
				binary.LittleEndian.PutUint32(hdr[:], n)
				if _, err := bad.Write(hdr[:]); err != nil {
					t.Fatal(err)
				}
				_ = bad.SetReadDeadline(time.Now().Add(5 * time.Second))
				if _, err := bad.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !isReset(err) {
					t.Fatalf("length %d: read gave %v, want the connection closed", n, err)
				}
				bad.Close()
			}
			res, err := Run(context.Background(), relay.Addr(), Config{Clients: 2, Duration: 300 * time.Millisecond, MaxOps: 2000})
			if err != nil || res.Errors != 0 {
				t.Fatalf("good clients after bad ones: %v, %d errors %v", err, res.Errors, res.ErrorSamples)
			}
		})
	}
}

func isReset(err error) bool {
	var ne *net.OpError
	return errors.As(err, &ne) && !ne.Timeout()
}

// Close ends open client connections and returns; goleak (TestMain) checks
// that no relay goroutine is left.
func TestRelayCloseEndsConnections(t *testing.T) {
	for _, kind := range relayKinds() {
		t.Run(string(kind), func(t *testing.T) {
			_, relay := startRelay(t, kind)
			c, err := net.Dial("tcp", relay.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			// A round trip proves the pair is set up before Close.
			c2 := newPingClient(&run{cfg: Config{DialTimeout: time.Second}, deadline: time.Now().Add(5 * time.Second)}, relay.Addr(), 0)
			if err := c2.connect(context.Background()); err != nil {
				t.Fatal(err)
			}
			defer c2.closeConn()
			done := make(chan struct{})
			go func() {
				relay.Close()
				close(done)
			}()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Close did not return")
			}
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !isReset(err) {
				t.Fatalf("after Close, read gave %v, want the connection closed", err)
			}
			if err := c2.roundTrip(c2.req, time.Now().Add(2*time.Second)); err == nil {
				t.Fatal("a ping through a closed relay succeeded")
			}
		})
	}
}

func TestRelayUnknownKind(t *testing.T) {
	if _, err := ListenRelay("127.0.0.1:0", "127.0.0.1:1", "threads"); err == nil {
		t.Fatal("unknown kind accepted")
	}
}

// SetDelay holds replies back mid-run, and 0 lifts it.
func TestRelayDelay(t *testing.T) {
	_, relay := startRelay(t, RelayGoroutine)
	run := func() Result {
		t.Helper()
		res, err := Run(context.Background(), relay.Addr(), Config{Clients: 1, Duration: 300 * time.Millisecond, MaxOps: 2000})
		if err != nil || res.Errors != 0 {
			t.Fatalf("run: %v %v", err, res.ErrorSamples)
		}
		return res
	}
	relay.SetDelay(20 * time.Millisecond)
	if res := run(); res.Latency.P50 < 20*time.Millisecond {
		t.Fatalf("p50 %v with a 20ms delay", res.Latency.P50)
	}
	relay.SetDelay(0)
	if res := run(); res.Latency.P50 >= 20*time.Millisecond {
		t.Fatalf("p50 %v after the delay was lifted", res.Latency.P50)
	}
}
