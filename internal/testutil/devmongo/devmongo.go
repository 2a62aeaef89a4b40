// Package devmongo starts disposable FerretDB servers (the bin/devmongo tool)
// for tests that need a real MongoDB-compatible upstream.
//
// The binary is found through the MONGOBOUNCER_DEVMONGO environment variable,
// else at <module root>/bin/devmongo; when it is missing it is built with
// `go build` in tools/devmongo, so plain `go test` works without make.
// FerretDB itself is never imported here: it stays in the tools/devmongo
// module.
package devmongo

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/mongobouncer/mongobouncer/internal/testutil/childproc"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// EnvBinary names the environment variable that overrides the devmongo
// binary's path.
const EnvBinary = "MONGOBOUNCER_DEVMONGO"

// modulePath identifies the root module when searching for its directory.
const modulePath = "github.com/mongobouncer/mongobouncer"

// Timeouts. Generous because the machines running tests are small and noisy;
// the first build of FerretDB takes far longer and has its own bound.
const (
	startTimeout = 30 * time.Second
	stopTimeout  = 10 * time.Second
	buildTimeout = 10 * time.Minute
)

// Options configure a server started with StartWith or StartMainWith.
type Options struct {
	// UnixSocket makes the server also listen on a Unix socket, whose path
	// Server.UnixSocket reports.
	UnixSocket bool
}

// Server is a running devmongo process.
type Server struct {
	addr   string
	socket string
	dir    string
	cmd    *exec.Cmd
	stderr *childproc.TailBuffer

	// done is closed when the process has exited; waitErr is set before.
	done    chan struct{}
	waitErr error

	stopOnce sync.Once
	stopErr  error
}

// Start runs a fresh devmongo server for the test and stops it in t.Cleanup.
// It fails the test if the server does not answer within 30 seconds.
func Start(t testing.TB) *Server {
	t.Helper()
	return StartWith(t, Options{})
}

// StartWith is Start with options.
func StartWith(t testing.TB, o Options) *Server {
	t.Helper()
	s, err := StartMainWith(o)
	if err != nil {
		t.Fatalf("devmongo: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("devmongo: stop: %v", err)
		}
	})
	return s
}

// StartMain runs a devmongo server outside any test, for sharing one server
// across a package from TestMain. The caller must call Stop.
func StartMain() (*Server, error) { return StartMainWith(Options{}) }

// StartMainWith is StartMain with options.
func StartMainWith(o Options) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	// Not t.TempDir: Unix socket paths are limited to ~104 bytes and test
	// temp dirs embed the test name.
	dir, err := os.MkdirTemp("", "devmongo-")
	if err != nil {
		return nil, err
	}
	s, err := start(bin, dir, o)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

func start(bin, dir string, o Options) (*Server, error) {
	s := &Server{dir: dir, stderr: &childproc.TailBuffer{Max: 8 << 10}, done: make(chan struct{})}
	args := []string{"-listen", "127.0.0.1:0", "-dir", filepath.Join(dir, "data"), "-log-level", "warn"}
	if o.UnixSocket {
		s.socket = filepath.Join(dir, "mongo.sock")
		args = append(args, "-unix", s.socket)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stderr = s.stderr
	childproc.SetProcAttr(cmd)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	s.cmd = cmd

	// The ready line names the address; the rest of stdout is drained.
	addrCh := childproc.Watch(cmd, stdout, nil, func(line []byte) (string, bool) {
		a, ok := strings.CutPrefix(string(line), "devmongo listening on ")
		return strings.TrimSpace(a), ok
	}, s.done, &s.waitErr)

	deadline := time.Now().Add(startTimeout)
	timer := time.NewTimer(startTimeout)
	defer timer.Stop()
	select {
	case s.addr = <-addrCh:
	case <-s.done:
		return nil, fmt.Errorf("devmongo exited before it was ready: %v; stderr:\n%s", s.waitErr, s.stderr)
	case <-timer.C:
		_ = s.kill()
		return nil, fmt.Errorf("devmongo not ready after %v; stderr:\n%s", startTimeout, s.stderr)
	}
	if err := waitAnswers(s.addr, deadline); err != nil {
		_ = s.kill()
		return nil, fmt.Errorf("devmongo at %s does not answer: %w; stderr:\n%s", s.addr, err, s.stderr)
	}
	return s, nil
}

// Addr returns the server's TCP address, HOST:PORT on loopback.
func (s *Server) Addr() string { return s.addr }

// URI returns a connection string for the Go driver that talks to this one
// server directly.
func (s *Server) URI() string { return "mongodb://" + s.addr + "/?directConnection=true" }

// UnixSocket returns the path of the server's Unix socket, or "" when it was
// started without one.
func (s *Server) UnixSocket() string { return s.socket }

// Stop stops the server: SIGTERM, then SIGKILL if it has not exited within 10
// seconds. It removes the server's directory. It is idempotent.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		s.stopErr = s.terminate()
		if err := os.RemoveAll(s.dir); err != nil && s.stopErr == nil {
			s.stopErr = err
		}
	})
	return s.stopErr
}

