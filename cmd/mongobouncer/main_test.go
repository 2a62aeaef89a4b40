package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.uber.org/goleak"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/sdnotify"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/logbuf"
	"github.com/mongobouncer/mongobouncer/internal/testutil/seccomp"
	"github.com/mongobouncer/mongobouncer/internal/uring"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

func TestMain(m *testing.M) {
	// go test run by a systemd service must not tell that service what
	// the mongobouncers started here do; TestSystemdNotify sets its own.
	os.Unsetenv(sdnotify.EnvSocket)
	goleak.VerifyTestMain(m)
}

func TestVersionHelpAndUsageErrors(t *testing.T) {
	var out, errb logbuf.Buffer
	if code := run([]string{"--version"}, &out, &errb, nil); code != 0 || !strings.Contains(out.String(), "mongobouncer ") {
		t.Fatalf("--version: %d %q", code, out.String())
	}
	if code := run([]string{"--help"}, &out, &errb, nil); code != 0 || !strings.Contains(errb.String(), "--upstream") && !strings.Contains(errb.String(), "-upstream") {
		t.Fatalf("--help: %d %q", code, errb.String())
	}
	for _, args := range [][]string{{}, {"--nope"}, {"extra"}, {"--upstream", "mongodb://x/", "--pool-mode", "sessions"}} {
		var e logbuf.Buffer
		if code := run(args, &out, &e, nil); code != 2 || e.String() == "" {
			t.Fatalf("%v: exit %d, stderr %q", args, code, e.String())
		}
	}
}

func TestBadConfigFileNamesFileAndLine(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "mb.toml")
	os.WriteFile(path, []byte("[mongobouncer]\nlisten = \"127.0.0.1:0\"\nmax_pool = 3\n\n[databases.\"*\"]\nconnection_string = \"mongodb://127.0.0.1:1/\"\n"), 0o600)
	var out, errb logbuf.Buffer
	if code := run([]string{"--config", path}, &out, &errb, nil); code != 2 {
		t.Fatalf("exit %d", code)
	}
	if !strings.Contains(errb.String(), "mb.toml:3") || !strings.Contains(errb.String(), "max_pool_size") {
		t.Fatalf("message does not name file:line and the fix: %q", errb.String())
	}
}

// TestCheckValidatesWithoutServing: --check says whether a configuration
// would start, without binding its listeners (the address here is taken, so
// a start would fail) or reaching its upstream.
func TestCheckValidatesWithoutServing(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	dir := t.TempDir()
	good := filepath.Join(dir, "good.toml")
	os.WriteFile(good, []byte("[mongobouncer]\nlisten = \""+taken.Addr().String()+"\"\n\n[databases.\"*\"]\nconnection_string = \"mongodb://127.0.0.1:1/\"\n"), 0o600)
	bad := filepath.Join(dir, "bad.toml")
	os.WriteFile(bad, []byte("[mongobouncer]\nlisten = \"127.0.0.1:0\"\nshutdown_timeout = \"soon\"\n\n[databases.\"*\"]\nconnection_string = \"mongodb://127.0.0.1:1/\"\n"), 0o600)

	var out, errb logbuf.Buffer
	if code := run([]string{"--config", good, "--check"}, &out, &errb, nil); code != 0 || strings.TrimSpace(out.String()) != "configuration ok" {
		t.Fatalf("valid file: exit %d, stdout %q, stderr %q", code, out.String(), errb.String())
	}
	var out2, errb2 logbuf.Buffer
	if code := run([]string{"--config", bad, "--check"}, &out2, &errb2, nil); code != 2 || !strings.Contains(errb2.String(), "bad.toml:3") || out2.String() != "" {
		t.Fatalf("invalid file: exit %d, stdout %q, stderr %q", code, out2.String(), errb2.String())
	}
	// The flags are applied before the check, as at startup.
	var out3, errb3 logbuf.Buffer
	if code := run([]string{"--config", good, "--pool-mode", "sessions", "--check"}, &out3, &errb3, nil); code != 2 || !strings.Contains(errb3.String(), "pool_mode") {
		t.Fatalf("invalid flag: exit %d, stdout %q, stderr %q", code, out3.String(), errb3.String())
	}
}

func TestPortInUseExitsNonZero(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var out, errb logbuf.Buffer
	code := run([]string{"--listen", l.Addr().String(), "--upstream", "mongodb://127.0.0.1:1/"}, &out, &errb, nil)
	if code == 0 || !strings.Contains(errb.String(), "address already in use") {
		t.Fatalf("exit %d, stderr %q", code, errb.String())
	}
}

