package loadgen

import (
	"context"
	"testing"
	"time"
)

// BenchmarkPingClient measures one ping round trip of the generator's
// closed loop against the in-test responder (which does not allocate
// either), so allocs/op is the generator's own per-operation cost. ns/op
// includes the loopback round trip and the responder's work.
func BenchmarkPingClient(b *testing.B) {
	resp := startResponder(b, responderOpts{})
	cfg := Config{Duration: time.Hour, MaxOps: 1 << 62}.withDefaults()
	now := time.Now()
	r := &run{cfg: cfg, measureFrom: now, deadline: now.Add(cfg.Duration)}
	c := newPingClient(r, resp.addr(), 0)
	ctx := context.Background()
	if err := c.connect(ctx); err != nil {
		b.Fatal(err)
	}
	defer c.closeConn()
	b.ReportAllocs()
	for b.Loop() {
		if !r.take() {
			b.Fatal("op budget spent")
		}
		start := time.Now()
		if err := c.roundTrip(c.req, r.opDeadline(start)); err != nil {
			b.Fatal(err)
		}
		c.st.success(r, start, time.Now())
	}
}

// BenchmarkRunPing is the same through Run with 4 clients, to show that
// the per-run setup is amortised and the clients do not contend.
func BenchmarkRunPing(b *testing.B) {
	resp := startResponder(b, responderOpts{})
	b.ReportAllocs()
	b.ResetTimer()
	res, err := Run(context.Background(), resp.addr(), Config{Clients: 4, Duration: time.Minute, MaxOps: int64(b.N)})
	if err != nil {
		b.Fatal(err)
	}
	if res.Errors != 0 || res.Ops != int64(b.N) {
		b.Fatalf("ops %d errors %d, want %d/0", res.Ops, res.Errors, b.N)
	}
	b.ReportMetric(res.OpsPerSec, "ops/s")
}

func BenchmarkReplyOK(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		if replyOK(helloReply) != nil {
			b.Fatal("not ok")
		}
	}
}
