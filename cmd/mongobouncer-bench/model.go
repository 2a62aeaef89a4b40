// The capacity-model upstream of -sweep (-model): fakemongo serving every
// command with k workers of a fixed service time, in this process, so that
// the right pool size is known (about k) and the latency is sleeps rather
// than the CPU of a shared machine. And -auto-bin, the builds whose "auto"
// runs another limiter algorithm.

package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
)

// parseModel parses -model: "WORKERS,SERVICE[,CONTENTION]", e.g. 8,5ms,0.3.
func parseModel(s string) (*fakemongo.Capacity, error) {
	parts := strings.Split(s, ",")
	if len(parts) < 2 || len(parts) > 3 {
		return nil, errors.New("want WORKERS,SERVICE[,CONTENTION]")
	}
	k, err := strconv.Atoi(strings.TrimSpace(parts[0]))
	if err != nil || k < 1 {
		return nil, fmt.Errorf("bad worker count %q", parts[0])
	}
	svc, err := time.ParseDuration(strings.TrimSpace(parts[1]))
	if err != nil || svc <= 0 {
		return nil, fmt.Errorf("bad service time %q", parts[1])
	}
	c := &fakemongo.Capacity{Workers: k, Service: svc}
	if len(parts) == 3 {
		if c.Contention, err = strconv.ParseFloat(strings.TrimSpace(parts[2]), 64); err != nil || c.Contention < 0 {
			return nil, fmt.Errorf("bad contention %q", parts[2])
		}
	}
	return c, nil
}

// startModel starts the capacity-model upstream on a loopback port; the
// caller closes it.
func startModel(c *fakemongo.Capacity) (*fakemongo.Server, error) {
	return fakemongo.Listen("127.0.0.1:0", fakemongo.Options{Capacity: c})
}

// parseAutoBins parses -auto-bin: "NAME=PATH,..." for sizes "auto-NAME".
func parseAutoBins(s string) (map[string]string, error) {
	out := map[string]string{}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, path, ok := strings.Cut(part, "=")
		if !ok || name == "" || path == "" {
			return nil, fmt.Errorf("bad %q (want NAME=PATH)", part)
		}
		out[name] = path
	}
	return out, nil
}
