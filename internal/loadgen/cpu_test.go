package loadgen

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestAddCPU(t *testing.T) {
	ps := []Process{{Name: "bench"}, {Name: "upstream", PID: 2}, {Name: "proxy", PID: 3, ProxiedOnly: true}, {Name: "gone", PID: 4}}
	sample := func(b, u, p time.Duration) cpuSample {
		return cpuSample{t: []time.Duration{b, u, p, 0}, ok: []bool{true, true, true, false}}
	}
	var r Report
	// Two direct runs of 100 and 300 operations; the proxy's CPU during
	// them is not direct traffic.
	r.Direct.addCPU(ps, false, sample(0, 0, 0), sample(100*time.Microsecond, 200*time.Microsecond, time.Second), 100)
	r.Direct.addCPU(ps, false, sample(time.Second, time.Second, time.Second), sample(time.Second+300*time.Microsecond, time.Second+600*time.Microsecond, 2*time.Second), 300)
	r.Proxied.addCPU(ps, true, sample(0, 0, 0), sample(200*time.Microsecond, 200*time.Microsecond, 400*time.Microsecond), 100)
	r.finish()

	if len(r.Direct.CPU) != 2 {
		t.Fatalf("direct CPU %+v: want bench and upstream only", r.Direct.CPU)
	}
	if c, ok := r.Direct.ProcessCPU("upstream"); !ok || c.Total != 800*time.Microsecond || c.PerOp != 2*time.Microsecond {
		t.Fatalf("direct upstream %+v", c)
	}
	if _, ok := r.Direct.ProcessCPU("gone"); ok {
		t.Fatal("an unreadable process was reported")
	}
	if got := r.Direct.CPUPerOp(); got != 3*time.Microsecond {
		t.Fatalf("direct CPU per op %v, want 3µs", got)
	}
	if c, ok := r.Proxied.ProcessCPU("proxy"); !ok || c.PerOp != 4*time.Microsecond {
		t.Fatalf("proxied proxy %+v", c)
	}
	if got := r.Proxied.CPUPerOp(); got != 8*time.Microsecond {
		t.Fatalf("proxied CPU per op %v, want 8µs", got)
	}
	if r.CPURatio != 3.0/8 {
		t.Fatalf("CPU ratio %v, want 0.375", r.CPURatio)
	}
	var out bytes.Buffer
	if err := r.writeCPU(&out); err != nil {
		t.Fatal(err)
	}
	want := "direct bench 1.0µs + upstream 2.0µs = 3.0µs; proxied bench 2.0µs + upstream 2.0µs + proxy 4.0µs = 8.0µs; direct/proxied 0.375"
	if !strings.Contains(out.String(), want) {
		t.Fatalf("CPU line %q lacks %q", out.String(), want)
	}

	// Nothing measured: no line, no ratio.
	var empty Report
	empty.finish()
	out.Reset()
	if err := empty.writeCPU(&out); err != nil || out.Len() != 0 || empty.CPURatio != 0 {
		t.Fatalf("empty report printed %q, ratio %v", out.String(), empty.CPURatio)
	}
}
