// Package image holds the test of the container image (README.md, "Deploy"):
// `make image` builds it with buildah from deploy/image/Dockerfile.prebuilt,
// and the Dockerfile at the module root builds the same final stage from
// source. There is no Go code here besides the tests.
package image

import (
	"bytes"
	"context"
	"crypto/x509"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.uber.org/goleak"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/childproc"
	"github.com/mongobouncer/mongobouncer/internal/testutil/devmongo"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// buildahFlags are the global flags of every buildah command here and of
// `make image` (BUILDAH_FLAGS): vfs storage works in containers too.
var buildahFlags = []string{"--storage-driver", "vfs"}

// Bounds. The build compiles the binary (a minute on a small machine with a
// cold build cache) and copies it through vfs storage a few times.
const (
	buildTimeout = 4 * time.Minute
	cmdTimeout   = time.Minute
	startTimeout = 30 * time.Second
	stopTimeout  = 30 * time.Second
)

// configPath is the default configuration inside the image, which its CMD
// names.
const configPath = "/etc/mongobouncer/mongobouncer.toml"

// TestImage builds the image with `make image` (to a name and archive of its
// own), checks its configuration (entrypoint, command, user, ports, volume,
// labels) and contents (a static binary, CA certificates, the non-root user,
// an empty /tmp anyone may write, a default configuration that loads and
// listens on the exposed ports), runs --version in it, then runs its binary
// with its default configuration against devmongo on loopback, pings through
// it with the Go driver, checks that it runs as user 65532 and logs in JSON
// as that configuration says, and shuts it down through the admin listener.
// Container and image are removed afterwards.
func TestImage(t *testing.T) {
	requireTools(t)
	root, err := devmongo.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	upstream := devmongo.Start(t) // before the image, so that it is stopped after mongobouncer
	tmp := t.TempDir()
	name := fmt.Sprintf("localhost/mongobouncer-imagetest:%d-%d", os.Getpid(), time.Now().UnixNano())
	archive := filepath.Join(tmp, "image.tar")

	start := time.Now()
	t.Cleanup(func() {
		// rmi fails while a container uses the image: rm runs first (LIFO).
		if out, err := buildah(context.Background(), "rmi", name); err != nil {
			t.Errorf("buildah rmi %s: %v\n%s", name, err, out)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	mk := exec.CommandContext(ctx, "make", "-C", root, "image", "IMAGE="+name, "IMAGE_ARCHIVE="+archive,
		"IMAGE_CTX="+filepath.Join(tmp, "context"), "BUILDAH_FLAGS="+strings.Join(buildahFlags, " "))
	if out, err := mk.CombinedOutput(); err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	t.Logf("make image: %v", time.Since(start).Round(100*time.Millisecond))
	if fi, err := os.Stat(archive); err != nil || fi.Size() == 0 {
		t.Errorf("make image wrote no OCI archive at %s: %v", archive, err)
	}

	// The version the binary reports is the one the labels carry.
	revision := gitRevision(t, root)
	wantVersion := "mongobouncer "
	cfg := inspectImage(t, name)
	version := cfg.Labels["org.opencontainers.image.version"]
	if version == "" {
		t.Errorf("label org.opencontainers.image.version is empty")
	}
	wantVersion += version
	if revision != "" {
		wantVersion += " (revision " + revision + ")"
	}
	if got := cfg.Labels["org.opencontainers.image.revision"]; got != revision {
		t.Errorf("label org.opencontainers.image.revision = %q, want %q (git rev-parse HEAD)", got, revision)
	}
	for _, l := range []string{"org.opencontainers.image.title", "org.opencontainers.image.source"} {
		if cfg.Labels[l] == "" {
			t.Errorf("label %s is missing", l)
		}
	}
	if !slices.Equal(cfg.Entrypoint, []string{"/mongobouncer"}) {
		t.Errorf("entrypoint = %q, want [/mongobouncer]", cfg.Entrypoint)
	}
	if !slices.Equal(cfg.Cmd, []string{"--config", configPath}) {
		t.Errorf("cmd = %q, want [--config %s]", cfg.Cmd, configPath)
	}
	if cfg.User != "65532:65532" {
		t.Errorf("user = %q, want 65532:65532", cfg.User)
	}
	if _, ok := cfg.Volumes["/tmp"]; !ok || len(cfg.Volumes) != 1 {
		t.Errorf("volumes = %v, want /tmp only", cfg.Volumes)
	}

	ctr := fromImage(t, name)
	rootfs := mountContainer(t, ctr)
	checkContents(t, rootfs, cfg.ExposedPorts)

	out, err := buildahOut(t, "run", "--isolation", "chroot", ctr, "/mongobouncer", "--version")
	if err != nil {
		t.Fatalf("--version in the image: %v\n%s", err, out)
	}
	if got := strings.TrimSpace(out); got != wantVersion {
		t.Errorf("--version in the image = %q, want %q", got, wantVersion)
	}

	runAgainst(t, ctr, upstream.URI(), revision)
	// As user 65532 it can write nowhere else (every other file and
	// directory is root's), so a read-only root filesystem is enough.
	if entries, err := os.ReadDir(filepath.Join(rootfs, "tmp")); err != nil || len(entries) != 0 {
		t.Errorf("mongobouncer wrote in /tmp: %v %v", entries, err)
	}
	t.Logf("whole test: %v", time.Since(start).Round(100*time.Millisecond))
}

// requireTools skips the test without buildah, make or root (buildah's
// chroot isolation and vfs storage need root), and fails it under CI, where
// `make test` installs buildah (image-tools) and runs as root.
func requireTools(t *testing.T) {
	t.Helper()
	var missing []string
	if _, err := exec.LookPath("buildah"); err != nil {
		missing = append(missing, "buildah is missing (make image-tools, as root, installs it)")
	}
	if _, err := exec.LookPath("make"); err != nil {
		missing = append(missing, "make is missing")
	}
	if os.Geteuid() != 0 {
		missing = append(missing, "not root (buildah's chroot isolation and vfs storage need it)")
	}
	if len(missing) == 0 {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("the container image test cannot run (CI): %s", strings.Join(missing, "; "))
	}
	t.Skipf("skipping the container image test: %s", strings.Join(missing, "; "))
}

// buildah runs one buildah command with the global flags and returns its
// combined output.
func buildah(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, cmdTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "buildah", append(slices.Clone(buildahFlags), args...)...).CombinedOutput()
	return string(out), err
}

// buildahOut is buildah with its standard output alone (stderr is added to
// the error).
func buildahOut(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cmdTimeout)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "buildah", append(slices.Clone(buildahFlags), args...)...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("buildah %s: %w: %s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return string(out), nil
}

// gitRevision is the commit `make image` labels the image with, or "" where
// git or the repository is missing (then make passes no revision either).
func gitRevision(t *testing.T, root string) string {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		return ""
	}
	out, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// imageConfig is the part of the OCI image configuration the test checks.
type imageConfig struct {
	User         string              `json:"User"`
	ExposedPorts map[string]struct{} `json:"ExposedPorts"`
	Entrypoint   []string            `json:"Entrypoint"`
	Cmd          []string            `json:"Cmd"`
	Volumes      map[string]struct{} `json:"Volumes"`
	Labels       map[string]string   `json:"Labels"`
}

// inspectImage returns the image's OCI configuration, as buildah inspect
// reports it.
func inspectImage(t *testing.T, name string) imageConfig {
	t.Helper()
	out, err := buildahOut(t, "inspect", "--type", "image", name)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		OCIv1 struct {
			Config imageConfig `json:"config"`
		} `json:"OCIv1"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("buildah inspect: %v\n%s", err, out)
	}
	return doc.OCIv1.Config
}

// fromImage creates a working container of the image, removed at cleanup.
func fromImage(t *testing.T, name string) string {
	t.Helper()
	out, err := buildahOut(t, "from", "--name", fmt.Sprintf("mongobouncer-imagetest-%d", time.Now().UnixNano()), name)
	if err != nil {
		t.Fatal(err)
	}
	ctr := strings.TrimSpace(out)
	t.Cleanup(func() {
		if out, err := buildah(context.Background(), "rm", ctr); err != nil {
			t.Errorf("buildah rm %s: %v\n%s", ctr, err, out)
		}
	})
	return ctr
}

// mountContainer returns the directory of the container's root filesystem
// on the host (buildah rm unmounts it).
func mountContainer(t *testing.T, ctr string) string {
	t.Helper()
	out, err := buildahOut(t, "mount", ctr)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(out)
}

// checkContents checks the image's files: a static binary, CA certificates
// that parse, the non-root user and group, a /tmp anyone may write (sticky,
// as on any Linux), and a default configuration that loads and whose
// listeners are the exposed ports.
func checkContents(t *testing.T, rootfs string, exposed map[string]struct{}) {
	t.Helper()
	bin, err := elf.Open(filepath.Join(rootfs, "mongobouncer"))
	if err != nil {
		t.Fatalf("/mongobouncer: %v", err)
	}
	for _, p := range bin.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("/mongobouncer is dynamically linked (it has an interpreter): the image has no libc")
		}
	}
	bin.Close()

	// Only /tmp may be written by the user the image runs as (so a
	// read-only root filesystem loses nothing): everything is root's, and
	// nothing else is writable by others.
	err = filepath.WalkDir(rootfs, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(rootfs, path)
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && (st.Uid != 0 || st.Gid != 0) {
			t.Errorf("/%s is owned by %d:%d, want root's", rel, st.Uid, st.Gid)
		}
		if fi.Mode().Perm()&0o022 != 0 && rel != "tmp" {
			t.Errorf("/%s is writable by others than root: %v", rel, fi.Mode())
		}
		// A checkout under umask 077 must not make the configuration
		// unreadable to the image's user.
		want := fs.FileMode(0o004)
		if d.IsDir() {
			want |= 0o001
		}
		if fi.Mode().Perm()&want != want {
			t.Errorf("/%s is not readable by the image's user: %v", rel, fi.Mode())
		}
		return nil
	})
	if err != nil {
		t.Errorf("walking the image's files: %v", err)
	}

	pem, err := os.ReadFile(filepath.Join(rootfs, "etc/ssl/certs/ca-certificates.crt"))
	if err != nil {
		t.Errorf("CA certificates: %v", err)
	} else if !x509.NewCertPool().AppendCertsFromPEM(pem) {
		t.Errorf("/etc/ssl/certs/ca-certificates.crt holds no certificate")
	}
	for file, want := range map[string]string{"etc/passwd": "nonroot:x:65532:65532:", "etc/group": "nonroot:x:65532:"} {
		b, err := os.ReadFile(filepath.Join(rootfs, file))
		if err != nil || !slices.ContainsFunc(strings.Split(string(b), "\n"), func(l string) bool { return strings.HasPrefix(l, want) }) {
			t.Errorf("/%s has no line %q... (%v):\n%s", file, want, err, b)
		}
	}
	if fi, err := os.Stat(filepath.Join(rootfs, "tmp")); err != nil {
		t.Errorf("/tmp: %v", err)
	} else if want := fs.ModeDir | fs.ModeSticky | 0o777; fi.Mode() != want {
		t.Errorf("/tmp mode = %v, want %v", fi.Mode(), want)
	} else if entries, _ := os.ReadDir(filepath.Join(rootfs, "tmp")); len(entries) != 0 {
		t.Errorf("/tmp is not empty: %v", entries)
	}

	cfg, err := config.Load(filepath.Join(rootfs, configPath))
	if err != nil {
		t.Fatalf("the image's default configuration: %v", err)
	}
	for key, addr := range map[string]string{"listen": cfg.Global.Listen, "admin_listen": cfg.Global.AdminListen} {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Errorf("default %s = %q: %v", key, addr, err)
			continue
		}
		if host != "0.0.0.0" {
			t.Errorf("default %s = %q: a container's listener must take every interface", key, addr)
		}
		if _, ok := exposed[port+"/tcp"]; !ok {
			t.Errorf("default %s = %q, but the image exposes %v", key, addr, exposed)
		}
	}
	if len(exposed) != 2 {
		t.Errorf("exposed ports = %v, want the two listeners only", exposed)
	}
}

// runAgainst runs the image's binary in the container with its default
// configuration, on loopback ports of the host's network, with upstream as
// its catch-all route; pings through it, checks the process's user and its
// JSON log, and shuts it down through the admin listener.
func runAgainst(t *testing.T, ctr, upstream, revision string) {
	t.Helper()
	listen, admin := freeAddr(t), freeAddr(t)
	args := append(slices.Clone(buildahFlags), "run", "--isolation", "chroot", "--network", "host", ctr,
		"/mongobouncer", "--config", configPath, "--upstream", upstream, "--listen", listen, "--admin-listen", admin)
	cmd := exec.Command("buildah", args...)
	out := &childproc.TailBuffer{Max: 64 << 10}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // mongobouncer runs in buildah's process group
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var waitErr error
	done := make(chan struct{}) // closed when buildah run has exited; waitErr is set before
	go func() {
		waitErr = cmd.Wait()
		close(done)
	}()
	stopped := false
	t.Cleanup(func() {
		if stopped {
			return
		}
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-done:
		case <-time.After(stopTimeout):
			t.Errorf("buildah run did not exit after SIGKILL")
		}
		t.Logf("mongobouncer's output:\n%s", out)
	})

	// The ping gives up at once if mongobouncer exits (a bad configuration,
	// say), rather than at startTimeout.
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	go func() {
		select {
		case <-done:
			cancel()
		case <-ctx.Done():
		}
	}()
	client, err := mongo.Connect(options.Client().ApplyURI("mongodb://" + listen + "/?directConnection=true"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = client.Disconnect(context.Background()) }()
	var reply bson.M
	if err := client.Database("imagetest").RunCommand(ctx, bson.D{{Key: "ping", Value: 1}}).Decode(&reply); err != nil {
		t.Fatalf("ping through the image's mongobouncer: %v", err)
	}
	if ok, _ := reply["ok"].(float64); ok != 1 {
		t.Fatalf("ping through the image's mongobouncer: %v", reply)
	}

	if uid, err := processUID(listen); err != nil {
		t.Errorf("mongobouncer's process: %v", err)
	} else if uid != "65532" {
		t.Errorf("mongobouncer runs as uid %s, want 65532 (the image's USER)", uid)
	}

	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Post("http://"+admin+"/admin/shutdown", "", nil)
	if err != nil {
		t.Fatalf("admin shutdown: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("admin shutdown: %s", resp.Status)
	}
	select {
	case <-done:
		stopped = true
		if waitErr != nil {
			t.Fatalf("mongobouncer in the image exited with %v:\n%s", waitErr, out)
		}
	case <-time.After(stopTimeout):
		t.Fatalf("mongobouncer in the image did not exit %v after the shutdown command", stopTimeout)
	}
	checkLog(t, out.String(), revision)
}

// checkLog checks that mongobouncer logged in JSON, as the image's default
// configuration asks (so it read that file), and that its startup line
// names the revision it was built from.
func checkLog(t *testing.T, log, revision string) {
	t.Helper()
	started := false
	for _, line := range strings.Split(strings.TrimSpace(log), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Errorf("log line is not JSON (log_format in the image's configuration): %q", line)
			return
		}
		if rec["msg"] == "mongobouncer started" {
			started = true
			if rec["revision"] != revision {
				t.Errorf("startup log revision = %v, want %q", rec["revision"], revision)
			}
		}
	}
	if !started {
		t.Errorf("no startup line in the log:\n%s", log)
	}
}

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// processUID returns the real user ID of the /mongobouncer process that
// listens on listen, found by its command line in /proc.
func processUID(listen string) (string, error) {
	dirs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		return "", err
	}
	for _, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if args[0] != "/mongobouncer" || !slices.Contains(args, listen) {
			continue
		}
		status, err := os.ReadFile(filepath.Join(dir, "status"))
		if err != nil {
			return "", err
		}
		for _, line := range strings.Split(string(status), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "Uid:" {
				if _, err := strconv.Atoi(f[1]); err != nil {
					return "", fmt.Errorf("%s/status: %q", dir, line)
				}
				return f[1], nil
			}
		}
		return "", fmt.Errorf("%s/status has no Uid line", dir)
	}
	return "", errors.New("no /mongobouncer process listening on " + listen + " in /proc")
}

// TestDockerfilesShareFinalStage checks that the Dockerfile users build
// from source and the one `make image` builds from a prebuilt binary end in
// the same final stage (user, volume, ports, labels, entrypoint, command),
// but for where the files come from: TestImage checks only the second.
func TestDockerfilesShareFinalStage(t *testing.T) {
	root, err := devmongo.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	src := finalStage(t, filepath.Join(root, "Dockerfile"))
	pre := finalStage(t, filepath.Join(root, "deploy/image/Dockerfile.prebuilt"))
	if !slices.Equal(src, pre) {
		t.Errorf("the final stages differ:\nDockerfile:\n%s\n\ndeploy/image/Dockerfile.prebuilt:\n%s",
			strings.Join(src, "\n"), strings.Join(pre, "\n"))
	}
	if len(src) == 0 || src[0] != "FROM scratch" {
		t.Errorf("the final stage is not FROM scratch: %q", src)
	}
}

// finalStage returns the lines of a Dockerfile from its last FROM on,
// without its COPY lines.
func finalStage(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	last := -1
	for i, l := range lines {
		if strings.HasPrefix(l, "FROM ") {
			last = i
		}
	}
	if last < 0 {
		t.Fatalf("%s has no FROM", path)
	}
	var stage []string
	for _, l := range lines[last:] {
		if !strings.HasPrefix(l, "COPY ") {
			stage = append(stage, l)
		}
	}
	return stage
}
