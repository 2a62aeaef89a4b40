package proxy

// The event loop's threads and I/O model: auto falls back to epoll,
// io_uring never does.

import (
	"log/slog"
	"runtime"
	"testing"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/evloop"
	"github.com/mongobouncer/mongobouncer/internal/testutil/seccomp"
	"github.com/mongobouncer/mongobouncer/internal/uring"
)

// LoopThreads sets the number of loop threads (one epoll set or io_uring
// each; auto has that many of each); 0 means GOMAXPROCS. LoopIO chooses
// epoll, or both where the kernel has io_uring.
func TestLoopThreads(t *testing.T) {
	for _, io := range []config.EventLoopIO{LoopIOAuto, LoopIOEpoll} {
		for _, tc := range []struct{ threads, want int }{
			{3, 3},
			{1, 1},
			{0, runtime.GOMAXPROCS(0)},
		} {
			s := &Server{opts: Options{EventLoop: true, LoopThreads: tc.threads, LoopIO: io}, log: slog.New(slog.DiscardHandler)}
			l := s.loopsFor()
			if l == nil {
				t.Fatalf("LoopThreads %d: the loop did not start", tc.threads)
			}
			if got := l.Threads(); got != tc.want {
				t.Errorf("LoopThreads %d: %d loop threads, want %d", tc.threads, got, tc.want)
			}
			if want := io == LoopIOAuto && uring.Supported(); isRing(l) != want {
				t.Errorf("LoopIO %q: io_uring %v, want %v", io, isRing(l), want)
			}
			if _, both := l.Adaptive(); both != (io == LoopIOAuto && uring.Supported()) {
				t.Errorf("LoopIO %q: both drivers %v", io, both)
			}
			s.stopLoops()
		}
	}
}

// Where the kernel refuses io_uring, LoopIOAuto starts the loop on epoll.
func TestLoopFallsBackToEpoll(t *testing.T) {
	if !seccomp.RefuseIOUring(t) {
		return
	}
	s := &Server{opts: Options{EventLoop: true, LoopThreads: 2, LoopIO: LoopIOAuto}, log: slog.New(slog.DiscardHandler)}
	l := s.loopsFor()
	if l == nil {
		t.Fatal("the loop did not start")
	}
	defer s.stopLoops()
	if isRing(l) || l.Threads() != 2 {
		t.Fatalf("io_uring %v with %d threads, want epoll with 2", isRing(l), l.Threads())
	}
}

// Where the ring cannot start, LoopIOUring does not fall back to epoll:
// the loop stays off, and New fails (so a test or a configuration that
// asks for io_uring never runs quietly on epoll).
func TestLoopIOUringNeverFallsBack(t *testing.T) {
	if !seccomp.RefuseIOUring(t) {
		return
	}
	s := &Server{opts: Options{EventLoop: true, LoopThreads: 2, LoopIO: LoopIOUring}, log: slog.New(slog.DiscardHandler)}
	l, err := s.startLoops()
	if l != nil {
		s.stopLoops()
		t.Fatalf("the loop started on io_uring %v, want no loop", isRing(l))
	}
	if err == nil {
		t.Fatal("no error from a ring that cannot start")
	}
	if s.loopsFor() != nil {
		t.Fatal("loopsFor started a loop after all")
	}
}

// isRing reports whether the loops run on the io_uring driver.
// isRing reports whether l runs io_uring, alone or beside epoll (auto).
func isRing(l *loops) bool {
	return l.IO() == evloop.IOUring || l.IO() == evloop.IOAdaptive
}
