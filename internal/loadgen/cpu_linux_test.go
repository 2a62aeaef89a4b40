//go:build linux

package loadgen

import (
	"context"
	"testing"
	"time"
)

func TestProcessCPUTime(t *testing.T) {
	before, err := ProcessCPUTime(0)
	if err != nil {
		t.Fatal(err)
	}
	// Spin until the kernel has billed at least two ticks.
	deadline := time.Now().Add(10 * time.Second)
	x := 0
	for {
		for i := range 1_000_000 {
			x += i
		}
		now, err := ProcessCPUTime(0)
		if err != nil {
			t.Fatal(err)
		}
		if now-before >= 2*clockTick {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CPU time stayed at %v after 10s of spinning (%d)", now, x)
		}
	}
	if _, err := ProcessCPUTime(-1); err == nil {
		t.Fatal("no error for a process that does not exist")
	}
}

func TestParseStatCPU(t *testing.T) {
	// A command name with spaces and parentheses must not shift the fields.
	line := "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 3 0 100 0 0"
	got, err := parseStatCPU(line)
	if err != nil || got != 325*clockTick {
		t.Fatalf("got %v, %v; want %v", got, err, 325*clockTick)
	}
	for _, bad := range []string{"", "42 no-paren", "42 (x) S 1 2", "42 (x) S 1 42 42 0 -1 4194560 100 0 0 0 u 75 0", "42 (x) S 1 42 42 0 -1 4194560 100 0 0 0 -5 75 0"} {
		if _, err := parseStatCPU(bad); err == nil {
			t.Errorf("parseStatCPU(%q): no error", bad)
		}
	}
}

// TestCompareReportsCPU: with Processes set, both sides report the CPU of
// this process; a ProxiedOnly process appears on the proxied side only.
func TestCompareReportsCPU(t *testing.T) {
	direct := startResponder(t, responderOpts{})
	proxied := startResponder(t, responderOpts{})
	cfg := Config{Clients: 2, Duration: 300 * time.Millisecond, Warmup: 50 * time.Millisecond, Rounds: 1, MaxOps: 1_000_000,
		Processes: []Process{{Name: "bench"}, {Name: "proxy", ProxiedOnly: true}}}
	rep, err := Compare(context.Background(), direct.addr(), proxied.addr(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Direct.CPU) != 1 || rep.Direct.CPU[0].Name != "bench" {
		t.Fatalf("direct CPU %+v", rep.Direct.CPU)
	}
	if len(rep.Proxied.CPU) != 2 || rep.Proxied.CPU[1].Name != "proxy" {
		t.Fatalf("proxied CPU %+v", rep.Proxied.CPU)
	}
	for _, c := range append(rep.Direct.CPU, rep.Proxied.CPU...) {
		if c.Total < 0 || c.PerOp < 0 {
			t.Fatalf("negative CPU %+v", c)
		}
	}
}
