package proxy

import (
	"runtime"
	"testing"
)

// LoopThreads sets the number of loop threads (one epoll set each); 0 means
// GOMAXPROCS.
func TestLoopThreads(t *testing.T) {
	for _, tc := range []struct{ threads, want int }{
		{3, 3},
		{1, 1},
		{0, runtime.GOMAXPROCS(0)},
	} {
		s := &Server{opts: Options{EventLoop: true, LoopThreads: tc.threads}}
		l := s.loopsFor()
		if l == nil {
			t.Fatalf("LoopThreads %d: the loop did not start", tc.threads)
		}
		if got := len(l.eps); got != tc.want {
			t.Errorf("LoopThreads %d: %d loop threads, want %d", tc.threads, got, tc.want)
		}
		s.stopLoops()
	}
}
