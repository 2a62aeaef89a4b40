package loadgen

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// checkLatency asserts the internal consistency of a latency summary.
func checkLatency(t *testing.T, l Latency) {
	t.Helper()
	if l.P50 <= 0 || l.P50 > l.P90 || l.P90 > l.P99 || l.P99 > l.Max || l.Mean <= 0 || l.Mean > l.Max {
		t.Fatalf("inconsistent latency summary %+v", l)
	}
}

func TestRunPingSane(t *testing.T) {
	r := startResponder(t, responderOpts{})
	cfg := Config{Clients: 4, Duration: 800 * time.Millisecond, Warmup: 100 * time.Millisecond, MaxOps: 1_000_000}
	start := time.Now()
	res, err := Run(context.Background(), r.addr(), cfg)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d ops (+%d warm-up) in %v: %.0f ops/s, latency %+v", res.Ops, res.WarmupOps, res.Elapsed, res.OpsPerSec, res.Latency)
	if res.Errors != 0 || len(res.ErrorSamples) != 0 {
		t.Fatalf("errors: %d %v", res.Errors, res.ErrorSamples)
	}
	if res.Ops <= 0 || res.WarmupOps <= 0 {
		t.Fatalf("ops %d, warm-up ops %d: both should be positive", res.Ops, res.WarmupOps)
	}
	if took > 10*time.Second {
		t.Fatalf("run took %v for a 800ms duration", took)
	}
	// The window is the run minus the warm-up, up to the last completion
	// (which may land a little after the deadline it raced with).
	if window := cfg.Duration - cfg.Warmup; res.Elapsed <= window/2 || res.Elapsed > window+time.Second {
		t.Fatalf("elapsed %v far from the %v window", res.Elapsed, window)
	}
	if got := float64(res.Ops) / res.Elapsed.Seconds(); got != res.OpsPerSec {
		t.Fatalf("OpsPerSec %v, want %v", res.OpsPerSec, got)
	}
	if res.Histogram().Count() != uint64(res.Ops) {
		t.Fatalf("histogram holds %d, ops %d", res.Histogram().Count(), res.Ops)
	}
	checkLatency(t, res.Latency)
	// Every success was answered by the server; at most one answered ping
	// per client can be abandoned at the end of the run.
	done := res.Ops + res.WarmupOps
	if p := r.pings.Load(); p < done || p > done+int64(cfg.Clients) {
		t.Fatalf("server answered %d pings, client counted %d", p, done)
	}
	if h := r.hellos.Load(); h != int64(cfg.Clients) {
		t.Fatalf("server saw %d hellos, want one per client (%d)", h, cfg.Clients)
	}
	if res.Addr != r.addr() || res.Workload != WorkloadPing || res.Clients != 4 {
		t.Fatalf("result header %+v", res)
	}
}

func TestRunPingMaxOps(t *testing.T) {
	r := startResponder(t, responderOpts{})
	start := time.Now()
	res, err := Run(context.Background(), r.addr(), Config{Clients: 3, Duration: 30 * time.Second, MaxOps: 500})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 15*time.Second {
		t.Fatalf("a 500-op run took %v", took)
	}
	if res.Ops != 500 || res.WarmupOps != 0 || res.Errors != 0 {
		t.Fatalf("ops %d warm-up %d errors %d, want exactly 500/0/0", res.Ops, res.WarmupOps, res.Errors)
	}
	if r.pings.Load() != 500 {
		t.Fatalf("server answered %d pings, want 500", r.pings.Load())
	}
}

func TestRunPingCommandErrors(t *testing.T) {
	r := startResponder(t, responderOpts{failPings: true})
	res, err := Run(context.Background(), r.addr(), Config{Clients: 2, Duration: 20 * time.Second, MaxOps: 200})
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors != 200 || res.Ops != 0 {
		t.Fatalf("errors %d ops %d, want 200 and 0", res.Errors, res.Ops)
	}
	if len(res.ErrorSamples) != maxErrorSamples || !strings.Contains(res.ErrorSamples[0], "boom") ||
		!strings.Contains(res.ErrorSamples[0], "8000") {
		t.Fatalf("samples %q", res.ErrorSamples)
	}
	// A command error leaves the connection usable: no reconnects.
	if h := r.hellos.Load(); h != 2 {
		t.Fatalf("%d hellos: command errors should not drop connections", h)
	}
}

func TestRunPingPeerCloses(t *testing.T) {
	r := startResponder(t, responderOpts{closeAfter: 10})
	res, err := Run(context.Background(), r.addr(), Config{Clients: 2, Duration: 20 * time.Second, MaxOps: 300})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ops %d errors %d samples %q", res.Ops, res.Errors, res.ErrorSamples)
	if res.Errors < 300/11-2 || res.Ops == 0 {
		t.Fatalf("errors %d ops %d: every 11th ping should fail", res.Errors, res.Ops)
	}
	// The run ended on its op budget, so every attempt is accounted for.
	if res.Ops+res.WarmupOps+res.Errors != 300 {
		t.Fatalf("ops %d + errors %d != 300 attempts", res.Ops, res.Errors)
	}
	if h := r.hellos.Load(); h < res.Errors {
		t.Fatalf("%d hellos for %d dropped connections: clients should reconnect", h, res.Errors)
	}
}

