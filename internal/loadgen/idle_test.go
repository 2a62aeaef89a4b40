//go:build linux

package loadgen

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestProbeIdle(t *testing.T) {
	r := startResponder(t, responderOpts{})
	const k = 200
	rep, err := ProbeIdle(context.Background(), r.addr(), IdleConfig{Conns: k, PID: os.Getpid(), Settle: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", rep)
	if rep.Conns != k || rep.ClosedByPeer != 0 || !rep.SelfMeasured || rep.PID != os.Getpid() {
		t.Fatalf("report %+v", rep)
	}
	if rep.RSSBefore <= 0 || rep.RSSAfter <= 0 || rep.Delta != rep.RSSAfter-rep.RSSBefore ||
		rep.BytesPerConn != float64(rep.Delta)/k {
		t.Fatalf("RSS figures %+v", rep)
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur != lim.Max || rep.FileLimit != lim.Cur {
		t.Fatalf("soft limit %d, hard %d, reported %d: not raised", lim.Cur, lim.Max, rep.FileLimit)
	}
	if h := r.hellos.Load(); h != k {
		t.Fatalf("server saw %d hellos, want %d", h, k)
	}
	// Each connection sent a hello, stayed silent, and answered one ping
	// after the RSS was read.
	if p := r.pings.Load(); p != k || rep.Answered != k {
		t.Fatalf("server saw %d pings, %d answered; want %d each", p, rep.Answered, k)
	}
	// Every connection is closed when the probe returns.
	deadline := time.Now().Add(10 * time.Second)
	for r.open.Load() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := r.open.Load(); n != 0 {
		t.Fatalf("%d connections still open after the probe", n)
	}
	var out strings.Builder
	if err := rep.WriteTable(&out); err != nil || !strings.Contains(out.String(), "per idle client") {
		t.Fatalf("table %q, %v", out.String(), err)
	}
}

func TestProbeIdleSeesClosedConns(t *testing.T) {
	r := startResponder(t, responderOpts{closeAfterHello: true})
	rep, err := ProbeIdle(context.Background(), r.addr(), IdleConfig{Conns: 20, PID: os.Getpid(), Settle: 200 * time.Millisecond})
	// Closed connections cannot answer the ping that follows: the probe
	// fails, and says how many did.
	if err == nil || !strings.Contains(err.Error(), "0 of 20 idle connections answered") {
		t.Fatalf("err = %v, want 0 of 20 answered", err)
	}
	if rep.ClosedByPeer != 20 || rep.Answered != 0 {
		t.Fatalf("closed by peer %d, answered %d; want 20, 0", rep.ClosedByPeer, rep.Answered)
	}
}

func TestProbeIdleFileLimit(t *testing.T) {
	r := startResponder(t, responderOpts{})
	limit, err := RaiseFileLimit()
	if err != nil {
		t.Fatal(err)
	}
	_, err = ProbeIdle(context.Background(), r.addr(), IdleConfig{Conns: int(limit), PID: os.Getpid()})
	var fe *FileLimitError
	if !errors.Is(err, ErrTooManyConns) || !errors.As(err, &fe) || fe.Limit != limit || fe.Need <= limit {
		t.Fatalf("err %v, want a FileLimitError for limit %d", err, limit)
	}
	if r.hellos.Load() != 0 {
		t.Fatal("the probe connected before checking the limit")
	}
}

func TestProbeIdleErrors(t *testing.T) {
	r := startResponder(t, responderOpts{})
	for _, c := range []IdleConfig{{Conns: 0, PID: 1}, {Conns: 1}, {Conns: 1, PID: 1, Parallel: -1}} {
		if _, err := ProbeIdle(context.Background(), r.addr(), c); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: err %v, want ErrInvalidConfig", c, err)
		}
	}
	// A server that never answers the hello aborts the probe in time.
	silent := startResponder(t, responderOpts{silent: true})
	start := time.Now()
	_, err := ProbeIdle(context.Background(), silent.addr(), IdleConfig{Conns: 3, PID: os.Getpid(), DialTimeout: 300 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "hello") || !strings.Contains(err.Error(), "timeout") {
		t.Fatalf("err %v, want a hello timeout", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("probe of a silent server took %v", took)
	}
	if _, err := ProbeIdle(context.Background(), deadAddr(t), IdleConfig{Conns: 5, PID: os.Getpid(), DialTimeout: time.Second}); err == nil ||
		!strings.Contains(err.Error(), "idle connection") {
		t.Fatalf("err %v, want a dial failure", err)
	}
	if _, err := ProbeIdle(context.Background(), r.addr(), IdleConfig{Conns: 1, PID: 1 << 30}); err == nil {
		t.Fatal("want an error for a PID that does not exist")
	}
}

func TestParseVmRSS(t *testing.T) {
	got, err := parseVmRSS([]byte("Name:\tx\nVmPeak:\t  100 kB\nVmRSS:\t   2048 kB\nThreads: 3\n"))
	if err != nil || got != 2048*1024 {
		t.Fatalf("got %d, %v", got, err)
	}
	for _, bad := range []string{"Name: x\n", "VmRSS: 12 MB\n", "VmRSS: -1 kB\n", "VmRSS: x kB\n", "VmRSS:\n"} {
		if _, err := parseVmRSS([]byte(bad)); err == nil {
			t.Errorf("%q: want an error", bad)
		}
	}
}
