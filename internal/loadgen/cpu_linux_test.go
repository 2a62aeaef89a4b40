//go:build linux

package loadgen

import (
	"context"
	"strings"
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

func TestParseProcStat(t *testing.T) {
	steal, total, err := parseProcStat([]byte("cpu  100 5 50 800 10 1 4 30 0 0\ncpu0 50 2 25 400 5 0 2 15 0 0\n"))
	if err != nil || steal != 30 || total != 1000 {
		t.Fatalf("got steal %d total %d err %v, want 30 1000", steal, total, err)
	}
	for _, bad := range []string{"", "cpu 1 2 3\n", "intr 1 2 3 4 5 6 7 8 9\n", "cpu 1 2 3 4 5 6 7 x 9\n"} {
		if _, _, err := parseProcStat([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	// The machine's own file parses, and time goes forward.
	s0, t0, err := machineCPU()
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(30 * time.Millisecond)
	s1, t1, err := machineCPU()
	if err != nil || t1 < t0 || s1 < s0 {
		t.Fatalf("second reading %d/%d after %d/%d, err %v", s1, t1, s0, t0, err)
	}
}

func TestCompareReportsSteal(t *testing.T) {
	r := Report{Steal: 0.123}
	var out strings.Builder
	if err := r.WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "CPU steal 12.3%") {
		t.Fatalf("table does not report the steal:\n%s", out.String())
	}
	out.Reset()
	r.Steal = 0
	if err := r.WriteTable(&out); err != nil || strings.Contains(out.String(), "steal") {
		t.Fatalf("steal reported while unknown:\n%s", out.String())
	}
}
