package e2e

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/devmongo"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// FerretDB 1.24 (devmongo) answers OP_MSG requests that carry moreToCome,
// which a real mongod does not: the reply nobody reads stays on the
// upstream connection. Drivers send endSessions that way when a client
// closes (the Node driver and mongosh do), so behind FerretDB every such
// close leaves a stray reply on a pooled connection, where it must not
// reach the next request.

// strayHold says how a strayRelay delays the upstream's replies to
// moreToCome requests (strays).
type strayHold int

const (
	// holdNone relays every reply as it comes.
	holdNone strayHold = iota
	// holdLate keeps a stray that comes before any other request has
	// followed its moreToCome request back, with every reply after it,
	// until the next request has been forwarded: the stray arrives after
	// mongobouncer has sent its next request on the connection, but in the
	// upstream's order (before that request's reply), as from a slow
	// server.
	holdLate
	// holdReordered keeps a stray back until the next request has been
	// forwarded and lets the replies after it pass: the stray arrives
	// behind the reply to a later request (mongobouncer's fence), an order
	// no in-order server produces, but a stray may come at any time.
	holdReordered
)

// strayRelay forwards TCP connections between mongobouncer and an
// upstream and watches for the replies the upstream sends to moreToCome
// requests (strays), delaying them as hold says.
type strayRelay struct {
	ln       net.Listener
	upstream string
	hold     strayHold
	strays   atomic.Int64 // strays relayed
	wg       sync.WaitGroup

	mu    sync.Mutex
	conns []net.Conn // guarded by mu; nil once closed
}

func startStrayRelay(t testing.TB, upstream string, hold strayHold) *strayRelay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	r := &strayRelay{ln: ln, upstream: upstream, hold: hold, conns: []net.Conn{}}
	r.wg.Add(1)
	go r.accept()
	t.Cleanup(r.close)
	return r
}

func (r *strayRelay) uri() string {
	return "mongodb://" + r.ln.Addr().String() + "/?directConnection=true"
}

func (r *strayRelay) track(cs ...net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conns == nil {
		return false
	}
	r.conns = append(r.conns, cs...)
	return true
}

func (r *strayRelay) close() {
	r.ln.Close()
	r.mu.Lock()
	for _, c := range r.conns {
		c.Close()
	}
	r.conns = nil
	r.mu.Unlock()
	r.wg.Wait()
}

func (r *strayRelay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.DialTimeout("tcp", r.upstream, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		if !r.track(c, u) {
			c.Close()
			u.Close()
			return
		}
		p := &strayPair{r: r, c: c, u: u, more: map[int32]bool{}}
		r.wg.Add(2)
		go p.requests()
		go p.replies()
	}
}

// strayPair is one relayed connection: c to mongobouncer, u upstream.
type strayPair struct {
	r    *strayRelay
	c, u net.Conn

	mu sync.Mutex
	// Guarded by mu, which is also held across every write to c, so that
	// a held stray and the reply after it reach c in the upstream's order.
	more map[int32]bool // requestIDs of moreToCome requests
	// followed says a request has been forwarded since the last
	// moreToCome one.
	followed bool
	held     [][]byte // a stray and the replies after it, kept back
}

func (p *strayPair) requests() {
	defer p.r.wg.Done()
	defer p.c.Close()
	defer p.u.Close()
	br := bufio.NewReader(p.c)
	for {
		msg, err := wire.ReadMessage(br, nil, wire.DefaultMaxMessageSize)
		if err != nil {
			return
		}
		h, _ := wire.ParseHeader(msg)
		p.mu.Lock()
		// mongobouncer forwards its clients' requestIDs, which clients
		// reuse: only the latest request with an ID says what a reply to
		// it is.
		more := h.OpCode == wire.OpMsg && len(msg) >= wire.HeaderLen+4 &&
			wire.MsgFlags(binary.LittleEndian.Uint32(msg[wire.HeaderLen:]))&wire.FlagMoreToCome != 0
		p.more[h.RequestID] = more
		p.followed = !more
		_, err = p.u.Write(msg)
		if err == nil && len(p.held) > 0 {
			p.r.strays.Add(1)
			for _, m := range p.held {
				if _, err = p.c.Write(m); err != nil {
					break
				}
			}
			p.held = nil
		}
		p.mu.Unlock()
		if err != nil {
			return
		}
	}
}

