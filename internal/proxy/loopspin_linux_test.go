package proxy

import (
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/uring"
)

// A loop thread waits awake for the reply to its one request in flight
// only while replies come back within LoopSpin (loop_spin_linux.go): a
// fast upstream is waited for awake, a slow one and LoopSpin 0 never.
func TestLoopSpinsForALoneFastReply(t *testing.T) {
	if !uring.Supported() {
		t.Skip("the kernel refuses io_uring here")
	}
	for _, tc := range []struct {
		name  string
		spin  time.Duration
		delay time.Duration
		want  bool
	}{
		{"fast upstream", time.Millisecond, 0, true},
		{"spin off", 0, 0, false},
		{"slow upstream", time.Millisecond, 3 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, rigOptions{loop: true, io: LoopIOUring, maxPool: 1, spin: tc.spin}, func(*fakemongo.Request) fakemongo.Reply {
				rep := fakemongo.OK()
				rep.Delay = tc.delay
				return rep
			})
			cl := r.client(0)
			r.waitState(r.only(), lsIdle)
			for range 50 {
				affOK(t, cl.cmd(ping()))
			}
			caught, missed := r.s.LoopSpins()
			if got := caught > 0; got != tc.want {
				t.Fatalf("%d of 50 replies caught by a spin; want some: %v", caught, tc.want)
			}
			if !tc.want && missed > 0 {
				t.Fatalf("%d spins ended without a reply, want no spin at all", missed)
			}
		})
	}
}
