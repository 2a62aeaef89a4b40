package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestCompareDetectsSlowProxy: a "proxy" that adds 2ms per reply must show
// up as lower throughput and higher p50, whatever the machine's noise.
func TestCompareDetectsSlowProxy(t *testing.T) {
	direct := startResponder(t, responderOpts{})
	slow := startResponder(t, responderOpts{delay: 2 * time.Millisecond})
	cfg := Config{Clients: 2, Duration: 400 * time.Millisecond, Warmup: 50 * time.Millisecond, Rounds: 2, MaxOps: 1_000_000}
	rep, err := Compare(context.Background(), direct.addr(), slow.addr(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := rep.WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", out.String())

	wantOrder := []string{SideDirect, SideProxied, SideProxied, SideDirect}
	if len(rep.Runs) != len(wantOrder) {
		t.Fatalf("%d runs, want %d", len(rep.Runs), len(wantOrder))
	}
	var directOps, proxiedOps int64
	for i, run := range rep.Runs {
		if run.Side != wantOrder[i] || run.Round != i/2 {
			t.Fatalf("run %d is round %d %s, want round %d %s", i, run.Round, run.Side, i/2, wantOrder[i])
		}
		if run.Side == SideDirect {
			directOps += run.Result.Ops
			if run.Result.Addr != direct.addr() {
				t.Fatalf("direct run hit %s", run.Result.Addr)
			}
		} else {
			proxiedOps += run.Result.Ops
		}
	}
	if rep.Direct.Ops != directOps || rep.Proxied.Ops != proxiedOps {
		t.Fatalf("side totals %d/%d, runs sum to %d/%d", rep.Direct.Ops, rep.Proxied.Ops, directOps, proxiedOps)
	}
	checkLatency(t, rep.Direct.Latency)
	checkLatency(t, rep.Proxied.Latency)
	if rep.Direct.Errors != 0 || rep.Proxied.Errors != 0 {
		t.Fatalf("errors %d/%d", rep.Direct.Errors, rep.Proxied.Errors)
	}
	if rep.ThroughputRatio <= 0 || rep.ThroughputRatio > 0.7 {
		t.Fatalf("throughput ratio %.3f, want clearly below 1 for a 2ms proxy", rep.ThroughputRatio)
	}
	if want := rep.Proxied.OpsPerSec / rep.Direct.OpsPerSec; rep.ThroughputRatio != want {
		t.Fatalf("ratio %v, want %v", rep.ThroughputRatio, want)
	}
	if rep.AddedP50 < 1500*time.Microsecond || rep.AddedP50 != rep.Proxied.Latency.P50-rep.Direct.Latency.P50 {
		t.Fatalf("added p50 %v, want about 2ms", rep.AddedP50)
	}
	if len(rep.RoundRatios) != 2 || rep.RatioMin > rep.RatioMedian || rep.RatioMedian > rep.RatioMax || rep.RatioMax > 0.7 {
		t.Fatalf("round ratios %v median %v range %v-%v", rep.RoundRatios, rep.RatioMedian, rep.RatioMin, rep.RatioMax)
	}
	for _, want := range []string{"direct", "proxied", direct.addr(), slow.addr(), "proxied/direct throughput", "added p50"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("table lacks %q", want)
		}
	}

	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"throughput_ratio", "added_p50_ns", "direct", "proxied", "runs", "round_ratios"} {
		if _, ok := back[k]; !ok {
			t.Fatalf("JSON lacks %q: %s", k, b)
		}
	}
}

func TestCompareNoMeasurement(t *testing.T) {
	direct := startResponder(t, responderOpts{})
	rep, err := Compare(context.Background(), direct.addr(), deadAddr(t), Config{Clients: 1, Duration: 200 * time.Millisecond, Rounds: 3})
	if !errors.Is(err, ErrNoMeasurement) || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("err %v, want ErrNoMeasurement with the cause", err)
	}
	// It stops at the first empty run instead of finishing the rounds.
	if len(rep.Runs) != 2 || rep.Proxied.Errors == 0 || rep.Direct.Ops == 0 {
		t.Fatalf("partial report: %d runs, proxied errors %d, direct ops %d", len(rep.Runs), rep.Proxied.Errors, rep.Direct.Ops)
	}
}