func (p *strayPair) replies() {
	defer p.r.wg.Done()
	defer p.c.Close()
	defer p.u.Close()
	br := bufio.NewReader(p.u)
	for {
		msg, err := wire.ReadMessage(br, nil, wire.DefaultMaxMessageSize)
		if err != nil {
			return
		}
		h, _ := wire.ParseHeader(msg)
		p.mu.Lock()
		stray := p.more[h.ResponseTo]
		delete(p.more, h.ResponseTo)
		switch {
		case len(p.held) > 0 && p.r.hold == holdLate:
			p.held = append(p.held, msg)
		case stray && p.r.hold == holdLate && !p.followed, stray && p.r.hold == holdReordered:
			p.held = [][]byte{msg}
		default:
			_, err = p.c.Write(msg)
			if stray {
				p.r.strays.Add(1)
			}
		}
		p.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// TestUpstreamRepliesToMoreToComeRaw sends a ping with moreToCome through
// mongobouncer to FerretDB, which answers it, on a pool of one connection:
// the next requests, from other clients, run on that connection and must
// each get their own reply. The stray reply is there before the next
// request (settled), arrives after it has been sent (late), arrives behind
// a later reply (reordered), or whenever FerretDB sends it with the next
// request sent at once (direct).
func TestUpstreamRepliesToMoreToComeRaw(t *testing.T) {
	eachIO(t, func(t *testing.T) {
		up := devmongo.Start(t)
		for _, tc := range []struct {
			name  string
			relay bool
			hold  strayHold
		}{{"direct", false, holdNone}, {"settled", true, holdNone}, {"late", true, holdLate}, {"reordered", true, holdReordered}} {
			t.Run(tc.name, func(t *testing.T) {
				uri := up.URI()
				var relay *strayRelay
				if tc.relay {
					relay = startStrayRelay(t, up.Addr(), tc.hold)
					uri = relay.uri()
				}
				a, addr := bouncer(t, uri, func(c *config.Config) { c.Global.MaxPoolSize = 1 })
				waitUsable(t, a, 1)
				ping := bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "test"}}
				sender := dialRaw(t, addr)
				sender.hello()
				sender.id = 100 // apart from the others' requestIDs, for the relay
				others := make([]*rawClient, 3)
				for i := range others {
					others[i] = dialRaw(t, addr)
					others[i].hello()
				}
				// The pool's one connection exists before the moreToCome
				// request, which then runs on it.
				if r := others[0].cmd(ping); okOf(r) != 1 {
					t.Fatalf("ping before: %v", r)
				}
				sender.send(wire.FlagMoreToCome, ping)
				if tc.relay && tc.hold == holdNone {
					waitFor(t, "FerretDB's reply to the moreToCome ping", func() bool { return relay.strays.Load() == 1 })
				}
				var failed []string
			rounds:
				for round := range 5 {
					for i, c := range others {
						id := c.send(0, bson.D{{Key: "ping", Value: 1}, {Key: "round", Value: round}, {Key: "$db", Value: "test"}})
						rep, err := c.tryRecv(10 * time.Second)
						switch {
						case err != nil:
							// The client's stream is out of step now.
							failed = append(failed, fmt.Sprintf("client %d round %d: no reply: %v", i, round, err))
							break rounds
						case rep.header.ResponseTo != id || okOf(rep.body) != 1:
							failed = append(failed, fmt.Sprintf("client %d round %d: reply to %d (want %d): %v", i, round, rep.header.ResponseTo, id, rep.body))
						}
					}
				}
				if _, err := sender.tryRecv(200 * time.Millisecond); err == nil {
					failed = append(failed, "the moreToCome ping's sender got a reply")
				}
				if relay != nil && relay.strays.Load() != 1 {
					failed = append(failed, fmt.Sprintf("FerretDB sent %d replies to moreToCome requests, want 1 (the quirk this test is about)", relay.strays.Load()))
				}
				if len(failed) > 0 {
					t.Fatalf("after a moreToCome ping FerretDB answered, requests failed:\n%s", joinLines(failed))
				}
			})
		}
	})
}

func joinLines(ss []string) string {
	out := ""
	for _, s := range ss {
		out += "  " + s + "\n"
	}
	return out
}

// nodeModulesPath returns tools/node/node_modules if `make node-tools` has
// installed the Node driver there and node is on PATH. Missing, it fails
// the test under CI and skips it elsewhere, as mongoshPath does.
func nodeModulesPath(t *testing.T) string {
	t.Helper()
	root, err := devmongo.ModuleRoot()
	must(t, err)
	dir := filepath.Join(root, "tools", "node", "node_modules")
	_, errMod := os.Stat(filepath.Join(dir, "mongodb", "package.json"))
	_, errNode := exec.LookPath("node")
	if err := errors.Join(errMod, errNode); err != nil {
		msg := fmt.Sprintf("the Node driver or node is missing (%v): run `make node-tools`", err)
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return dir
}

// runNodeTool runs a Node program (node or mongosh) to completion with a
// private HOME, and fails t on a non-zero exit.
func runNodeTool(t *testing.T, env []string, name string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	home := t.TempDir()
	cmd.Env = append(append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+home, "NO_COLOR=1"), env...)
	cmd.Dir = home
	cmd.WaitDelay = 5 * time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("%s: %v (ctx %v); output:\n%s", filepath.Base(name), err, ctx.Err(), out)
	}
}

