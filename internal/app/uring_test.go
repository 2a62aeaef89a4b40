package app

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/proxy"
	"github.com/mongobouncer/mongobouncer/internal/testutil/seccomp"
	"github.com/mongobouncer/mongobouncer/internal/uring"
)

// Where the kernel refuses io_uring, event_loop_io = "io_uring" fails at
// startup with ErrNoIOUring, and "auto" runs the loop on epoll.
func TestIOUringRefusedByTheKernel(t *testing.T) {
	if !seccomp.RefuseIOUring(t) {
		return
	}
	cfg := config.Default()
	cfg.Global.Listen = "127.0.0.1:0"
	cfg.Databases = map[string]config.Route{"*": {ConnectionString: "mongodb://127.0.0.1:1/"}}

	required := cfg
	required.Global.EventLoopIO = config.EventLoopIOUring
	if a, err := New(required, nil); !errors.Is(err, ErrNoIOUring) {
		if err == nil {
			closeApp(a)
		}
		t.Fatalf("event_loop_io = io_uring: New returned %v, want ErrNoIOUring", err)
	}

	cfg.Global.EventLoopIO = config.EventLoopIOAuto
	a, err := New(cfg, nil)
	if err != nil {
		t.Fatalf("event_loop_io = auto: %v", err)
	}
	defer closeApp(a)
	a.Start()
	if got := a.LoopIO(); got != "epoll" {
		t.Fatalf("event_loop_io = auto: LoopIO %q, want epoll", got)
	}
}

func closeApp(a *App) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a.Close(ctx)
}

// The startup line names the driver the loop started on, as the proxy
// reports it, never a prediction: where the kernel allows a small ring
// (so uring.Supported says yes) but not the loop's rings, auto falls back
// to epoll, and LoopIO says epoll.
func TestLoopIONamesTheDriverThatStarted(t *testing.T) {
	if !seccomp.RefuseLargeIOUring(t, 8) {
		return
	}
	if !uring.Supported() {
		t.Fatal("a small ring is refused too: the filter is not the one this test needs")
	}
	cfg := config.Default()
	cfg.Global.Listen = "127.0.0.1:0"
	cfg.Global.EventLoopThreads = 1
	cfg.Databases = map[string]config.Route{"*": {ConnectionString: "mongodb://127.0.0.1:1/"}}
	a, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeApp(a)
	a.Start()
	if got := a.LoopIO(); got != "epoll" {
		t.Fatalf("the loop's rings are refused: LoopIO %q, want epoll (what runs)", got)
	}
}

// Each event_loop / event_loop_io setting reaches the proxy as it is, and
// LoopIO names what started.
func TestLoopIOBySetting(t *testing.T) {
	ring := uring.Supported()
	for _, tc := range []struct {
		loop bool
		io   config.EventLoopIO
		want string
	}{
		{false, config.EventLoopIOAuto, "off"},
		{true, config.EventLoopIOEpoll, "epoll"},
		{true, config.EventLoopIOAuto, map[bool]string{true: "epoll+io_uring", false: "epoll"}[ring]},
		{true, config.EventLoopIOUring, "io_uring"},
	} {
		if !proxy.EventLoopSupported && tc.loop {
			tc.want = "off"
		}
		if tc.io == config.EventLoopIOUring && !ring {
			continue // New fails: TestIOUringRefusedByTheKernel
		}
		cfg := config.Default()
		cfg.Global.Listen = "127.0.0.1:0"
		cfg.Global.EventLoop, cfg.Global.EventLoopIO, cfg.Global.EventLoopThreads = tc.loop, tc.io, 1
		cfg.Databases = map[string]config.Route{"*": {ConnectionString: "mongodb://127.0.0.1:1/"}}
		a, err := New(cfg, nil)
		if err != nil {
			t.Fatalf("event_loop %v, event_loop_io %q: %v", tc.loop, tc.io, err)
		}
		a.Start()
		got := a.LoopIO()
		closeApp(a)
		if got != tc.want {
			t.Errorf("event_loop %v, event_loop_io %q: LoopIO %q, want %q", tc.loop, tc.io, got, tc.want)
		}
	}
}
