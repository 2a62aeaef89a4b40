// Command mongobouncer-demo runs mongobouncer for real on this machine: it
// starts the embedded FerretDB dev server and the mongobouncer binary on
// loopback, drives a bounded workload of many driver connections through a
// small pool, prints what happened, and stops everything.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/loadgen"
	"github.com/mongobouncer/mongobouncer/internal/testutil/devmongo"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo failed:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		bin      = flag.String("mongobouncer", "bin/mongobouncer", "mongobouncer binary")
		clients  = flag.Int("clients", 100, "concurrent client connections")
		poolSize = flag.Int("pool", 10, "mongobouncer max_pool_size")
		duration = flag.Duration("duration", 10*time.Second, "workload duration")
		mode     = flag.String("pool-mode", "transaction", "pool mode")
	)
	flag.Parse()

	fmt.Println("== starting devmongo (embedded FerretDB, SQLite) ...")
	dm, err := devmongo.StartMain()
	if err != nil {
		return fmt.Errorf("devmongo: %w", err)
	}
	defer dm.Stop()
	fmt.Println("   devmongo listening on", dm.Addr())

	listen, err := freeAddr()
	if err != nil {
		return err
	}
	fmt.Printf("== starting mongobouncer on %s (pool_mode=%s, max_pool_size=%d) ...\n", listen, *mode, *poolSize)
	cmd := exec.Command(*bin, "--listen", listen, "--upstream", "mongodb://"+dm.Addr()+"/",
		"--pool-mode", *mode, "--max-pool-size", strconv.Itoa(*poolSize), "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start mongobouncer: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	defer func() {
		if !stopped {
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	if err := waitListening(listen, 10*time.Second, exited); err != nil {
		return err
	}

	_, port, _ := net.SplitHostPort(dm.Addr())
	sampler := startSampler(port)
	_, listenPort, _ := net.SplitHostPort(listen)
	clientSampler := startSampler(listenPort)
	fmt.Printf("== running: %d clients through a pool of %d for %v ...\n", *clients, *poolSize, *duration)
	ctx, cancel := context.WithTimeout(context.Background(), *duration+30*time.Second)
	defer cancel()
	res, runErr := loadgen.Run(ctx, listen, loadgen.Config{
		Workload:    loadgen.WorkloadDriver,
		Clients:     *clients,
		Duration:    *duration,
		Warmup:      time.Second,
		MaxOps:      50_000_000,
		MaxPoolSize: uint64(*clients),
		Database:    "demo",
	})
	maxUp := sampler.stop()
	maxClients := clientSampler.stop()

	fmt.Println("== results")
	if runErr != nil && !errors.Is(runErr, loadgen.ErrNoMeasurement) {
		fmt.Println("   workload error:", runErr)
	}
	fmt.Printf("   operations:      %d (%.0f ops/s)\n", res.Ops, res.OpsPerSec)
	fmt.Printf("   latency:         p50 %v, p99 %v, max %v\n", res.Latency.P50.Round(time.Microsecond),
		res.Latency.P99.Round(time.Microsecond), res.Latency.Max.Round(time.Microsecond))
	fmt.Printf("   errors:          %d\n", res.Errors)
	for _, e := range res.ErrorSamples {
		fmt.Println("     -", e)
	}
	fmt.Printf("   client conns:    at most %d open to mongobouncer (%d workers, a driver pool of up to %d)\n", maxClients, *clients, *clients)
	fmt.Printf("   upstream conns:  at most %d open to devmongo (pool of %d, plus 1 monitoring connection)\n", maxUp, *poolSize)
	fmt.Println("   (the rate is FerretDB+SQLite's own; direct connections get the same: see docs/performance.md)")

	fmt.Println("== stopping mongobouncer (SIGTERM) ...")
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		stopped = true
		if err != nil {
			return fmt.Errorf("mongobouncer exited: %w", err)
		}
		fmt.Println("   mongobouncer exited cleanly")
	case <-time.After(40 * time.Second):
		return errors.New("mongobouncer did not stop within 40s")
	}
	if runErr != nil || res.Errors > 0 || maxUp > *poolSize+1 {
		return fmt.Errorf("demo saw errors or too many upstream connections")
	}
	return nil
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func waitListening(addr string, d time.Duration, exited <-chan error) error {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return fmt.Errorf("mongobouncer exited early: %v", err)
		default:
		}
		if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("mongobouncer not listening on %s after %v", addr, d)
}

// sampler counts established TCP connections to the upstream port, read
// from /proc/net/tcp: what the upstream really sees, independent of
// mongobouncer's own accounting.
type sampler struct {
	mu   sync.Mutex
	max  int
	done chan struct{}
	wg   sync.WaitGroup
}

func startSampler(port string) *sampler {
	p, _ := strconv.Atoi(port)
	hexPort := fmt.Sprintf("%04X", p)
	s := &sampler{done: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			n := countEstablished(hexPort)
			s.mu.Lock()
			s.max = max(s.max, n)
			s.mu.Unlock()
			select {
			case <-s.done:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *sampler) stop() int {
	close(s.done)
	s.wg.Wait()
	return s.max
}

// countEstablished counts ESTABLISHED sockets whose remote port is port
// (the client ends of connections to the upstream).
func countEstablished(hexPort string) int {
	n := 0
	for _, path := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 4 || fields[3] != "01" {
				continue
			}
			if i := strings.LastIndexByte(fields[2], ':'); i >= 0 && fields[2][i+1:] == hexPort {
				n++
			}
		}
		f.Close()
	}
	return n
}