// deadAddr returns a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func TestRunUnreachable(t *testing.T) {
	res, err := Run(context.Background(), deadAddr(t), Config{Clients: 2, Duration: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.Ops != 0 || res.Errors == 0 || res.OpsPerSec != 0 {
		t.Fatalf("ops %d errors %d ops/s %v against a closed port", res.Ops, res.Errors, res.OpsPerSec)
	}
	// The reconnect backoff keeps a dead address from becoming a busy loop.
	if max := int64(2 * (300*time.Millisecond/reconnectBackoff + 1)); res.Errors > max {
		t.Fatalf("%d errors in 300ms: backoff not applied (max %d)", res.Errors, max)
	}
	if !strings.Contains(res.ErrorSamples[0], "refused") {
		t.Fatalf("samples %q", res.ErrorSamples)
	}
}

func TestRunCancel(t *testing.T) {
	r := startResponder(t, responderOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	res, err := Run(ctx, r.addr(), Config{Clients: 2, Duration: time.Minute})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want the parent's deadline", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("cancelled run took %v", took)
	}
	if res.Ops == 0 || res.Errors != 0 {
		t.Fatalf("partial result ops %d errors %d", res.Ops, res.Errors)
	}
}

// TestRunHungServer: a server that never answers must not stall the run
// past its duration, and the abandoned operations are not errors.
func TestRunHungServer(t *testing.T) {
	r := startResponder(t, responderOpts{hang: true})
	start := time.Now()
	res, err := Run(context.Background(), r.addr(), Config{Clients: 3, Duration: 400 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("run against a hung server took %v", took)
	}
	if res.Ops != 0 || res.Errors != 0 {
		t.Fatalf("ops %d errors %d, want 0/0", res.Ops, res.Errors)
	}

	// With an operation timeout shorter than the run, hangs are errors.
	res, err = Run(context.Background(), r.addr(), Config{Clients: 2, Duration: time.Second, OpTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors == 0 || !strings.Contains(res.ErrorSamples[0], "timeout") {
		t.Fatalf("errors %d samples %q, want timeouts", res.Errors, res.ErrorSamples)
	}
}

func TestConfigValidation(t *testing.T) {
	bad := []Config{
		{Workload: "nope"},
		{Clients: -1},
		{Clients: maxClients + 1},
		{Duration: -time.Second},
		{Duration: time.Second, Warmup: time.Second},
		{Warmup: -1},
		{MaxOps: -5},
		{Rounds: -1},
		{OpTimeout: -1},
	}
	for _, c := range bad {
		if _, err := Run(context.Background(), "127.0.0.1:1", c); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("Run(%+v) err %v, want ErrInvalidConfig", c, err)
		}
		if _, err := Compare(context.Background(), "127.0.0.1:1", "127.0.0.1:1", c); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("Compare(%+v) err %v, want ErrInvalidConfig", c, err)
		}
	}
}

func TestReplyOK(t *testing.T) {
	doc := func(f func(*bsoncore.DocumentBuilder)) bsoncore.Document {
		b := bsoncore.NewDocumentBuilder()
		f(b)
		return b.Build()
	}
	for name, d := range map[string]bsoncore.Document{
		"double": doc(func(b *bsoncore.DocumentBuilder) { b.AppendString("x", "y").AppendDouble("ok", 1) }),
		"int32":  doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt32("ok", 1) }),
		"int64":  doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt64("ok", 1) }),
		"bool":   doc(func(b *bsoncore.DocumentBuilder) { b.AppendBoolean("ok", true) }),
	} {
		if err := replyOK(d); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	var ce *CommandError
	if err := replyOK(failReply); !errors.As(err, &ce) || ce.Code != 8000 || ce.CodeName != "AtlasError" || ce.Message != "boom" {
		t.Fatalf("failReply: %v", err)
	}
	for name, d := range map[string]bsoncore.Document{
		"missing": doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt32("n", 1) }),
		"false":   doc(func(b *bsoncore.DocumentBuilder) { b.AppendBoolean("ok", false) }),
		"string":  doc(func(b *bsoncore.DocumentBuilder) { b.AppendString("ok", "1") }),
		"zero":    doc(func(b *bsoncore.DocumentBuilder) { b.AppendDouble("ok", 0) }),
	} {
		if err := replyOK(d); !errors.As(err, &ce) {
			t.Errorf("%s: err %v, want a CommandError", name, err)
		}
	}
	var re *ReplyError
	if err := replyOK(bsoncore.Document{1, 0}); !errors.As(err, &re) {
		t.Fatalf("short body: %v", err)
	}
	if err := replyOK(bsoncore.Document{12, 0, 0, 0, 0x10, 'o', 'k', 0, 1, 0, 0, 0}[:12]); !errors.As(err, &re) {
		t.Fatalf("truncated element: %v", err)
	}
}