func TestServesOnUnixSocketAndStopsCleanly(t *testing.T) {
	up := fakemongo.Start(t, fakemongo.Options{})
	sock := filepath.Join(t.TempDir(), "mb.sock")
	var out, errb logbuf.Buffer
	stop := make(chan struct{})
	done := make(chan int, 1)
	go func() {
		done <- run([]string{"--listen", sock, "--upstream", up.URI(), "--pool-mode", "statement", "--log-format", "json"}, &out, &errb, stop)
	}()
	var c net.Conn
	deadline := time.Now().Add(10 * time.Second)
	for {
		var err error
		if c, err = net.Dial("unix", sock); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no unix socket: %v; stderr %s", err, errb.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	defer c.Close()
	if _, r := roundTrip(t, c, 1, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}}); okValue(r) != 1 {
		t.Fatalf("ping through unix socket: %v", r)
	}
	stopRun(t, stop, done, &errb)
	if !strings.Contains(errb.String(), `"msg":"mongobouncer stopped"`) {
		t.Fatalf("json logs missing the stop line: %s", errb.String())
	}
	if runtime.GOOS == "linux" {
		io := "epoll"
		if uring.Supported() {
			io = "epoll+io_uring" // "auto": both drivers, chosen by load
		}
		want := fmt.Sprintf(`"event_loop_threads":%d,"gomaxprocs":%d,"event_loop_io":%q`, startProcs, startProcs+1, io)
		if !strings.Contains(errb.String(), want) {
			t.Fatalf("start line does not say %s: %s", want, errb.String())
		}
	}
}

// stopRun closes stop and waits for run (reporting to done) to exit 0.
func stopRun(t *testing.T, stop chan struct{}, done <-chan int, errb *logbuf.Buffer) {
	t.Helper()
	close(stop)
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d; stderr %s", code, errb.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("did not stop")
	}
}

