// Package ferretdb starts FerretDB's own command (bin/ferretdb) with
// authentication on, as a real upstream that makes mongobouncer log in
// (SCRAM-SHA-1 and SCRAM-SHA-256; FerretDB 1.24 has neither X.509 nor
// speculativeAuthenticate).
//
// The embeddable FerretDB that bin/devmongo wraps cannot enable
// authentication; only cmd/ferretdb can (--test-enable-new-auth with the
// --setup-* flags, which create the database and its user at start). The
// binary is found through MONGOBOUNCER_FERRETDB, else at
// <module root>/bin/ferretdb, and built with tools/ferretdb/build.sh when
// missing, so plain `go test` works without make.
package ferretdb

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/mongobouncer/mongobouncer/internal/testutil/childproc"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/testutil/devmongo"
)

// EnvBinary names the environment variable that overrides the binary's
// path.
const EnvBinary = "MONGOBOUNCER_FERRETDB"

// Timeouts, generous for small, busy machines; a first build takes longer.
const (
	startTimeout = 30 * time.Second
	stopTimeout  = 10 * time.Second
	buildTimeout = 10 * time.Minute
)

// Options are the service user FerretDB creates at start.
type Options struct {
	// Database is where the user is created (its authSource).
	Database string
	// Username and Password name the user.
	Username, Password string
}

// Server is a running FerretDB process.
type Server struct {
	addr    string
	dir     string
	cmd     *exec.Cmd
	stderr  *childproc.TailBuffer
	done    chan struct{}
	waitErr error
}

// listening is the log line that gives the bound address.
var listening = regexp.MustCompile(`Listening on TCP (\S+?)\.\.\.`)

// Start runs FerretDB with authentication for the test and stops it in
// t.Cleanup.
func Start(t testing.TB, o Options) *Server {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		t.Fatalf("ferretdb: %v", err)
	}
	dir, err := os.MkdirTemp("", "ferretdb-")
	if err != nil {
		t.Fatal(err)
	}
	s, err := start(bin, dir, o)
	if err != nil {
		os.RemoveAll(dir)
		t.Fatalf("ferretdb: %v", err)
	}
	t.Cleanup(func() {
		if err := s.stop(); err != nil {
			t.Errorf("ferretdb: stop: %v", err)
		}
		os.RemoveAll(dir)
	})
	return s
}

func start(bin, dir string, o Options) (*Server, error) {
	data := filepath.Join(dir, "data")
	if err := os.MkdirAll(data, 0o700); err != nil {
		return nil, err
	}
	s := &Server{dir: dir, stderr: &childproc.TailBuffer{Max: 16 << 10}, done: make(chan struct{})}
	cmd := exec.Command(bin,
		"--handler=sqlite", "--sqlite-url=file:"+filepath.ToSlash(data)+"/",
		"--listen-addr=127.0.0.1:0", "--debug-addr=-", "--state-dir=-", "--telemetry=disable",
		"--log-level=info", "--log-format=text",
		"--test-enable-new-auth",
		"--setup-database="+o.Database, "--setup-username="+o.Username, "--setup-password="+o.Password)
	childproc.SetProcAttr(cmd)
	pipe, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	s.cmd = cmd
	addrCh := childproc.Watch(cmd, pipe, s.stderr, func(line []byte) (string, bool) {
		if m := listening.FindSubmatch(line); m != nil {
			return string(m[1]), true
		}
		return "", false
	}, s.done, &s.waitErr)
	timer := time.NewTimer(startTimeout)
	defer timer.Stop()
	select {
	case s.addr = <-addrCh:
		return s, nil
	case <-s.done:
		return nil, fmt.Errorf("exited before listening: %v; log:\n%s", s.waitErr, s.stderr)
	case <-timer.C:
		s.kill()
		return nil, fmt.Errorf("not listening after %v; log:\n%s", startTimeout, s.stderr)
	}
}

// Addr returns the server's loopback HOST:PORT.
func (s *Server) Addr() string { return s.addr }

// Log returns the end of the server's log.
func (s *Server) Log() string { return s.stderr.String() }

func (s *Server) stop() error {
	select {
	case <-s.done:
		return fmt.Errorf("had already exited: %v; log:\n%s", s.waitErr, s.stderr)
	default:
	}
	if err := s.cmd.Process.Signal(os.Interrupt); err != nil {
		return s.kill()
	}
	t := time.NewTimer(stopTimeout)
	defer t.Stop()
	select {
	case <-s.done:
		return nil
	case <-t.C:
		return errors.Join(fmt.Errorf("ignored SIGINT for %v", stopTimeout), s.kill())
	}
}

func (s *Server) kill() error {
	err := s.cmd.Process.Kill()
	select {
	case <-s.done:
	case <-time.After(stopTimeout):
		return errors.New("process not reaped after SIGKILL")
	}
	if errors.Is(err, os.ErrProcessDone) {
		return nil
	}
	return err
}

var buildMu sync.Mutex

// Binary returns the path of bin/ferretdb (or $MONGOBOUNCER_FERRETDB),
// building it with tools/ferretdb/build.sh when it is missing.
func Binary() (string, error) {
	root, err := devmongo.ModuleRoot()
	if err != nil {
		return "", err
	}
	p := os.Getenv(EnvBinary)
	if p == "" {
		p = filepath.Join(root, "bin", "ferretdb")
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	unlock, err := childproc.LockFile(filepath.Join(root, "bin", "ferretdb.lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Stat(p); err == nil {
		return p, nil // another test process built it meanwhile
	}
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	tmp := fmt.Sprintf("%s.tmp%d", p, os.Getpid())
	cmd := exec.CommandContext(ctx, "sh", filepath.Join(root, "tools", "ferretdb", "build.sh"), tmp)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("building FerretDB with tools/ferretdb/build.sh: %w\n%s", err, out.Bytes())
	}
	return p, os.Rename(tmp, p)
}
