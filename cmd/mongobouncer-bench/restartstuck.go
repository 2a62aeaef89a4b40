// A diagnostic of the restart measurement: when a command has had no reply
// for a while (loadgen's OnStuck), what every TCP socket holds (ss) and
// what each mongobouncer says of its clients (/admin/clients) are written
// to a file in the -stuck-dump directory, so that a reply that is late or
// lost between the upstream and the driver can be found while its
// connection is still open: which process has read the request and not
// answered, or holds the answer unread or unsent.

package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// stuckDumper returns loadgen's OnStuck for -stuck-dump, nil without it.
func stuckDumper(o restartOpts, sc scenario) func(string) {
	dir := o.stuckDir
	if dir == "" {
		return nil
	}
	return func(what string) {
		o.logger.Warn("command without a reply", "cmd", what)
		name := filepath.Join(dir, fmt.Sprintf("stuck-%s.txt", time.Now().UTC().Format("150405.000000")))
		f, err := os.Create(name)
		if err != nil {
			return
		}
		defer f.Close()
		fmt.Fprintf(f, "%s\n\n", what)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		out, _ := exec.CommandContext(ctx, "ss", "-tnpie").CombinedOutput()
		fmt.Fprintf(f, "== ss -tnpie\n%s\n", out)
		client := &http.Client{Timeout: 2 * time.Second}
		for _, a := range sc.adminAddrs() {
			fmt.Fprintf(f, "== %s /admin/clients\n", a)
			resp, err := client.Get("http://" + a + "/admin/clients")
			if err != nil {
				fmt.Fprintf(f, "%v\n", err)
				continue
			}
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			fmt.Fprintf(f, "%s\n", b)
		}
		o.logger.Warn("stuck dump written", "file", name)
	}
}
