// The references -ref starts beside mongobouncer: HAProxy and the
// project's relays, each in a process of its own in front of the upstream.

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"

	"github.com/mongobouncer/mongobouncer/internal/loadgen"
	"github.com/mongobouncer/mongobouncer/internal/uring"
)

// Reference names accepted by -ref. The relays are the project's own
// (internal/loadgen/relay*.go); haproxy is Debian's HAProxy in TCP mode.
const (
	refHAProxy        = "haproxy"
	refRelayGoroutine = "relay-goroutine"
	refRelayEpoll     = "relay-epoll"
	refRelayUring     = "relay-uring"
)

// refRelayKinds maps a relay reference to its kind.
var refRelayKinds = map[string]loadgen.RelayKind{
	refRelayGoroutine: loadgen.RelayGoroutine,
	refRelayEpoll:     loadgen.RelayEpoll,
	refRelayUring:     loadgen.RelayUring,
}

// parseRefs parses -ref: comma-separated reference names, in the order
// they are to be measured, without duplicates. "relays" stands for every
// project relay this machine can run (what -reference means).
func parseRefs(s string) ([]string, error) {
	var out []string
	add := func(n string) {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	for part := range strings.SplitSeq(s, ",") {
		switch n := strings.TrimSpace(part); n {
		case "":
		case "relays":
			add(refRelayGoroutine)
			add(refRelayEpoll)
			if uring.Supported() {
				add(refRelayUring)
			}
		case refHAProxy, refRelayGoroutine, refRelayEpoll, refRelayUring:
			add(n)
		default:
			return nil, fmt.Errorf("unknown reference %q (want %s, %s, %s, %s or relays)", n, refHAProxy, refRelayGoroutine, refRelayEpoll, refRelayUring)
		}
	}
	return out, nil
}

// parseCounts parses a comma-separated list of positive counts (-clients,
// -idle).
func parseCounts(s string) ([]int, error) {
	var out []int
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		n, err := strconv.Atoi(part)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("bad count %q", part)
		}
		out = append(out, n)
	}
	return out, nil
}

// target is one proxy measured against direct traffic: mongobouncer or a
// reference.
type target struct {
	// name labels it in tables and JSON ("mongobouncer", "haproxy", a
	// relay kind).
	name string
	addr string
	// proc is its process, for CPU time (0: not measured).
	proc int
	// procName labels its CPU in the report.
	procName string
	stop     func()
}

// startRefs starts each reference in front of upstream. A missing haproxy
// binary is said on w and skipped; anything else that fails to start stops
// what was started and fails.
func startRefs(ctx context.Context, names []string, upstream, haproxyBin string, w io.Writer) ([]target, error) {
	var out []target
	fail := func(err error) ([]target, error) {
		for _, t := range out {
			t.stop()
		}
		return nil, err
	}
	for _, n := range names {
		if n == refHAProxy {
			h, err := loadgen.StartHAProxy(ctx, loadgen.HAProxyOptions{Binary: haproxyBin, Upstream: upstream})
			if errors.Is(err, loadgen.ErrNoHAProxy) {
				fmt.Fprintf(w, "haproxy: skipped: %v\n", err)
				continue
			}
			if err != nil {
				return fail(err)
			}
			out = append(out, target{name: refHAProxy, addr: h.Addr(), proc: h.PID(), procName: "haproxy", stop: h.Stop})
			continue
		}
		kind := refRelayKinds[n]
		if kind == loadgen.RelayUring && !uring.Supported() {
			fmt.Fprintf(w, "%s: skipped: io_uring is not available here\n", n)
			continue
		}
		self, err := os.Executable()
		if err != nil {
			return fail(err)
		}
		proc, addr, err := startAnnouncing(exec.Command(self, relayFlag, string(kind), upstream))
		if err != nil {
			return fail(fmt.Errorf("start %s relay: %w", kind, err))
		}
		out = append(out, target{name: string(kind), addr: addr, proc: proc.cmd.Process.Pid,
			procName: string(kind) + "-relay", stop: proc.stop})
	}
	return out, nil
}
