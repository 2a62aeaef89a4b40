package upstream

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// detachedPair returns a detached client end and the server end of a
// loopback TCP connection.
func detachedPair(t *testing.T) (*fdConn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	peer := <-accepted
	if peer == nil {
		t.Fatal("accept failed")
	}
	dc, ok := detach(nc)
	if !ok {
		t.Fatal("detach refused a TCP connection")
	}
	c := dc.(*fdConn)
	t.Cleanup(func() {
		_ = c.Close()
		_ = peer.Close()
	})
	return c, peer
}

func TestFdConnReadWrite(t *testing.T) {
	c, peer := detachedPair(t)
	if c.LocalAddr().String() != peer.RemoteAddr().String() || c.RemoteAddr().String() != peer.LocalAddr().String() {
		t.Fatalf("addresses %v %v vs %v %v", c.LocalAddr(), c.RemoteAddr(), peer.LocalAddr(), peer.RemoteAddr())
	}
	// A write larger than the socket buffers completes as the peer reads.
	big := bytes.Repeat([]byte("mongobouncer"), 1<<20)
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(peer, int64(len(big))))
		got <- b
	}()
	if n, err := c.Write(big); err != nil || n != len(big) {
		t.Fatalf("write %d of %d: %v", n, len(big), err)
	}
	if b := <-got; !bytes.Equal(b, big) {
		t.Fatalf("peer read %d bytes, not what was written", len(b))
	}
	// A read waits for data.
	go func() {
		time.Sleep(20 * time.Millisecond)
		_, _ = peer.Write([]byte("hello"))
	}()
	buf := make([]byte, 16)
	if n, err := c.Read(buf); err != nil || string(buf[:n]) != "hello" {
		t.Fatalf("read %q %v", buf[:n], err)
	}
	// The peer's close is EOF.
	_ = peer.Close()
	if _, err := c.Read(buf); err != io.EOF {
		t.Fatalf("read after the peer closed: %v", err)
	}
}

func TestFdConnDeadlines(t *testing.T) {
	c, _ := detachedPair(t)
	buf := make([]byte, 16)
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
	start := time.Now()
	_, err := c.Read(buf)
	var ne net.Error
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() || time.Since(start) < 30*time.Millisecond {
		t.Fatalf("read past its deadline: %v after %v", err, time.Since(start))
	}
	// A deadline moved into the past during a wait ends it within a poll
	// slice.
	_ = c.SetDeadline(time.Time{})
	errc := make(chan error, 1)
	go func() {
		_, err := c.Read(buf)
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	_ = c.SetReadDeadline(time.Unix(1, 0))
	select {
	case err := <-errc:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read after its deadline moved: %v", err)
		}
	case <-time.After(2 * pollSlice):
		t.Fatal("a deadline moved during a read was not seen")
	}
}

func TestFdConnClose(t *testing.T) {
	c, _ := detachedPair(t)
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var seen uintptr
	if err := rc.Control(func(fd uintptr) { seen = fd }); err != nil || int(seen) != c.fd {
		t.Fatalf("Control: %v, fd %d", err, seen)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 8))
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	start := time.Now()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		// Shut down under the read: EOF, or closed if the read looked
		// after Close began.
		if err != io.EOF && !errors.Is(err, net.ErrClosed) {
			t.Fatalf("read interrupted by Close: %v", err)
		}
	case <-time.After(pollSlice / 2):
		t.Fatal("Close did not interrupt a blocked read")
	}
	if time.Since(start) > pollSlice/2 {
		t.Fatalf("Close took %v", time.Since(start))
	}
	if err := c.Close(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("write after Close: %v", err)
	}
	if err := rc.Read(func(uintptr) bool { t.Error("raw read ran after Close"); return true }); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("raw read after Close: %v", err)
	}
}

// A Dialer with Detach hands out detached plain connections, and keeps TLS
// ones as they are (crypto/tls needs its net.Conn).
func TestDialDetached(t *testing.T) {
	srv := newFakeServer(t, serveHello(helloReply(nil)))
	c := dialDev(t, Options{Detach: true}, srv.addr())
	if _, ok := c.NetConn().(*fdConn); !ok {
		t.Fatalf("NetConn is %T, want *fdConn", c.NetConn())
	}
	if _, err := c.RoundTrip(testCtx(t), "admin", ping()); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.RawConn(); !ok {
		t.Fatal("no RawConn on a detached connection")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RoundTrip(testCtx(t), "admin", ping()); !errors.Is(err, ErrClosed) {
		t.Fatalf("RoundTrip after Close: %v", err)
	}
}
