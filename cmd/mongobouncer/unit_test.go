package main

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/logbuf"
)

const unitPath = "../../examples/mongobouncer.service"

// unitFile is a systemd unit read as systemd does for what this test needs:
// [Section] headers, Key=Value lines, '#' and ';' comments, and keys that
// may repeat.
type unitFile map[string]map[string][]string

func readUnit(t *testing.T, path string) unitFile {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := unitFile{}
	section := ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[' && line[len(line)-1] == ']':
			section = line[1 : len(line)-1]
			if u[section] == nil {
				u[section] = map[string][]string{}
			}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || section == "" {
				t.Fatalf("%s:%d: not a Key=Value line in a section: %q", path, n, line)
			}
			k, v = strings.TrimSpace(k), strings.TrimSpace(v)
			u[section][k] = append(u[section][k], v)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return u
}

// one returns the only value of section's key, failing when it is missing
// or repeated.
func (u unitFile) one(t *testing.T, section, key string) string {
	t.Helper()
	vs := u[section][key]
	if len(vs) != 1 {
		t.Fatalf("[%s] %s: %q, want one value", section, key, vs)
	}
	return vs[0]
}

// The shipped unit matches what the code does: Type=notify with main-only
// notifications (the code notifies from the main process), ExecReload by
// SIGHUP (the reload signal), KillSignal SIGTERM (the drain), a stop
// timeout above the default drain's bound, flags that exist, the
// configuration directory readable under ProtectSystem=strict, and the
// sandbox.
func TestSystemdUnitMatchesTheCode(t *testing.T) {
	u := readUnit(t, unitPath)
	s := "Service"
	for key, want := range map[string]string{
		"Type":                  "notify",
		"NotifyAccess":          "main",
		"ExecReload":            "/bin/kill -HUP $MAINPID",
		"KillSignal":            "SIGTERM",
		"NoNewPrivileges":       "yes",
		"ProtectSystem":         "strict",
		"ProtectHome":           "yes",
		"PrivateTmp":            "yes",
		"DynamicUser":           "yes",
		"Restart":               "on-failure",
		"LimitNOFILE":           "131072",
		"ProtectKernelTunables": "yes",
	} {
		if got := u.one(t, s, key); got != want {
			t.Errorf("[Service] %s=%s, want %s", key, got, want)
		}
	}

	// The drain: shutdown_timeout, then the clients' disconnection
	// (upstream_command_timeout + 1s), then 5s for the pools and the admin
	// listener; systemd's SIGKILL must not come first.
	g := config.Default().Global
	need := g.ShutdownTimeout + g.UpstreamCommandTimeout + time.Second + 5*time.Second
	stop := u.one(t, s, "TimeoutStopSec")
	secs, err := strconv.Atoi(strings.TrimSuffix(stop, "s"))
	if err != nil {
		t.Fatalf("TimeoutStopSec=%s: not whole seconds: %v", stop, err)
	}
	if got := time.Duration(secs) * time.Second; got < need {
		t.Errorf("TimeoutStopSec=%s, below the default drain's bound %v", stop, need)
	}

	// ExecStart: an absolute binary and flags run knows.
	args := strings.Fields(u.one(t, s, "ExecStart"))
	if !filepath.IsAbs(args[0]) {
		t.Errorf("ExecStart runs %q, not an absolute path", args[0])
	}
	var out, help logbuf.Buffer
	run([]string{"--help"}, &out, &help, nil)
	cfgDir := ""
	for i, a := range args[1:] {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") {
			continue
		}
		if !strings.Contains(help.String(), "  -"+name) {
			t.Errorf("ExecStart flag %s is not one of mongobouncer's", a)
		}
		if name == "config" && i+2 < len(args) {
			cfgDir = filepath.Dir(args[i+2])
		}
	}
	// A reload reads the file again: its directory stays readable.
	if cfgDir == "" {
		t.Fatal("ExecStart has no --config FILE")
	}
	readable := false
	for _, p := range u[s]["ReadOnlyPaths"] {
		for _, d := range strings.Fields(p) {
			if cfgDir == d || strings.HasPrefix(cfgDir, d+"/") {
				readable = true
			}
		}
	}
	if !readable {
		t.Errorf("the configuration directory %s is not in ReadOnlyPaths %q", cfgDir, u[s]["ReadOnlyPaths"])
	}
}

// systemd itself finds nothing to say about the unit (an unknown key, a
// bad value), where systemd-analyze is installed.
func TestSystemdUnitVerifies(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("no systemd-analyze")
	}
	b, err := os.ReadFile(unitPath)
	if err != nil {
		t.Fatal(err)
	}
	// The binary is not installed here: point ExecStart at one that is.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	unit := strings.ReplaceAll(string(b), "/usr/local/bin/mongobouncer", self)
	path := filepath.Join(t.TempDir(), "mongobouncer.service")
	if err := os.WriteFile(path, []byte(unit), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", path).CombinedOutput()
	if err != nil || strings.Contains(string(out), "mongobouncer.service") {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}
