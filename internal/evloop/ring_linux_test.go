package evloop

import (
	"bytes"
	"log/slog"
	"strings"
	"syscall"
	"testing"
)

// A ring thread whose wait fails goes on when the kernel could not flush
// its completions at once, or dropped some (logged); any other error stops
// it, logged.
func TestEnterGoesOn(t *testing.T) {
	for _, tc := range []struct {
		err        error
		on, logged bool
	}{
		{syscall.EAGAIN, true, false},
		{syscall.EBUSY, true, false},
		{syscall.EBADR, true, true},
		{syscall.EBADF, false, true},
		{syscall.EINVAL, false, true},
	} {
		var buf bytes.Buffer
		l := &Loop{log: slog.New(slog.NewTextHandler(&buf, nil))}
		if got := enterGoesOn(l, tc.err); got != tc.on {
			t.Errorf("%v: goes on %v, want %v", tc.err, got, tc.on)
		}
		if logged := strings.Contains(buf.String(), "level=ERROR"); logged != tc.logged {
			t.Errorf("%v: logged %q, want an error logged: %v", tc.err, buf.String(), tc.logged)
		}
	}
}