// waitDial waits until addr accepts connections.
func waitDial(t *testing.T, network, addr string, errb *logbuf.Buffer) net.Conn {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial(network, addr)
		if err == nil {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing listening on %s: %v; stderr %s", addr, err, errb.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// roundTrip sends one OP_MSG command with requestID id over c and returns
// the reply's header and body.
func roundTrip(t *testing.T, c net.Conn, id int32, cmd bson.D) (wire.Header, bson.Raw) {
	t.Helper()
	body, err := bson.Marshal(cmd)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(wire.AppendMsg(nil, id, 0, 0, body)); err != nil {
		t.Fatal(err)
	}
	return readReply(t, c)
}

// readReply reads one OP_MSG reply from c.
func readReply(t *testing.T, c net.Conn) (wire.Header, bson.Raw) {
	t.Helper()
	msg, err := wire.ReadMessage(c, nil, wire.DefaultMaxMessageSize)
	if err != nil {
		t.Fatal(err)
	}
	m, err := wire.ParseMsg(msg)
	if err != nil {
		t.Fatal(err)
	}
	return m.Header, bson.Raw(m.Body)
}

// adminCommand runs one command on the mongobouncer database over c.
func adminCommand(t *testing.T, c net.Conn, cmd bson.D) bson.Raw {
	t.Helper()
	_, r := roundTrip(t, c, 1, append(cmd, bson.E{Key: "$db", Value: "mongobouncer"}))
	return r
}

func TestSignals(t *testing.T) {
	up := fakemongo.Start(t, fakemongo.Options{})
	up.Handle("slow", func(*fakemongo.Request) fakemongo.Reply {
		r := fakemongo.OK()
		r.Delay = 3 * time.Second
		return r
	})
	listen := filepath.Join(t.TempDir(), "mb.sock")
	path := filepath.Join(t.TempDir(), "mb.toml")
	write := func(size int) {
		cfg := fmt.Sprintf("[mongobouncer]\nlisten = %q\nmax_pool_size = %d\nshutdown_timeout = \"20s\"\n\n[databases.\"*\"]\nconnection_string = %q\n", listen, size, up.URI())
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(7)
	var out, errb logbuf.Buffer
	done := make(chan int, 1)
	go func() { done <- run([]string{"--config", path}, &out, &errb, nil) }()
	c := waitDial(t, "unix", listen, &errb)
	defer c.Close()
	// A served command proves the main loop is running, not just that the
	// port is bound.
	adminCommand(t, c, bson.D{{Key: "showPools", Value: 1}})

	// SIGHUP reloads the file.
	write(3)
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(adminCommand(t, c, bson.D{{Key: "showPools", Value: 1}}).String(), `"maxPoolSize": {"$numberInt":"3"}`) {
		if time.Now().After(deadline) {
			t.Fatalf("SIGHUP did not apply max_pool_size = 3; stderr %s", errb.String())
		}
		time.Sleep(50 * time.Millisecond)
	}

	// SIGTERM starts a graceful shutdown that waits for the slow request; a
	// second signal exits at once with a non-zero code.
	slow := waitDial(t, "unix", listen, &errb)
	defer slow.Close()
	body, _ := bson.Marshal(bson.D{{Key: "slow", Value: 1}, {Key: "$db", Value: "test"}})
	slow.Write(wire.AppendMsg(nil, 1, 0, 0, body))
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	syscall.Kill(os.Getpid(), syscall.SIGTERM)
	time.Sleep(200 * time.Millisecond)
	select {
	case code := <-done:
		t.Fatalf("exited (%d) with a request in flight and 20s of shutdown_timeout", code)
	default:
	}
	syscall.Kill(os.Getpid(), syscall.SIGTERM)
	select {
	case code := <-done:
		if code == 0 {
			t.Fatal("a forced exit returned 0")
		}
		if time.Since(start) > 2*time.Second {
			t.Fatalf("second signal took %v", time.Since(start))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("second signal did not force an exit")
	}
	if !strings.Contains(errb.String(), "second signal") || !strings.Contains(errb.String(), "configuration reloaded") {
		t.Fatalf("logs: %s", errb.String())
	}
}

func TestShutdownUnderLoadExitsZero(t *testing.T) {
	up := fakemongo.Start(t, fakemongo.Options{})
	up.Handle("slow", func(*fakemongo.Request) fakemongo.Reply {
		r := fakemongo.OK()
		r.Delay = 500 * time.Millisecond
		return r
	})
	listen := filepath.Join(t.TempDir(), "mb.sock")
	var out, errb logbuf.Buffer
	stop := make(chan struct{})
	done := make(chan int, 1)
	go func() {
		done <- run([]string{"--listen", listen, "--upstream", up.URI(), "--pool-mode", "statement"}, &out, &errb, stop)
	}()
	busy := waitDial(t, "unix", listen, &errb)
	defer busy.Close()
	idle := waitDial(t, "unix", listen, &errb)
	defer idle.Close()
	if r := adminCommand(t, idle, bson.D{{Key: "showPools", Value: 1}}); !strings.Contains(r.String(), `"ok": {"$numberDouble":"1.0"}`) {
		t.Fatalf("showPools: %v", r)
	}
	body, _ := bson.Marshal(bson.D{{Key: "slow", Value: 1}, {Key: "$db", Value: "test"}})
	busy.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := busy.Write(wire.AppendMsg(nil, 7, 0, 0, body)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	close(stop)
	time.Sleep(100 * time.Millisecond)
	// A new request on a connected client gets ShutdownInProgress.
	if _, r := roundTrip(t, idle, 8, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}}); codeValue(r) != 91 {
		t.Fatalf("new request during shutdown: %v", r)
	}
	// The request in flight completes.
	if h, r := readReply(t, busy); okValue(r) != 1 || h.ResponseTo != 7 {
		t.Fatalf("in-flight reply: %v", r)
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("exit %d; stderr %s", code, errb.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("did not exit")
	}
}

func okValue(r bson.Raw) float64 {
	f, _ := r.Lookup("ok").AsFloat64OK()
	return f
}

func codeValue(r bson.Raw) int64 {
	c, _ := r.Lookup("code").AsInt64OK()
	return c
}

// With the event loop on (Linux), the process runs one P more than loop
// threads; with it off, GOMAXPROCS is left alone.
func TestReserveLoopProcs(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	g := config.Default().Global
	g.EventLoop = false
	before := runtime.GOMAXPROCS(0)
	if n := reserveLoopProcs(g); n != 0 || runtime.GOMAXPROCS(0) != before {
		t.Fatalf("event loop off: %d threads, GOMAXPROCS %d (was %d)", n, runtime.GOMAXPROCS(0), before)
	}
	if runtime.GOOS != "linux" {
		t.Skip("the event loop is Linux-only")
	}
	g.EventLoop = true
	for _, tc := range []struct{ set, want int }{{3, 3}, {0, startProcs}, {1, 1}} {
		g.EventLoopThreads = tc.set
		if n := reserveLoopProcs(g); n != tc.want || runtime.GOMAXPROCS(0) != tc.want+1 {
			t.Errorf("event_loop_threads = %d: %d threads, GOMAXPROCS %d; want %d and %d", tc.set, n, runtime.GOMAXPROCS(0), tc.want, tc.want+1)
		}
	}
}

// Where the kernel refuses io_uring: a configuration that requires it
// fails at startup, naming the fix, and the default serves on epoll.
func TestIOUringRefusedByTheKernel(t *testing.T) {
	if !seccomp.RefuseIOUring(t) {
		return
	}
	up := fakemongo.Start(t, fakemongo.Options{})
	dir := t.TempDir()
	sock := filepath.Join(dir, "mb.sock")
	path := filepath.Join(dir, "mb.toml")
	write := func(io string) {
		cfg := fmt.Sprintf("[mongobouncer]\nlisten = %q\nlog_format = \"json\"\nevent_loop_io = %q\n\n[databases.\"*\"]\nconnection_string = %q\n", sock, io, up.URI())
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	write("io_uring")
	var out, errb logbuf.Buffer
	stop := make(chan struct{})
	done := make(chan int, 1)
	go func() { done <- run([]string{"--config", path}, &out, &errb, stop) }()
	select {
	case code := <-done:
		if code == 0 || !strings.Contains(errb.String(), `use "auto"`) {
			t.Fatalf("event_loop_io = io_uring: exit %d, stderr %q", code, errb.String())
		}
	case <-time.After(10 * time.Second):
		close(stop)
		<-done
		t.Fatalf("event_loop_io = io_uring: started with io_uring refused; stderr %q", errb.String())
	}

	write("auto")
	errb = logbuf.Buffer{}
	stop = make(chan struct{})
	go func() { done <- run([]string{"--config", path}, &out, &errb, stop) }()
	c := waitDial(t, "unix", sock, &errb)
	defer c.Close()
	for i := range 3 {
		if _, r := roundTrip(t, c, int32(i+1), bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "test"}}); okValue(r) != 1 {
			t.Fatalf("ping %d: %v", i, r)
		}
	}
	stopRun(t, stop, done, &errb)
	if !strings.Contains(errb.String(), `"event_loop_io":"epoll"`) {
		t.Fatalf("the start line does not say epoll: %s", errb.String())
	}
}

// The start line names the driver the event loop started on, not a
// prediction of it: where the kernel allows a small ring but refuses the
// loop's (so a probe says io_uring is there), "auto" runs on epoll, and the
// line says epoll.
func TestStartLineNamesTheDriverThatRuns(t *testing.T) {
	if !seccomp.RefuseLargeIOUring(t, 8) {
		return
	}
	if !uring.Supported() {
		t.Fatal("a small ring is refused too: the filter is not the one this test needs")
	}
	up := fakemongo.Start(t, fakemongo.Options{})
	sock := filepath.Join(t.TempDir(), "mb.sock")
	var out, errb logbuf.Buffer
	stop := make(chan struct{})
	done := make(chan int, 1)
	go func() {
		done <- run([]string{"--listen", sock, "--upstream", up.URI(), "--log-format", "json"}, &out, &errb, stop)
	}()
	c := waitDial(t, "unix", sock, &errb)
	defer c.Close()
	if _, r := roundTrip(t, c, 1, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "test"}}); okValue(r) != 1 {
		t.Fatalf("ping: %v", r)
	}
	stopRun(t, stop, done, &errb)
	if !strings.Contains(errb.String(), `"event_loop_io":"epoll"`) {
		t.Fatalf("the start line does not say epoll, the driver that ran: %s", errb.String())
	}
}

// --max-pool-size overrides the file only when given, 0 (unlimited)
// included; a negative value is refused.
func TestMaxPoolSizeFlagOverridesOnlyWhenGiven(t *testing.T) {
	up := fakemongo.Start(t, fakemongo.Options{})
	dir := t.TempDir()
	path := filepath.Join(dir, "mb.toml")
	cfg := fmt.Sprintf("[mongobouncer]\nlisten = %q\nlog_format = \"json\"\nmax_pool_size = 7\n\n[databases.\"*\"]\nconnection_string = %q\n", filepath.Join(dir, "mb.sock"), up.URI())
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, `"max_pool_size":7`},
		{[]string{"--max-pool-size", "3"}, `"max_pool_size":3`},
		{[]string{"--max-pool-size", "0"}, `"max_pool_size":0`},
		{[]string{"--max-pool-size", "auto"}, `"max_pool_size":"auto"`},
	} {
		var out, errb logbuf.Buffer
		stop := make(chan struct{})
		close(stop) // stops as soon as it has started
		if code := run(append([]string{"--config", path}, tc.args...), &out, &errb, stop); code != 0 {
			t.Fatalf("%v: exit %d; stderr %s", tc.args, code, errb.String())
		}
		if !strings.Contains(errb.String(), tc.want) {
			t.Fatalf("%v: route not configured with %s: %s", tc.args, tc.want, errb.String())
		}
	}
	var out, errb logbuf.Buffer
	if code := run([]string{"--config", path, "--max-pool-size", "-1"}, &out, &errb, nil); code != 2 {
		t.Fatalf("--max-pool-size -1: exit %d; stderr %s", code, errb.String())
	}
}
