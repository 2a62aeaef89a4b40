// Package sdnotify tells systemd what state the service is in: the
// sd_notify(3) protocol, written on the standard library. Each notification
// is one datagram of newline-separated KEY=VALUE assignments sent to the
// unix datagram socket named by $NOTIFY_SOCKET ("READY=1", "RELOADING=1",
// "STOPPING=1", "STATUS=..."). Without NOTIFY_SOCKET there is no Notifier
// and every method of the nil *Notifier does nothing, so callers need no
// checks.
//
// A send never holds its caller for long: the write has a short deadline
// (a service manager that stopped reading must not stall a reload or a
// shutdown), and a failure is logged once at warn, then at debug.
//
// NOTIFY_SOCKET stays in the environment (sd_notify's unset_environment is
// not imitated): mongobouncer starts no child process that could inherit
// it, and systemd accepts only the main process's messages anyway with
// NotifyAccess=main. This package is a leaf: it imports the standard
// library only.
package sdnotify

import (
	"errors"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// EnvSocket is the environment variable systemd sets for Type=notify
// services: a socket path, or an abstract socket name starting with '@'.
const EnvSocket = "NOTIFY_SOCKET"

// WriteTimeout bounds one notification: the dial of a datagram socket does
// not wait, but a write to a receiver whose queue is full does.
const WriteTimeout = 250 * time.Millisecond

// MaxStatus bounds the STATUS= text, in bytes; a longer one is cut at a
// character boundary. systemd takes at most 4 KiB a message.
const MaxStatus = 256

// The assignments this package sends.
const (
	Ready     = "READY=1"
	Reloading = "RELOADING=1"
	Stopping  = "STOPPING=1"
)

// ErrUnsupportedSocket is returned by New for a NOTIFY_SOCKET that is
// neither an absolute path nor an abstract name (systemd's "vsock:"
// addresses, for a service manager outside a virtual machine, included).
var ErrUnsupportedSocket = errors.New("sdnotify: NOTIFY_SOCKET is neither an absolute path nor an abstract name (@...)")

// Notifier sends notifications to one service manager socket. It is safe
// for concurrent use; sends are serialised so that systemd sees the states
// in the order they were sent. A nil *Notifier sends nothing.
type Notifier struct {
	addr *net.UnixAddr
	log  *slog.Logger

	mu sync.Mutex // serialises sends; guards warned
	// warned is set once a failure was logged at warn: later ones are
	// logged at debug, so a socket gone for good does not flood the log.
	warned bool
}

// New returns a Notifier for socket, NOTIFY_SOCKET's value: nil, nil when
// socket is empty. log receives failures; nil discards them.
func New(socket string, log *slog.Logger) (*Notifier, error) {
	if socket == "" {
		return nil, nil
	}
	if socket[0] != '/' && socket[0] != '@' {
		return nil, ErrUnsupportedSocket
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// The net package maps a leading '@' to the abstract namespace's NUL
	// on Linux.
	return &Notifier{addr: &net.UnixAddr{Name: socket, Net: "unixgram"}, log: log}, nil
}

// FromEnv returns a Notifier for $NOTIFY_SOCKET, or nil when it is unset
// (not started by systemd as Type=notify) or unusable, which is logged at
// warn.
func FromEnv(log *slog.Logger) *Notifier {
	n, err := New(os.Getenv(EnvSocket), log)
	if err != nil {
		if log != nil {
			log.Warn("systemd notifications off", "error", err)
		}
		return nil
	}
	return n
}

// Socket returns the socket notifications go to.
func (n *Notifier) Socket() string {
	if n == nil {
		return ""
	}
	return n.addr.Name
}

// Send sends the assignments as one datagram. It returns the error, which
// it has also logged; callers may ignore it.
func (n *Notifier) Send(assignments ...string) error {
	if n == nil || len(assignments) == 0 {
		return nil
	}
	msg := strings.Join(assignments, "\n")
	n.mu.Lock()
	defer n.mu.Unlock()
	err := n.write(msg)
	if err != nil {
		if !n.warned {
			n.warned = true
			n.log.Warn("systemd notification failed; later failures are logged at debug", "socket", n.addr.Name, "error", err)
		} else {
			n.log.Debug("systemd notification failed", "socket", n.addr.Name, "error", err)
		}
	}
	return err
}

// write sends msg on a socket of its own, as sd_notify does: a connection
// kept open would go on pointing at the old socket after systemd re-executes
// itself and binds the path again.
func (n *Notifier) write(msg string) error {
	c, err := net.DialUnix("unixgram", nil, n.addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.SetWriteDeadline(time.Now().Add(WriteTimeout)); err != nil {
		return err
	}
	_, err = c.Write([]byte(msg))
	return err
}

// Ready says startup (or a reload) is complete: READY=1, with status when
// not empty.
func (n *Notifier) Ready(status string) error {
	return n.Send(withStatus([]string{Ready}, status)...)
}

// Reloading says a reload has begun: RELOADING=1 with MONOTONIC_USEC=,
// which systemd 253 and later require with Type=notify-reload (and accept
// with Type=notify). Ready ends the reload.
func (n *Notifier) Reloading(status string) error {
	if n == nil {
		return nil
	}
	a := []string{Reloading}
	if us, ok := monotonicUsec(); ok {
		a = append(a, "MONOTONIC_USEC="+strconv.FormatUint(us, 10))
	}
	return n.Send(withStatus(a, status)...)
}

// Stopping says the service is shutting down: STOPPING=1.
func (n *Notifier) Stopping(status string) error {
	return n.Send(withStatus([]string{Stopping}, status)...)
}

// Status sends STATUS= alone: free text that `systemctl status` shows.
func (n *Notifier) Status(status string) error {
	return n.Send(withStatus(nil, status)...)
}

func withStatus(a []string, status string) []string {
	if status == "" {
		return a
	}
	return append(a, "STATUS="+CleanStatus(status))
}

// CleanStatus makes s a valid STATUS= value: one line (newlines would
// start another assignment), valid UTF-8 (systemd ignores a message that is
// not) and at most MaxStatus bytes.
func CleanStatus(s string) string {
	s = strings.ToValidUTF8(s, "?")
	s = strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ").Replace(s)
	if len(s) > MaxStatus {
		cut := MaxStatus
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	return s
}
