// Connection counts per process, read from /proc, for the demo's table.

package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// connSampler counts, every interval, the established TCP connections that
// process pid (0: this one) holds to a port.
// It reads /proc, not any process's own accounting: the sockets of pid
// (/proc/PID/fd) matched by inode with /proc/net/tcp's rows, so the count
// of one process is not mixed with another's connections to the same port
// (mongobouncer's pool stays open while the direct run goes on).
type connSampler struct {
	mu sync.Mutex
	// samples is guarded by mu.
	samples []connSample
	done    chan struct{}
	wg      sync.WaitGroup
}

// connSample is one count and when it was read.
type connSample struct {
	at time.Time
	n  int
}

// maxIn is the highest count read between from and to, or 0.
func maxIn(samples []connSample, from, to time.Time) int {
	m := 0
	for _, s := range samples {
		if !s.at.Before(from) && !s.at.After(to) {
			m = max(m, s.n)
		}
	}
	return m
}

// sampleInterval is how often a connSampler reads /proc.
const sampleInterval = 100 * time.Millisecond

func startConnSampler(pid, port int) *connSampler {
	s := &connSampler{done: make(chan struct{})}
	s.wg.Go(func() {
		t := time.NewTicker(sampleInterval)
		defer t.Stop()
		for {
			n := countConns(pid, port)
			s.mu.Lock()
			s.samples = append(s.samples, connSample{at: time.Now(), n: n})
			s.mu.Unlock()
			select {
			case <-s.done:
				return
			case <-t.C:
			}
		}
	})
	return s
}

// stop ends the sampling and returns the highest count read between from
// and to: the run's measured window, so that the connections a driver opens
// and closes while it sets up or tears down are not counted.
func (s *connSampler) stop(from, to time.Time) int {
	close(s.done)
	s.wg.Wait()
	return maxIn(s.samples, from, to)
}

// countConns counts pid's established connections to port.
func countConns(pid, port int) int {
	inodes := socketInodes(pid)
	if len(inodes) == 0 {
		return 0
	}
	n := 0
	seen := map[string]bool{}
	for _, path := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		n += countTCPRows(bufio.NewScanner(f), port, inodes, seen)
		f.Close()
	}
	return n
}

// countTCPRows counts the sockets of a /proc/net/tcp table that are
// established (st 01), whose remote port is port and whose inode is in
// inodes, each once: the kernel builds the table as it is read, so a
// socket can show twice while others open and close (a count of 6 for 3
// sockets in make test). seen holds the inodes counted already.
func countTCPRows(sc *bufio.Scanner, port int, inodes, seen map[string]bool) int {
	hexPort := fmt.Sprintf(":%04X", port)
	n := 0
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// sl local rem st tx:rx tr:when retrnsmt uid timeout inode
		if len(f) < 10 || f[3] != "01" || !strings.HasSuffix(f[2], hexPort) || !inodes[f[9]] || seen[f[9]] {
			continue
		}
		seen[f[9]] = true
		n++
	}
	return n
}

// socketInodes returns the inodes of pid's sockets.
func socketInodes(pid int) map[string]bool {
	dir := "/proc/self/fd"
	if pid != 0 {
		dir = "/proc/" + strconv.Itoa(pid) + "/fd"
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	out := make(map[string]bool, len(ents))
	for _, e := range ents {
		l, err := os.Readlink(dir + "/" + e.Name())
		if err != nil {
			continue
		}
		if ino, ok := strings.CutPrefix(l, "socket:["); ok {
			out[strings.TrimSuffix(ino, "]")] = true
		}
	}
	return out
}