// TestUpstreamRepliesToMoreToComeFromDrivers is the quirk as users meet
// it: mongosh and a Node driver script connect through mongobouncer to
// FerretDB, run a command and close, which sends endSessions with
// moreToCome, while Go driver clients share the same small pool. FerretDB
// answers each endSessions; none of the Go clients' commands may fail.
// Their retries are off, so that a failure cannot hide behind a retry.
func TestUpstreamRepliesToMoreToComeFromDrivers(t *testing.T) {
	sh := mongoshPath(t)
	modules := nodeModulesPath(t)
	script, err := filepath.Abs(filepath.Join("testdata", "node_close.js"))
	must(t, err)
	eachIO(t, func(t *testing.T) {
		up := devmongo.Start(t)
		// Through a relay that counts FerretDB's replies to moreToCome
		// requests: without one the test could not show the quirk happened.
		relay := startStrayRelay(t, up.Addr(), holdNone)
		a, addr := bouncer(t, relay.uri(), func(c *config.Config) { c.Global.MaxPoolSize = 2 })
		waitUsable(t, a, 1)
		var log cmdLog
		goClient := driverWith(t, addr, "&retryWrites=false&retryReads=false", func(o *options.ClientOptions) { o.SetMonitor(log.monitor()) })
		ctx := ctxT(t, 2*time.Minute)
		must(t, goClient.Ping(ctx, nil))

		// Go workers run commands until told to stop.
		const workers = 4
		var ops atomic.Int64
		var mu sync.Mutex
		var errs []string // guarded by mu
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				coll := goClient.Database("test").Collection(fmt.Sprintf("go%d", w))
				for i := 0; i < 100_000; i++ {
					select {
					case <-stop:
						return
					default:
					}
					var err error
					switch i % 3 {
					case 0:
						err = goClient.Ping(ctx, nil)
					case 1:
						_, err = coll.InsertOne(ctx, bson.D{{Key: "i", Value: i}})
					default:
						err = coll.FindOne(ctx, bson.D{{Key: "i", Value: i - 1}}).Err()
					}
					if err != nil {
						mu.Lock()
						errs = append(errs, err.Error())
						mu.Unlock()
					}
					ops.Add(1)
				}
			}()
		}
		defer func() { // a failed wait must not leave the workers running
			select {
			case <-stop:
			default:
				close(stop)
			}
			wg.Wait()
		}()

		// Two of each close while the Go clients run.
		uri := "mongodb://" + addr + "/test?serverSelectionTimeoutMS=10000"
		var tools sync.WaitGroup
		for range 2 {
			tools.Add(2)
			go func() {
				defer tools.Done()
				runNodeTool(t, []string{"NODE_PATH=" + modules}, "node", script, uri)
			}()
			go func() {
				defer tools.Done()
				runNodeTool(t, nil, sh, uri, "--quiet", "--norc", "--eval", `db.runCommand({ping: 1}); db.node_close.countDocuments({})`)
			}()
			tools.Wait()
		}
		// The last stray reply is on a pooled connection now: the Go
		// clients go on long enough to use every connection of the pool.
		after := ops.Load() + 200
		waitFor(t, "200 more Go driver commands", func() bool { return ops.Load() >= after })
		close(stop)
		wg.Wait()

		mu.Lock()
		defer mu.Unlock()
		if len(errs) > 0 || len(log.failures()) > 0 {
			t.Fatalf("%d of %d Go driver operations failed after mongosh and the Node driver closed their connections (endSessions with moreToCome); first: %s\nfailed commands: %v",
				len(errs), ops.Load(), firstOf(errs), log.failures())
		}
		if relay.strays.Load() == 0 {
			t.Fatal("FerretDB answered no moreToCome request: the drivers sent no endSessions with moreToCome, or FerretDB no longer answers it, and this test shows nothing")
		}
		t.Logf("%d Go driver operations, none failed; %d stray replies dropped", ops.Load(), relay.strays.Load())
	})
}

func firstOf(ss []string) string {
	if len(ss) == 0 {
		return "(none)"
	}
	return ss[0]
}
