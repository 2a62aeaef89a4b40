package app

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/proxy"
	"github.com/mongobouncer/mongobouncer/internal/testutil/seccomp"
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
	if got := LoopIO(cfg.Global); got != "epoll" {
		t.Fatalf("event_loop_io = auto: LoopIO %q, want epoll", got)
	}
	a, err := New(cfg, nil)
	if err != nil {
		t.Fatalf("event_loop_io = auto: %v", err)
	}
	closeApp(a)
}

func closeApp(a *App) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	a.Close(ctx)
}

// event_loop_io = "io_uring" stays required in the proxy: a ring that
// cannot start there (a locked-memory limit on a kernel that allows
// io_uring) fails the start rather than running epoll.
func TestIOUringRequiredReachesTheProxy(t *testing.T) {
	for io, want := range map[config.EventLoopIO]string{
		config.EventLoopIOUring: proxy.LoopIOUring,
		config.EventLoopIOEpoll: proxy.LoopIOEpoll,
		config.EventLoopIOAuto:  proxy.LoopIOAuto,
		"":                      proxy.LoopIOAuto,
	} {
		if got := loopIO(io); got != want {
			t.Errorf("event_loop_io %q: proxy LoopIO %q, want %q", io, got, want)
		}
	}
}
