package main

import (
	"bufio"
	"errors"
	"flag"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/loadgen"
)

func TestParseArgsDefaults(t *testing.T) {
	a, err := parseArgs(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if a.bin != "bin/mongobouncer" || !slices.Equal(a.clients, []int{100, 10}) || a.pool != 10 ||
		a.duration != 6*time.Second || a.warmup != 1500*time.Millisecond || a.mode != "transaction" || a.noHAProxy {
		t.Fatalf("defaults %+v", a)
	}
	// The demo stays bounded: targets x passes x counts x duration, plus a
	// warm-up run, under two minutes with three targets.
	if total := time.Duration(3*passes*len(a.clients))*a.duration + a.warmup; total > 90*time.Second {
		t.Fatalf("default runs take %v", total)
	}
}

func TestParseArgs(t *testing.T) {
	a, err := parseArgs([]string{"-mongobouncer", "/x/mb", "-clients", "50, 5", "-pool", "4", "-duration", "4s",
		"-pool-mode", "statement", "-no-haproxy", "-haproxy", "/opt/haproxy"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if a.bin != "/x/mb" || !slices.Equal(a.clients, []int{50, 5}) || a.pool != 4 || a.duration != 4*time.Second ||
		a.warmup != time.Second || a.mode != "statement" || !a.noHAProxy || a.haproxy != "/opt/haproxy" {
		t.Fatalf("parsed %+v", a)
	}
	for _, bad := range [][]string{
		{"-clients", "0"}, {"-clients", "1001"}, {"-clients", "ten"}, {"-clients", ""},
		{"-pool", "0"}, {"-duration", "1s"}, {"-duration", "2m"}, {"-pool-mode", "none"},
		{"extra"}, {"-nosuchflag"},
	} {
		if _, err := parseArgs(bad, io.Discard); err == nil {
			t.Errorf("parseArgs(%q) accepted", bad)
		}
	}
	if _, err := parseArgs([]string{"-h"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}

func TestCountTCPRows(t *testing.T) {
	// Two established connections to port 0x6989 (27017), one of them
	// another process's (inode 9), one in TIME_WAIT (06), one to another
	// port.
	table := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:A001 0100007F:6989 01 00000000:00000000 00:00000000 00000000     0        0 101 1 0000000000000000 20 4 30 10 -1
   1: 0100007F:A002 0100007F:6989 01 00000000:00000000 00:00000000 00000000     0        0 102 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:A003 0100007F:6989 01 00000000:00000000 00:00000000 00000000     0        0 9 1 0000000000000000 20 4 30 10 -1
   3: 0100007F:A004 0100007F:6989 06 00000000:00000000 00:00000000 00000000     0        0 103 1 0000000000000000 20 4 30 10 -1
   4: 0100007F:A005 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 104 1 0000000000000000 20 4 30 10 -1
`
	inodes := map[string]bool{"101": true, "102": true, "103": true, "104": true}
	if n := countTCPRows(bufio.NewScanner(strings.NewReader(table)), 27017, inodes, map[string]bool{}); n != 2 {
		t.Fatalf("counted %d, want 2", n)
	}
}

// A socket listed twice (the table changed while it was read) counts once.
func TestCountTCPRowsOncePerSocket(t *testing.T) {
	row := "   0: 0100007F:A001 0100007F:6989 01 00000000:00000000 00:00000000 00000000     0        0 101 1 0000000000000000 20 4 30 10 -1\n"
	table := "  sl  local_address rem_address   st\n" + row + row
	if n := countTCPRows(bufio.NewScanner(strings.NewReader(table)), 27017, map[string]bool{"101": true}, map[string]bool{}); n != 1 {
		t.Fatalf("counted %d, want 1", n)
	}
}

// countConns sees this process's own connections to a loopback port, and
// not those the other end holds.
func TestCountConnsOwnSockets(t *testing.T) {
	if _, err := os.Stat("/proc/net/tcp"); err != nil {
		t.Skip("no /proc/net/tcp here")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 3 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		s, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, s)
	}
	// The accepted ends' remote ports are the clients' ephemeral ports,
	// not port: only the 3 dialled ends count.
	if n := countConns(0, port); n != 3 {
		t.Fatalf("countConns = %d, want 3", n)
	}
	if n := countConns(0, port+1); n != 0 && port+1 < 65536 {
		t.Fatalf("countConns on another port = %d, want 0", n)
	}
}

func TestMaxIn(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	samples := []connSample{{at(0), 40}, {at(100), 11}, {at(200), 12}, {at(300), 11}, {at(400), 25}}
	if got := maxIn(samples, at(100), at(300)); got != 12 {
		t.Errorf("maxIn over the window = %d, want 12 (the ramp and the teardown left out)", got)
	}
	if got := maxIn(samples, at(0), at(400)); got != 40 {
		t.Errorf("maxIn over everything = %d, want 40", got)
	}
	if got := maxIn(samples, at(500), at(600)); got != 0 {
		t.Errorf("maxIn over an empty window = %d, want 0", got)
	}
}

func TestRunOrder(t *testing.T) {
	for i, want := range [][]int{{0, 1, 2, 2, 1, 0}, {2, 1, 0, 0, 1, 2}, {0, 1, 2, 2, 1, 0}} {
		if got := runOrder(3, i); !slices.Equal(got, want) {
			t.Errorf("runOrder(3, %d) = %v, want %v", i, got, want)
		}
	}
}

// A target's two runs make one row: figures added, the larger connection
// counts (which check holds to the pool), the first error kept.
func TestResultMergeRow(t *testing.T) {
	boom := errors.New("boom")
	r := result{res: loadgen.Result{Ops: 10, Elapsed: time.Second}, clientsN: 101, upN: 11}
	r.merge(result{res: loadgen.Result{Ops: 30, Elapsed: time.Second}, err: boom, clientsN: 100, upN: 13})
	if r.res.Ops != 40 || r.res.OpsPerSec != 20 || r.clientsN != 101 || r.upN != 13 || !errors.Is(r.err, boom) {
		t.Fatalf("merged %+v", r)
	}
	if out := check(demoArgs{pool: 10}, []result{{}, r}); len(out) != 2 {
		t.Errorf("check of a row with 13 upstream connections and an error: %q", out)
	}
}
