package uring

import (
	"errors"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/testutil/seccomp"
)

// ringAndPair returns a ring of entries entries and a connected pair of
// Unix stream sockets, all closed when t ends; it skips t where io_uring
// is unavailable. The caller has locked its OS thread (SINGLE_ISSUER).
func ringAndPair(t *testing.T, entries uint32) (*Ring, [2]int) {
	t.Helper()
	r, err := New(entries)
	if err != nil {
		t.Skipf("io_uring unavailable: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	sp, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(sp[0]); syscall.Close(sp[1]) })
	return r, [2]int{sp[0], sp[1]}
}

// A receive, a linked send and a pipe read complete through one ring, in
// batches, with their results.
func TestRecvSendRead(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r, sp := ringAndPair(t, 8)
	var p [2]int
	if err := syscall.Pipe(p[:]); err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(p[0])
	defer syscall.Close(p[1])

	got := map[uint64]int32{}
	collect := func(ud uint64, res int32) { got[ud] = res }

	buf := make([]byte, 16)
	r.Recv(sp[1], buf, 1, true)
	r.Send(sp[0], []byte("hello"), 2, true)
	pb := make([]byte, 4)
	r.Read(p[0], pb, 3)
	if err := r.Enter(2); err != nil {
		t.Fatal(err)
	}
	r.Completions(collect)
	if got[1] != 5 || string(buf[:5]) != "hello" || got[2] != 5 {
		t.Fatalf("completions %v, buf %q", got, buf)
	}
	if _, ok := got[3]; ok {
		t.Fatalf("pipe read completed before anything was written: %v", got)
	}
	if _, err := syscall.Write(p[1], []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := r.Enter(1); err != nil {
		t.Fatal(err)
	}
	r.Completions(collect)
	if got[3] != 1 || pb[0] != 'x' {
		t.Fatalf("pipe read: %v %q", got, pb)
	}
	// A receive on a socket shut down completes with 0 (end of stream).
	r.Recv(sp[1], buf, 4, false)
	if err := syscall.Shutdown(sp[0], syscall.SHUT_WR); err != nil {
		t.Fatal(err)
	}
	if err := r.Enter(1); err != nil {
		t.Fatal(err)
	}
	r.Completions(collect)
	if res, ok := got[4]; !ok || res != 0 {
		t.Fatalf("receive after shutdown: %v", got)
	}
}

// More operations than the submission queue holds are submitted as the
// queue fills.
func TestQueueFull(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r, err := New(4)
	if err != nil {
		t.Skipf("io_uring unavailable: %v", err)
	}
	defer r.Close()
	var p [2]int
	if err := syscall.Pipe(p[:]); err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(p[0])
	defer syscall.Close(p[1])
	bufs := make([][]byte, 10)
	for i := range bufs {
		bufs[i] = make([]byte, 1)
		r.Read(p[0], bufs[i], uint64(i))
	}
	if _, err := syscall.Write(p[1], []byte("0123456789")); err != nil {
		t.Fatal(err)
	}
	n := 0
	for n < 10 {
		if err := r.Enter(1); err != nil {
			t.Fatal(err)
		}
		r.Completions(func(ud uint64, res int32) {
			if res != 1 {
				t.Errorf("read %d: %d", ud, res)
			}
			n++
		})
	}
}

// Where a seccomp profile refuses io_uring, New fails with the kernel's
// error and Supported says so.
func TestRefusedByTheKernel(t *testing.T) {
	if !seccomp.RefuseIOUring(t) {
		return
	}
	if Supported() {
		t.Fatal("Supported with io_uring_setup refused")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r, err := New(8)
	if err == nil {
		r.Close()
		t.Fatal("New succeeded with io_uring_setup refused")
	}
	if !errors.Is(err, syscall.EPERM) {
		t.Fatalf("New: %v, want EPERM", err)
	}
}

// SendThenRecv: a whole send posts no completion and its receive gets the
// answer, even when the pair did not fit the queue at first; a failed
// send posts its error, and its receive is cancelled without a completion.
func TestSendThenRecv(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	r, sp := ringAndPair(t, 4)

	type cqe struct {
		ud  uint64
		res int32
	}
	var got []cqe
	collect := func(ud uint64, res int32) { got = append(got, cqe{ud, res}) }
	in := make([]byte, 16)
	// Three reads in flight leave one free entry: the pair does not fit,
	// and is submitted whole once the three are.
	var p [2]int
	if err := syscall.Pipe(p[:]); err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(p[0])
	defer syscall.Close(p[1])
	pb := make([]byte, 3)
	for i := range 3 {
		r.Read(p[0], pb[i:i+1], uint64(10+i))
	}
	r.SendThenRecv(sp[0], []byte("ping"), 1, in, 2)
	if err := r.Enter(0); err != nil {
		t.Fatal(err)
	}
	peer := make([]byte, 16)
	n, err := syscall.Read(sp[1], peer)
	if err != nil || string(peer[:n]) != "ping" {
		t.Fatalf("peer read %q, %v", peer[:n], err)
	}
	if _, err := syscall.Write(sp[1], []byte("pong")); err != nil {
		t.Fatal(err)
	}
	for deadline := 0; len(got) == 0 && deadline < 100; deadline++ {
		if err := r.Enter(1); err != nil {
			t.Fatal(err)
		}
		r.Completions(collect)
	}
	if len(got) != 1 || got[0] != (cqe{2, 4}) || string(in[:4]) != "pong" {
		t.Fatalf("completions %v, received %q; want only the receive's, of \"pong\"", got, in[:4])
	}

	// The peer gone, the send fails (EPIPE): its completion is the only
	// one, the receive cancelled without any (even with bytes to read).
	got = got[:0]
	if err := syscall.Shutdown(sp[1], syscall.SHUT_RD); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Shutdown(sp[0], syscall.SHUT_WR); err != nil {
		t.Fatal(err)
	}
	r.SendThenRecv(sp[0], []byte("ping"), 3, in, 4)
	for deadline := 0; len(got) < 1 && deadline < 1000; deadline++ {
		if err := r.Enter(0); err != nil {
			t.Fatal(err)
		}
		r.Completions(collect)
		time.Sleep(time.Millisecond)
	}
	if _, err := syscall.Write(sp[1], []byte("late")); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if err := r.Enter(0); err != nil {
			t.Fatal(err)
		}
		r.Completions(collect)
		time.Sleep(time.Millisecond)
	}
	if len(got) != 1 || got[0] != (cqe{3, -int32(syscall.EPIPE)}) {
		t.Fatalf("completions %v; want the send's -EPIPE alone", got)
	}
}
