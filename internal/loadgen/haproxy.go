// HAProxy as a reference: a production TCP relay (Debian's haproxy
// package) in front of the same upstream as mongobouncer, measured in the
// same run. Like the project's own relays (relay.go) it gives every client
// a dedicated upstream connection and copies bytes, with no pooling and no
// protocol work; unlike them it is what an operator would deploy instead of
// a pooler, so "at least as fast as HAProxy" is a claim a reader can check.

package loadgen

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrNoHAProxy reports that no haproxy binary was found; a comparison then
// skips the HAProxy column.
var ErrNoHAProxy = errors.New("loadgen: haproxy not found (as root: make haproxy, or apt-get install haproxy)")

// haproxyFDReserve is what HAProxy needs besides its connections: its
// listener, pollers, the per-thread pipes and the standard streams.
const haproxyFDReserve = 100

// haproxyStartTimeout bounds the wait for a started HAProxy to listen.
const haproxyStartTimeout = 10 * time.Second

// HAProxyOptions configures StartHAProxy. Zero fields take defaults.
type HAProxyOptions struct {
	// Binary is the haproxy executable; "" looks "haproxy" up in PATH and
	// then /usr/sbin.
	Binary string
	// Listen is the loopback address to serve on; "" picks a free port.
	Listen string
	// Upstream is the server every client connection is relayed to.
	Upstream string
	// Balance, when set, replaces Upstream: client connections are
	// balanced over these servers (HAProxyBalancedConfig).
	Balance []string
	// Threads is nbthread; 0 means one per CPU.
	Threads int
	// MaxConn is maxconn, the client connections HAProxy accepts at once;
	// 0 sizes it to the open-file limit (HAProxyMaxConn).
	MaxConn int
	// Config, when set, is the whole configuration to run instead of
	// HAProxyConfig's (BalancerConfig's, say); it must bind Listen, which
	// must then be set, and Upstream, Threads and MaxConn are ignored.
	Config string
}

// HAProxyMaxConn is the maxconn that fits an open-file limit: each client
// connection costs HAProxy two descriptors (the client's and the
// upstream's), and haproxyFDReserve more are kept aside.
func HAProxyMaxConn(fileLimit uint64) int {
	if fileLimit <= 2*haproxyFDReserve {
		return 1
	}
	return int(min((fileLimit-haproxyFDReserve)/2, 1<<30))
}

// HAProxyConfig is the configuration StartHAProxy runs: TCP mode, one
// frontend on listen, one backend server (the upstream), no health checks
// (the upstream is ours and up), no logging, and timeouts long enough for
// idle clients.
func HAProxyConfig(listen, upstream string, threads, maxConn int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `# Written by mongobouncer's load tool (internal/loadgen/haproxy.go):
# a plain TCP relay, one upstream connection per client, no pooling.
global
    nbthread %d
    maxconn %d

defaults
    mode tcp
    timeout connect 5s
    timeout client 1h
    timeout server 1h
    maxconn %d

frontend mongo
    bind %s
    default_backend upstream

backend upstream
    server upstream %s
`, threads, maxConn, maxConn, listen, upstream)
	return b.String()
}

// BalancerServer is one server behind BalancerConfig's frontend.
type BalancerServer struct {
	// Addr is where client connections go (a mongobouncer's listen).
	Addr string
	// Check is the host:port of its admin listener, whose /readyz the
	// health check asks.
	Check string
}

// BalancerConfig is HAProxy in TCP mode balancing clients over several
// mongobouncer instances, as a Kubernetes Service (or a cloud TCP load
// balancer) does: round robin, each server health-checked every 500 ms
// with GET /readyz on its admin port, out after one failure and back after
// two successes, and a connection whose server refuses it redispatched to
// another (retries 3). Nothing is logged.
func BalancerConfig(listen string, servers []BalancerServer) string {
	var b strings.Builder
	fmt.Fprintf(&b, `# Written by mongobouncer's load tool (internal/loadgen/haproxy.go):
# a TCP balancer over mongobouncer instances, health-checked on /readyz.
global
    maxconn 4000

defaults
    mode tcp
    timeout connect 2s
    timeout client 1h
    timeout server 1h
    timeout check 2s
    retries 3
    option redispatch

frontend mongo
    bind %s
    default_backend bouncers

backend bouncers
    balance roundrobin
    option httpchk GET /readyz
    http-check expect status 200
`, listen)
	for i, s := range servers {
		host, port, _ := net.SplitHostPort(s.Check)
		fmt.Fprintf(&b, "    server b%d %s check addr %s port %s inter 500ms fall 1 rise 2\n", i, s.Addr, host, port)
	}
	return b.String()
}

// HAProxy is a running HAProxy started by StartHAProxy.
type HAProxy struct {
	cmd    *exec.Cmd
	exited chan struct{}
	// waitErr is cmd.Wait's result, set before exited is closed.
	waitErr error
	dir     string
	addr    string
	// Config is the configuration it runs.
	Config string
	stderr *headWriter
	once   sync.Once
}

