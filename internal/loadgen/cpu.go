package loadgen

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Process is a process whose CPU time Compare reads before and after each
// run. On a machine where the load tool, the upstream and the proxy share
// the cores, throughput follows the CPU that all of them spend per
// operation; reading it per process shows where a proxied operation's
// extra cost goes, the proxy's own share and what it makes its peers spend.
type Process struct {
	// Name labels the process in reports ("bench", "upstream", ...).
	Name string
	// PID is the process; 0 means the load tool itself.
	PID int
	// ProxiedOnly counts the process on the proxied side only: the proxy
	// is idle during direct runs, and its heartbeats are not direct
	// traffic.
	ProxiedOnly bool
}

// ProcessCPU is one process's CPU time over the runs of one side.
type ProcessCPU struct {
	// Name is the Process's Name.
	Name string `json:"name"`
	// Total is the user+system CPU time over the side's runs, warm-up
	// included.
	Total time.Duration `json:"total_ns"`
	// PerOp is Total over the operations the runs completed, warm-up
	// included.
	PerOp time.Duration `json:"per_op_ns"`
}

// cpuSample is the CPU time of each Process at one instant; a process
// whose time could not be read is marked so and left out.
type cpuSample struct {
	t  []time.Duration
	ok []bool
}

func sampleCPU(ps []Process) cpuSample {
	s := cpuSample{t: make([]time.Duration, len(ps)), ok: make([]bool, len(ps))}
	for i, p := range ps {
		t, err := ProcessCPUTime(p.PID)
		s.t[i], s.ok[i] = t, err == nil
	}
	return s
}

// addCPU adds the CPU the processes spent between a and b, over a run that
// completed ops operations, to s.
func (s *SideSummary) addCPU(ps []Process, proxied bool, a, b cpuSample, ops int64) {
	s.completed += ops
	for i, p := range ps {
		if (p.ProxiedOnly && !proxied) || !a.ok[i] || !b.ok[i] {
			continue
		}
		j := slices.IndexFunc(s.CPU, func(c ProcessCPU) bool { return c.Name == p.Name })
		if j < 0 {
			s.CPU = append(s.CPU, ProcessCPU{Name: p.Name})
			j = len(s.CPU) - 1
		}
		s.CPU[j].Total += b.t[i] - a.t[i]
	}
	for k := range s.CPU {
		if s.completed > 0 {
			s.CPU[k].PerOp = s.CPU[k].Total / time.Duration(s.completed)
		}
	}
}

// CPUPerOp is the sum over the side's processes of their CPU per
// operation; 0 when none was measured.
func (s *SideSummary) CPUPerOp() time.Duration {
	var sum time.Duration
	for _, c := range s.CPU {
		sum += c.PerOp
	}
	return sum
}

// ProcessCPU returns the CPU of the process named name, and whether it was
// measured.
func (s *SideSummary) ProcessCPU(name string) (ProcessCPU, bool) {
	if j := slices.IndexFunc(s.CPU, func(c ProcessCPU) bool { return c.Name == name }); j >= 0 {
		return s.CPU[j], true
	}
	return ProcessCPU{}, false
}

// writeCPU prints the CPU per operation of both sides, when measured.
func (r *Report) writeCPU(w io.Writer) error {
	if len(r.Direct.CPU) == 0 || len(r.Proxied.CPU) == 0 {
		return nil
	}
	side := func(s *SideSummary) string {
		parts := make([]string, len(s.CPU))
		for i, c := range s.CPU {
			parts[i] = c.Name + " " + us(c.PerOp)
		}
		return strings.Join(parts, " + ") + " = " + us(s.CPUPerOp())
	}
	_, err := fmt.Fprintf(w, "CPU per operation (user+system, warm-up included): direct %s; proxied %s; direct/proxied %.3f\n",
		side(&r.Direct), side(&r.Proxied), r.CPURatio)
	return err
}
