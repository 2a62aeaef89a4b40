package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/logbuf"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

func reuseportConfig(listen, admin, uri string, reuseport bool) config.Config {
	cfg := config.Default()
	cfg.Global.Listen = listen
	cfg.Global.AdminListen = admin
	cfg.Global.SoReuseport = reuseport
	cfg.Global.HeartbeatInterval = time.Hour
	cfg.Databases = map[string]config.Route{"*": {ConnectionString: config.URI(uri)}}
	return cfg
}

// With so_reuseport a second process binds the client and admin addresses
// the first still holds; without it, that fails. Once the first is closed
// the second serves.
func TestSoReuseportBindsBesideARunningProcess(t *testing.T) {
	up := fakemongo.Start(t, fakemongo.Options{})
	old, err := New(reuseportConfig("127.0.0.1:0", "127.0.0.1:0", up.URI(), true), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeApp(old)
	old.Start()
	addr, admin := old.Addrs()[0].String(), old.AdminAddr().String()

	var le *ListenError
	if _, err := New(reuseportConfig(addr, "127.0.0.1:0", up.URI(), false), nil); !errors.As(err, &le) {
		t.Fatalf("client address without so_reuseport: %v, want a *ListenError", err)
	}
	if _, err := New(reuseportConfig("127.0.0.1:0", admin, up.URI(), false), nil); !errors.As(err, &le) {
		t.Fatalf("admin address without so_reuseport: %v, want a *ListenError", err)
	}
	next, err := New(reuseportConfig(addr, admin, up.URI(), true), nil)
	if err != nil {
		t.Fatalf("second process with so_reuseport: %v", err)
	}
	defer closeApp(next)
	next.Start()
	closeApp(old)
	for range 20 { // whichever socket the kernel picks, only next's is left
		ping(t, next, "admin")
	}
	if code, _ := httpGet(t, next, "/healthz"); code != 200 {
		t.Fatalf("admin on the shared address: %d", code)
	}
}

// With so_reuseport, New warns unless net.ipv4.tcp_migrate_req is 1.
func TestSoReuseportWarnsWithoutMigrateReq(t *testing.T) {
	dir := t.TempDir()
	defer func(p string) { migrateReqPath = p }(migrateReqPath)
	for _, c := range []struct {
		sysctl    string // "" for a missing file
		reuseport bool
		warn      bool
	}{{"0\n", true, true}, {"", true, true}, {"1\n", true, false}, {"0\n", false, false}} {
		migrateReqPath = filepath.Join(dir, "missing")
		if c.sysctl != "" {
			migrateReqPath = filepath.Join(dir, "tcp_migrate_req")
			if err := os.WriteFile(migrateReqPath, []byte(c.sysctl), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		var logs logbuf.Buffer
		a, err := New(reuseportConfig("127.0.0.1:0", "", "mongodb://127.0.0.1:1/", c.reuseport),
			slog.New(slog.NewTextHandler(&logs, nil)))
		if err != nil {
			t.Fatal(err)
		}
		closeApp(a)
		if got := strings.Contains(logs.String(), "tcp_migrate_req"); got != c.warn {
			t.Errorf("sysctl %q, so_reuseport %v: warned %v, want %v\n%s", c.sysctl, c.reuseport, got, c.warn, logs.String())
		}
	}
}

// upgradeEnv tells a test binary run in its own network namespace that it
// is the child of TestSoReuseportUpgrade, and the tcp_migrate_req to set.
const upgradeEnv = "MONGOBOUNCER_TEST_REUSEPORT_MIGRATE"

var upgradeResult = regexp.MustCompile(`reuseport-upgrade: .*`)

// An upgrade on one host: process A serves with so_reuseport, B binds the
// same address, clients connect throughout, and A drains. Run in a network
// namespace of its own (so the host's net.ipv4.tcp_migrate_req is not
// touched) once with tcp_migrate_req = 0 and once with 1; with 1 no
// connection may be refused or reset. Needs root for the namespace: it
// skips without, except under CI=true.
func TestSoReuseportUpgrade(t *testing.T) {
	if os.Getenv(upgradeEnv) != "" {
		upgradeChild(t)
		return
	}
	need := func(why string) {
		if os.Getenv("CI") == "true" {
			t.Fatal(why)
		}
		t.Skip(why)
	}
	if os.Geteuid() != 0 {
		need("needs root to create a network namespace (unshare -n)")
	}
	if _, err := os.Stat("/proc/sys/net/ipv4/tcp_migrate_req"); err != nil {
		need("kernel without net.ipv4.tcp_migrate_req (Linux 5.14 or later): " + err.Error())
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		need("no unshare: " + err.Error())
	}
	for _, migrate := range []string{"0", "1"} {
		ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
		cmd := exec.CommandContext(ctx, unshare, "-n", "--", os.Args[0],
			"-test.run=^TestSoReuseportUpgrade$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), upgradeEnv+"="+migrate)
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("tcp_migrate_req = %s: %v\n%s", migrate, err, out)
		}
		res := upgradeResult.Find(out)
		if res == nil {
			t.Fatalf("tcp_migrate_req = %s: no result line\n%s", migrate, out)
		}
		t.Logf("tcp_migrate_req = %s: %s", migrate, res)
	}
}

// upgradeCounts classifies the clients' outcomes.
type upgradeCounts struct {
	ok, refused, reset, shutdown, other atomic.Int64
	firstOther, firstReset              atomic.Value
}

func (c *upgradeCounts) String() string {
	s := fmt.Sprintf("ok=%d refused=%d reset=%d shutdown_in_progress=%d other=%d",
		c.ok.Load(), c.refused.Load(), c.reset.Load(), c.shutdown.Load(), c.other.Load())
	if e := c.firstReset.Load(); e != nil {
		s += fmt.Sprintf(" (first reset: %v)", e)
	}
	if e := c.firstOther.Load(); e != nil {
		s += fmt.Sprintf(" (first other: %v)", e)
	}
	return s
}

func upgradeChild(t *testing.T) {
	migrate := os.Getenv(upgradeEnv)
	if out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("ip link set lo up: %v: %s", err, out)
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/tcp_migrate_req", []byte(migrate), 0); err != nil {
		t.Fatal(err)
	}
	up := fakemongo.Start(t, fakemongo.Options{})
	a, err := New(reuseportConfig("127.0.0.1:0", "", up.URI(), true), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeApp(a)
	a.Start()
	addr := a.Addrs()[0].String()
	b, err := New(reuseportConfig(addr, "", up.URI(), true), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeApp(b)
	b.Start()

	// 2,000 connects over about 2 s, each a hello round trip; after the
	// first 1,000, A drains (as on SIGTERM) while a burst of 300 more
	// connect at once, so that some are queued on A's listener, completed
	// by the kernel but not yet accepted, as it closes.
	const total, burst = 2000, 300
	var c upgradeCounts
	var wg sync.WaitGroup
	sem := make(chan struct{}, 200)
	drained := make(chan error, 1)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for i := range total {
		<-tick.C
		if i == total/2 {
			start := make(chan struct{})
			for range burst {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					helloOnce(addr, &c)
				}()
			}
			close(start)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				drained <- a.GracefulClose(ctx)
			}()
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			helloOnce(addr, &c)
		}()
	}
	wg.Wait()
	if err := <-drained; err != nil {
		t.Errorf("A's graceful close: %v", err)
	}
	t.Logf("reuseport-upgrade: tcp_migrate_req=%s %s", migrate, &c)
	if c.ok.Load()+c.refused.Load()+c.reset.Load()+c.shutdown.Load()+c.other.Load() != total+burst {
		t.Fatalf("outcomes do not add up to %d: %s", total+burst, &c)
	}
	if migrate == "1" && (c.refused.Load() != 0 || c.reset.Load() != 0 || c.other.Load() != 0) {
		t.Fatalf("with tcp_migrate_req = 1, clients refused or reset: %s", &c)
	}
}

// helloOnce connects to addr, sends a hello and reads the reply, and
// counts the outcome.
func helloOnce(addr string, c *upgradeCounts) {
	err := func() error {
		nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return err
		}
		defer nc.Close()
		_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
		body, _ := bson.Marshal(bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}})
		if _, err := nc.Write(wire.AppendMsg(nil, 1, 0, 0, body)); err != nil {
			return err
		}
		msg, err := wire.ReadMessage(nc, nil, wire.DefaultMaxMessageSize)
		if err != nil {
			return err
		}
		_, doc := wire.ReplyView(msg)
		if doc == nil {
			return errors.New("reply is not an OP_MSG")
		}
		if ok, _ := doc.Lookup("ok").AsFloat64OK(); ok == 1 {
			return nil
		}
		if code, _ := doc.Lookup("code").AsInt32OK(); code == 91 {
			c.shutdown.Add(1)
			return errCounted
		}
		return fmt.Errorf("hello failed: %s", doc)
	}()
	switch {
	case err == nil:
		c.ok.Add(1)
	case errors.Is(err, errCounted):
	case errors.Is(err, syscall.ECONNREFUSED):
		c.refused.Add(1)
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, io.EOF),
		errors.Is(err, io.ErrUnexpectedEOF), strings.Contains(err.Error(), "connection reset"):
		c.reset.Add(1)
		c.firstReset.CompareAndSwap(nil, err.Error())
	default:
		c.other.Add(1)
		c.firstOther.CompareAndSwap(nil, err.Error())
	}
}

var errCounted = errors.New("counted")
