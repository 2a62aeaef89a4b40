// Package fakesystemd is the tests' service manager: a unix datagram
// socket to point NOTIFY_SOCKET at, which records every notification with
// the sender's process ID, as systemd sees them.
package fakesystemd

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Message is one notification datagram.
type Message struct {
	// Text is the datagram as sent: KEY=VALUE lines.
	Text string
	// PID is the sender's process ID from its credentials (systemd's
	// NotifyAccess=main compares it with the main PID); 0 where the
	// kernel does not pass them.
	PID int
}

// Has reports whether the message assigns key=value exactly.
func (m Message) Has(assignment string) bool {
	for l := range strings.SplitSeq(m.Text, "\n") {
		if l == assignment {
			return true
		}
	}
	return false
}

// Get returns the value assigned to key, and whether there is one.
func (m Message) Get(key string) (string, bool) {
	for l := range strings.SplitSeq(m.Text, "\n") {
		if v, ok := strings.CutPrefix(l, key+"="); ok {
			return v, true
		}
	}
	return "", false
}

// StatusOnly reports whether the message is a STATUS= update and nothing
// else (the periodic ones).
func (m Message) StatusOnly() bool {
	return !strings.Contains(m.Text, "\n") && strings.HasPrefix(m.Text, "STATUS=")
}

// Socket is a listening notification socket; Addr is NOTIFY_SOCKET's value.
type Socket struct {
	Addr string
	c    *net.UnixConn
}

// Listen binds a socket in a temporary directory (abstract false) or in
// the abstract namespace ("@..."), closed when the test ends.
func Listen(t testing.TB, abstract bool) *Socket {
	t.Helper()
	// A short directory: socket paths are limited to 107 bytes, and test
	// names make t.TempDir long.
	var name string
	if abstract {
		name = fmt.Sprintf("@mongobouncer-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	} else {
		dir, err := os.MkdirTemp("", "sdn")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		name = filepath.Join(dir, "notify")
	}
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	passCred(c)
	return &Socket{Addr: name, c: c}
}

// Next returns the next notification, or an error when none comes within
// timeout.
func (s *Socket) Next(timeout time.Duration) (Message, error) {
	buf := make([]byte, 8192)
	oob := make([]byte, 1024)
	if err := s.c.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return Message{}, err
	}
	n, oobn, _, _, err := s.c.ReadMsgUnix(buf, oob)
	if err != nil {
		return Message{}, err
	}
	return Message{Text: string(buf[:n]), PID: credPID(oob[:oobn])}, nil
}

// Expect waits up to timeout for a message that is not StatusOnly and
// returns it with the status-only messages seen before it.
func (s *Socket) Expect(t testing.TB, timeout time.Duration) (Message, []Message) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var statuses []Message
	for {
		m, err := s.Next(time.Until(deadline))
		if err != nil {
			t.Fatalf("no notification within %v (statuses %v): %v", timeout, statuses, err)
		}
		if !m.StatusOnly() {
			return m, statuses
		}
		statuses = append(statuses, m)
	}
}

// Quiet fails the test if a message other than a status-only one arrives
// within d.
func (s *Socket) Quiet(t testing.TB, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		m, err := s.Next(time.Until(deadline))
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if !m.StatusOnly() {
			t.Fatalf("unexpected notification %q", m.Text)
		}
	}
}

// None fails the test if any message arrives within d.
func (s *Socket) None(t testing.TB, d time.Duration) {
	t.Helper()
	m, err := s.Next(d)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Fatalf("unexpected notification %q", m.Text)
}