func (s *Server) terminate() error {
	select {
	case <-s.done:
		return fmt.Errorf("devmongo had already exited: %v; stderr:\n%s", s.waitErr, s.stderr)
	default:
	}
	if err := interrupt(s.cmd.Process); err != nil {
		return s.kill()
	}
	t := time.NewTimer(stopTimeout)
	defer t.Stop()
	select {
	case <-s.done:
		if s.waitErr != nil {
			return fmt.Errorf("devmongo exit: %v; stderr:\n%s", s.waitErr, s.stderr)
		}
		return nil
	case <-t.C:
		_ = s.kill()
		return fmt.Errorf("devmongo ignored SIGTERM for %v and was killed", stopTimeout)
	}
}

// kill kills the process and waits (bounded) for it to be reaped.
func (s *Server) kill() error {
	err := s.cmd.Process.Kill()
	select {
	case <-s.done:
	case <-time.After(stopTimeout):
		return errors.New("devmongo: process not reaped after SIGKILL")
	}
	if errors.Is(err, os.ErrProcessDone) {
		return nil
	}
	return err
}

// waitAnswers retries a hello on a fresh connection until one gets ok:1 or
// the deadline passes.
func waitAnswers(addr string, deadline time.Time) error {
	var err error
	for time.Now().Before(deadline) {
		if err = ping(addr, deadline); err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return err
}

// ping sends one OP_MSG hello and checks that the reply says ok:1. It is
// written by hand so this package does not depend on internal/wire.
func ping(addr string, deadline time.Time) error {
	if d := time.Until(deadline); d > 5*time.Second {
		deadline = time.Now().Add(5 * time.Second)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.SetDeadline(deadline); err != nil {
		return err
	}
	body := bsoncore.NewDocumentBuilder().AppendInt32("hello", 1).AppendString("$db", "admin").Build()
	msg := make([]byte, 16, 16+5+len(body))
	binary.LittleEndian.PutUint32(msg[4:], 1)     // requestID
	binary.LittleEndian.PutUint32(msg[12:], 2013) // OP_MSG
	msg = binary.LittleEndian.AppendUint32(msg, 0)
	msg = append(msg, 0) // section kind 0
	msg = append(msg, body...)
	binary.LittleEndian.PutUint32(msg[0:], uint32(len(msg)))
	if _, err := c.Write(msg); err != nil {
		return err
	}
	var hdr [16]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return err
	}
	n := int(binary.LittleEndian.Uint32(hdr[0:]))
	if op := binary.LittleEndian.Uint32(hdr[12:]); op != 2013 || n < 16+5+5 || n > 1<<20 {
		return fmt.Errorf("unexpected reply header: opcode %d, length %d", op, n)
	}
	rest := make([]byte, n-16)
	if _, err := io.ReadFull(c, rest); err != nil {
		return err
	}
	if rest[4] != 0 {
		return fmt.Errorf("unexpected section kind %d", rest[4])
	}
	doc := bsoncore.Document(rest[5:])
	if err := doc.Validate(); err != nil {
		return err
	}
	ok, isNum := doc.Lookup("ok").AsFloat64OK()
	if !isNum || ok != 1 {
		return fmt.Errorf("hello failed: %s", doc)
	}
	return nil
}

var buildMu sync.Mutex

// Binary returns the path of the devmongo binary, building it when it is
// missing. Concurrent callers, in this process or in other test processes,
// build it once.
func Binary() (string, error) {
	if p := os.Getenv(EnvBinary); p != "" {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		// A configured but missing path (e.g. a fresh clone run through the
		// Makefile's export without `make devmongo`) is built there.
		root, err := ModuleRoot()
		if err != nil {
			return "", err
		}
		return p, build(root, p)
	}
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	p := filepath.Join(root, "bin", "devmongo")
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	return p, build(root, p)
}

// build runs `go build` in tools/devmongo, writing to a temporary file that is
// renamed into place so no reader ever sees a half-written binary.
func build(root, out string) error {
	buildMu.Lock()
	defer buildMu.Unlock()
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	unlock, err := childproc.LockFile(out + ".lock")
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := os.Stat(out); err == nil {
		return nil // another process built it while we waited for the lock
	}
	tmp := fmt.Sprintf("%s.tmp%d", out, os.Getpid())
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, goTool(), "build", "-o", tmp, ".")
	cmd.Dir = filepath.Join(root, "tools", "devmongo")
	var outBuf bytes.Buffer
	cmd.Stdout = &outBuf
	cmd.Stderr = &outBuf
	if err := cmd.Run(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("building devmongo in %s: %w\n%s", cmd.Dir, err, outBuf.Bytes())
	}
	return os.Rename(tmp, out)
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// ModuleRoot returns the directory of the mongobouncer root module, searched
// upwards from the working directory (tests run in their package directory)
// and then from this source file.
func ModuleRoot() (string, error) {
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if _, file, _, ok := runtime.Caller(0); ok {
		starts = append(starts, filepath.Dir(file))
	}
	for _, dir := range starts {
		for {
			if isRoot(dir) {
				return dir, nil
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	return "", fmt.Errorf("devmongo: cannot find the %s module root; set %s", modulePath, EnvBinary)
}

func isRoot(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "module" {
			return f[1] == modulePath
		}
	}
	return false
}
