package sysconn

import (
	"net"
	"syscall"
	"testing"
	"time"
)

func TestDup(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			_, _ = c.Write([]byte("hi"))
			c.Close()
		}
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	fd, err := Dup(nc)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	// The socket outlives the net.Conn through the duplicate.
	_ = nc.Close()
	flags, _, e := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_GETFD, 0)
	if e != 0 || flags&syscall.FD_CLOEXEC == 0 {
		t.Fatalf("duplicate flags %#x (%v): want close-on-exec", flags, e)
	}
	b := make([]byte, 2)
	n := 0
	deadline := time.Now().Add(5 * time.Second)
	for n < 2 {
		m, err := syscall.Read(fd, b[n:])
		if err == syscall.EAGAIN && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond) // non-blocking, as Go made the original
			continue
		}
		if err != nil || m == 0 {
			t.Fatalf("read from the duplicate: %d %v", m, err)
		}
		n += m
	}
	if string(b) != "hi" {
		t.Fatalf("read %q", b)
	}
	if _, err := Dup(pipeConn{}); err != ErrNoDescriptor {
		t.Fatalf("Dup of a conn without a descriptor: %v", err)
	}
}

// pipeConn is a net.Conn with no descriptor.
type pipeConn struct{ net.Conn }