// FindHAProxy returns the haproxy binary to run: bin itself when set, else
// "haproxy" in PATH or /usr/sbin/haproxy (Debian puts it there, outside a
// non-root PATH). It returns ErrNoHAProxy when there is none.
func FindHAProxy(bin string) (string, error) {
	if bin != "" {
		p, err := exec.LookPath(bin)
		if err != nil {
			return "", fmt.Errorf("%w: %v", ErrNoHAProxy, err)
		}
		return p, nil
	}
	if p, err := exec.LookPath("haproxy"); err == nil {
		return p, nil
	}
	if st, err := os.Stat("/usr/sbin/haproxy"); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
		return "/usr/sbin/haproxy", nil
	}
	return "", ErrNoHAProxy
}

// StartHAProxy writes a configuration (HAProxyConfig) to a temporary
// directory, starts HAProxy in the foreground on it, and returns once it
// accepts connections. Stop ends it and removes the directory. ctx bounds
// the start only.
func StartHAProxy(ctx context.Context, o HAProxyOptions) (*HAProxy, error) {
	bin, err := FindHAProxy(o.Binary)
	if err != nil {
		return nil, err
	}
	if o.Config != "" && o.Listen == "" {
		return nil, fmt.Errorf("%w: an HAProxy configuration given whole needs its Listen address", ErrInvalidConfig)
	}
	if o.Upstream == "" && o.Config == "" && len(o.Balance) == 0 {
		return nil, fmt.Errorf("%w: HAProxy needs an upstream address", ErrInvalidConfig)
	}
	if o.Threads <= 0 {
		o.Threads = runtime.NumCPU()
	}
	if o.MaxConn <= 0 {
		limit, err := RaiseFileLimit()
		if err != nil {
			return nil, err
		}
		o.MaxConn = HAProxyMaxConn(limit)
	}
	if o.Listen == "" {
		if o.Listen, err = freeLoopbackAddr(); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "mongobouncer-haproxy-")
	if err != nil {
		return nil, err
	}
	h := &HAProxy{dir: dir, addr: o.Listen, exited: make(chan struct{}), stderr: &headWriter{max: 4096}, Config: o.Config}
	switch {
	case h.Config != "":
	case len(o.Balance) > 0:
		h.Config = HAProxyBalancedConfig(o.Listen, o.Balance, o.Threads, o.MaxConn)
	default:
		h.Config = HAProxyConfig(o.Listen, o.Upstream, o.Threads, o.MaxConn)
	}
	cfgPath := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(cfgPath, []byte(h.Config), 0o600); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	// -db: stay in the foreground, no daemon, so the PID is HAProxy's own
	// (its CPU time is read from /proc) and its exit is seen here.
	h.cmd = exec.Command(bin, "-db", "-f", cfgPath)
	h.cmd.Stdout, h.cmd.Stderr = h.stderr, h.stderr
	killWithParent(h.cmd)
	if err := h.cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	go func() {
		h.waitErr = h.cmd.Wait()
		close(h.exited)
	}()
	if err := h.waitListening(ctx); err != nil {
		h.Stop()
		return nil, err
	}
	return h, nil
}

// waitListening polls the listen address until it accepts, HAProxy exits,
// ctx ends or haproxyStartTimeout passes.
func (h *HAProxy) waitListening(ctx context.Context) error {
	deadline := time.Now().Add(haproxyStartTimeout)
	for {
		select {
		case <-h.exited:
			return fmt.Errorf("loadgen: haproxy exited at start (%v): %s", h.waitErr, strings.TrimSpace(h.stderr.String()))
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if c, err := net.DialTimeout("tcp", h.addr, 200*time.Millisecond); err == nil {
			_ = c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("loadgen: haproxy not listening on %s after %v: %s", h.addr, haproxyStartTimeout, strings.TrimSpace(h.stderr.String()))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Addr is the address HAProxy listens on.
func (h *HAProxy) Addr() string { return h.addr }

// PID is HAProxy's process ID, for its CPU time.
func (h *HAProxy) PID() int { return h.cmd.Process.Pid }

// Stop ends HAProxy (SIGTERM, then SIGKILL after 5 s) and removes its
// configuration directory.
func (h *HAProxy) Stop() {
	h.once.Do(func() {
		_ = h.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-h.exited:
		case <-time.After(5 * time.Second):
			_ = h.cmd.Process.Kill()
			<-h.exited
		}
		_ = os.RemoveAll(h.dir)
	})
}

// freeLoopbackAddr returns a loopback address with a port free now.
func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// headWriter keeps the first max bytes written to it: HAProxy's start-up
// messages, for the error when it fails.
type headWriter struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (w *headWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if room := w.max - len(w.b); room > 0 {
		w.b = append(w.b, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (w *headWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.b)
}