func TestCompareCancelled(t *testing.T) {
	r := startResponder(t, responderOpts{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Compare(ctx, r.addr(), r.addr(), Config{Clients: 1, Duration: time.Second})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
}

// TestCompareStalledSide: a side that completes nothing and reports no
// error is still an ErrNoMeasurement, and the message says why.
func TestCompareStalledSide(t *testing.T) {
	direct := startResponder(t, responderOpts{})
	hung := startResponder(t, responderOpts{hang: true})
	_, err := Compare(context.Background(), direct.addr(), hung.addr(), Config{Clients: 1, Duration: 300 * time.Millisecond, Rounds: 1})
	if !errors.Is(err, ErrNoMeasurement) || !strings.Contains(err.Error(), "stalled") {
		t.Fatalf("err %v, want ErrNoMeasurement saying the server stalled", err)
	}
}

// A comparison run one round at a time (RoundOffset) and merged is the
// same report as one run in one go: rounds numbered on, the order
// alternating, totals and CPU per operation over all runs.
func TestCompareRoundOffsetAndMerge(t *testing.T) {
	direct := startResponder(t, responderOpts{})
	slow := startResponder(t, responderOpts{delay: time.Millisecond})
	procs := []Process{{Name: "bench", PID: 0}}
	var merged Report
	for round := range 2 {
		cfg := Config{Clients: 2, Duration: 300 * time.Millisecond, Warmup: 50 * time.Millisecond, Rounds: 1,
			RoundOffset: round, Processes: procs}
		rep, err := Compare(context.Background(), direct.addr(), slow.addr(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		merged.Merge(rep)
	}
	wantOrder := []string{SideDirect, SideProxied, SideProxied, SideDirect}
	if merged.Rounds != 2 || len(merged.Runs) != 4 || len(merged.RoundRatios) != 2 {
		t.Fatalf("merged %d rounds, %d runs, %d ratios", merged.Rounds, len(merged.Runs), len(merged.RoundRatios))
	}
	var directOps, proxiedOps, completed int64
	for i, run := range merged.Runs {
		if run.Side != wantOrder[i] || run.Round != i/2 {
			t.Fatalf("run %d is round %d %s, want round %d %s", i, run.Round, run.Side, i/2, wantOrder[i])
		}
		if run.Side == SideDirect {
			directOps += run.Result.Ops
		} else {
			proxiedOps += run.Result.Ops
			completed += run.Result.Ops + run.Result.WarmupOps
		}
	}
	if merged.Direct.Ops != directOps || merged.Proxied.Ops != proxiedOps {
		t.Fatalf("side totals %d/%d, runs sum to %d/%d", merged.Direct.Ops, merged.Proxied.Ops, directOps, proxiedOps)
	}
	if n := merged.Proxied.hist.Count(); n != uint64(proxiedOps) {
		t.Fatalf("merged histogram counts %d, want %d", n, proxiedOps)
	}
	if want := merged.Proxied.OpsPerSec / merged.Direct.OpsPerSec; merged.ThroughputRatio != want || want <= 0 {
		t.Fatalf("ratio %v, want %v", merged.ThroughputRatio, want)
	}
	cpu, ok := merged.Proxied.ProcessCPU("bench")
	if !ok || completed == 0 || cpu.PerOp != cpu.Total/time.Duration(completed) {
		t.Fatalf("bench CPU %+v over %d completed operations", cpu, completed)
	}
	if _, err := Compare(context.Background(), direct.addr(), slow.addr(), Config{RoundOffset: -1}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("negative offset: %v", err)
	}
}
