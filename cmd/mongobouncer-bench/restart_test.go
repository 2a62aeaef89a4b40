// The restart subcommand end to end, short: one rolling restart of two
// mongobouncer instances behind HAProxy over devmongo, and its usage
// errors.

package main

import (
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/loadgen"
	"github.com/mongobouncer/mongobouncer/internal/testutil/devmongo"
)

func TestRestartUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"restart"}, "-mongobouncer BINARY is required"},
		{[]string{"restart", "-mongobouncer", "x", "-scenario", "blue-green"}, "-scenario"},
		{[]string{"restart", "-mongobouncer", "x", "-uri", "srv"}, "-uri"},
		{[]string{"restart", "-mongobouncer", "x", "-runs", "0"}, "-runs"},
		{[]string{"restart", "-mongobouncer", "x", "-tcp-migrate-req", "2"}, "-tcp-migrate-req"},
		{[]string{"restart", "-mongobouncer", "x", "-probe-burst", "5000"}, "-probe-burst"},
	} {
		code, _, stderr := runArgs(c.args...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("%q: exit %d, stderr %q; want 2 and %q", c.args, code, stderr, c.want)
		}
	}
}

// One short rolling restart: both instances are SIGTERMed in turn and
// exit 0, the driver's operations go on, every acknowledged write is read
// back, and the report adds up.
func TestRestartRollingSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("builds mongobouncer and runs devmongo, HAProxy and two instances")
	}
	if _, err := loadgen.FindHAProxy(""); err != nil {
		t.Skipf("haproxy not installed: %v", err)
	}
	if _, err := devmongo.Binary(); err != nil {
		t.Skipf("no devmongo: %v", err)
	}
	bouncer := filepath.Join(t.TempDir(), "mongobouncer")
	if out, err := exec.Command("go", "build", "-o", bouncer, "../mongobouncer").CombinedOutput(); err != nil {
		t.Fatalf("go build mongobouncer: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr strings.Builder
	code := run(ctx, []string{"restart", "-mongobouncer", bouncer, "-scenario", "rolling", "-runs", "1", "-restarts", "2",
		"-writers", "4", "-readers", "2", "-warmup", "500ms", "-settle", "1s", "-shutdown-timeout", "5s",
		"-probe-burst", "20", "-probe-interval", "50ms", "-json"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", code, stderr.String())
	}
	var out restartOutput
	if err := json.Unmarshal([]byte(stdout.String()), &out); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, stdout.String())
	}
	if len(out.Runs) != 1 || out.Median.Runs != 1 {
		t.Fatalf("runs: %+v", out)
	}
	r := out.Runs[0]
	t.Logf("table:\n%s", stderr.String())
	if len(r.Exits) != 2 || r.Exits[0].Name != "b0.1" || r.Exits[1].Name != "b1.1" {
		t.Fatalf("exits %+v, want b0.1 then b1.1", r.Exits)
	}
	for _, e := range r.Exits {
		if e.Code != 0 || e.Killed {
			t.Errorf("%s: exit %d killed %v", e.Name, e.Code, e.Killed)
		}
	}
	w := r.Writes
	if r.OKOps == 0 || w.Acked == 0 || w.Lost != 0 || w.Duplicated != 0 || w.Unexpected != 0 || w.Stored < w.Acked {
		t.Fatalf("operations %d, writes %+v", r.OKOps, w)
	}
	errs := 0
	for _, g := range r.Errors {
		errs += g.Count
	}
	if errs != r.ErrorsTotal || r.Probe.OK == 0 || r.Conns.Created == 0 || r.Gap.Length <= 0 || r.Gap.Length > r.Window {
		t.Fatalf("report does not add up: %+v", r)
	}
	if !strings.Contains(stderr.String(), "median of 1 runs") {
		t.Fatalf("no summary table:\n%s", stderr.String())
	}
}

// The medians skip the runs that failed and count non-zero exits.
func TestRestartSummarize(t *testing.T) {
	run := func(errs, lost, closed int, gap time.Duration, codes ...int) restartRun {
		r := restartRun{ErrorsTotal: errs, Writes: loadgen.WriteCheck{Lost: lost}, Gap: loadgen.Gap{Length: gap},
			Conns: loadgen.ConnStats{ClosedTotal: closed}}
		for _, c := range codes {
			r.Exits = append(r.Exits, exitInfo{Code: c})
		}
		return r
	}
	failed := run(99, 99, 99, time.Hour, 1, 1)
	failed.Error = "p1 exited before it was ready"
	got := summarize([]restartRun{run(1, 0, 129, 300*time.Millisecond, 0, 0), failed,
		run(8, 2, 80, 100*time.Millisecond, 0, 1), run(3, 0, 100, 200*time.Millisecond, 0, 0)})
	want := restartSummary{Runs: 3, Errors: 3, Lost: 0, Gap: 200 * time.Millisecond, ConnsClosed: 100, NonZeroExits: 0}
	if got != want {
		t.Fatalf("summarize = %+v\nwant %+v", got, want)
	}
	if got := summarize([]restartRun{failed}); got.Runs != 0 {
		t.Fatalf("only a failed run: %+v", got)
	}
}
