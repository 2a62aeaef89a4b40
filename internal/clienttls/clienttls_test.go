package clienttls

// The TLS step of a new client over loopback sockets: settings checked,
// plain bytes kept (allow) or refused (require), a TLS client's sniffed
// bytes replayed into its handshake, unix sockets left plain, and the
// login deadline told apart from the handshake timeout.

import (
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/testutil/certs"
)

var discard = slog.New(slog.DiscardHandler)

type countObs struct{ reasons []string }

func (o *countObs) ClientTLSRefused(reason string) { o.reasons = append(o.reasons, reason) }

func TestSetChecksSettings(t *testing.T) {
	var tm Terminator
	if err := tm.Set(Settings{Mode: "requires"}); !errors.Is(err, ErrConfig) {
		t.Fatalf("mode requires: %v, want ErrConfig", err)
	}
	if err := tm.Set(Settings{Mode: config.TLSModeAllow}); !errors.Is(err, ErrConfig) {
		t.Fatalf("allow without a tls.Config: %v, want ErrConfig", err)
	}
	if err := tm.Set(Settings{Mode: config.TLSModeAllow, Config: &tls.Config{}}); err != nil {
		t.Fatal(err)
	}
	if d := tm.cur.Load().HandshakeTimeout; d != DefaultHandshakeTimeout {
		t.Fatalf("handshake timeout %v, want the default", d)
	}
}

// pair returns the proxy's end and the client's end of a loopback TCP
// connection.
func pair(t *testing.T, network, addr string) (server, client net.Conn) {
	t.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		got <- c
	}()
	client, err = net.DialTimeout(network, ln.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case server = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("no accept")
	}
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { server.Close(); client.Close() })
	return server, client
}

func rig(t *testing.T, mode config.TLSMode, timeout time.Duration) (*Terminator, *certs.Cert) {
	t.Helper()
	ca := certs.NewCA(t, "test CA")
	var tm Terminator
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{ca.Server(t, "localhost").TLS()}}
	if err := tm.Set(Settings{Mode: mode, Config: cfg, HandshakeTimeout: timeout}); err != nil {
		t.Fatal(err)
	}
	return &tm, ca
}

// A plain client's first bytes stay in the buffer under allow; under
// require it is to be refused, and counted.
func TestAcceptPlain(t *testing.T) {
	first := []byte{0x10, 0x01, 0x00, 0x00, 0x07}
	for _, mode := range []config.TLSMode{config.TLSModeAllow, config.TLSModeRequire} {
		tm, _ := rig(t, mode, 0)
		srv, cl := pair(t, "tcp", "127.0.0.1:0")
		if _, err := cl.Write(first); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64)
		var obs countObs
		r, err := tm.Accept(srv, buf, time.Time{}, &obs, discard)
		if err != nil || r.Conn != nil || r.N == 0 || string(buf[:r.N]) != string(first[:r.N]) {
			t.Fatalf("%s: result %+v, error %v, bytes %x", mode, r, err, buf[:r.N])
		}
		plain, hs := tm.Refusals()
		if want := mode == config.TLSModeRequire; r.RefusePlain != want || (plain == 1) != want || hs != 0 || (len(obs.reasons) == 1) != want {
			t.Fatalf("%s: refuse %v, refusals %d/%d, observed %v", mode, r.RefusePlain, plain, hs, obs.reasons)
		}
	}
}

// A TLS client's handshake completes over the bytes read to sniff it, and
// Close closes the socket.
func TestAcceptTLSReplaysSniffedBytes(t *testing.T) {
	tm, ca := rig(t, config.TLSModeRequire, 0)
	srv, cl := pair(t, "tcp", "127.0.0.1:0")
	tc := tls.Client(cl, &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost", MinVersion: tls.VersionTLS12})
	done := make(chan error, 1)
	go func() {
		_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
		if err := tc.Handshake(); err != nil {
			done <- err
			return
		}
		_, err := tc.Write([]byte("hi"))
		done <- err
	}()
	r, err := tm.Accept(srv, make([]byte, 64), time.Time{}, nil, discard)
	if err != nil || r.Conn == nil || r.N != 0 {
		t.Fatalf("result %+v, error %v", r, err)
	}
	b := make([]byte, 2)
	_ = r.Conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(r.Conn, b); err != nil || string(b) != "hi" {
		t.Fatalf("read %q, %v", b, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if r.Conn.Raw() != srv {
		t.Fatal("Raw is not the socket")
	}
	_ = r.Conn.Close()
	_ = cl.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := cl.Read(b); err == nil {
		t.Fatal("socket still open after Close")
	}
}

// A unix socket client is left plain, nothing read, even under require.
func TestAcceptLeavesUnixSocketsPlain(t *testing.T) {
	tm, _ := rig(t, config.TLSModeRequire, 0)
	srv, _ := pair(t, "unix", filepath.Join(t.TempDir(), "s"))
	r, err := tm.Accept(srv, make([]byte, 64), time.Time{}, nil, discard)
	if err != nil || r != (Result{}) {
		t.Fatalf("result %+v, error %v", r, err)
	}
}

// The deadline that expires is named: the login deadline when it comes
// first, at the step the client was at; a handshake that fails is counted.
func TestAcceptDeadlines(t *testing.T) {
	cases := []struct {
		name      string
		send      []byte
		login     time.Duration
		step      Step
		byLogin   bool
		handshake uint64
	}{
		{"silent, handshake timeout", nil, 0, StepFirstBytes, false, 0},
		{"silent, login deadline", nil, 100 * time.Millisecond, StepFirstBytes, true, 0},
		{"stalled handshake, login deadline", []byte{0x16, 0x03, 0x01, 0x00}, 100 * time.Millisecond, StepHandshake, true, 1},
		{"stalled handshake, handshake timeout", []byte{0x16, 0x03, 0x01, 0x00}, time.Minute, StepHandshake, false, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tm, _ := rig(t, config.TLSModeAllow, 200*time.Millisecond)
			srv, cl := pair(t, "tcp", "127.0.0.1:0")
			if _, err := cl.Write(c.send); err != nil {
				t.Fatal(err)
			}
			var ld time.Time
			if c.login > 0 {
				ld = time.Now().Add(c.login)
			}
			start := time.Now()
			_, err := tm.Accept(srv, make([]byte, 64), ld, nil, discard)
			var te *Error
			if !errors.As(err, &te) || te.Step != c.step || te.LoginTimeout != c.byLogin {
				t.Fatalf("error %#v, want step %d, login timeout %v", err, c.step, c.byLogin)
			}
			if d := time.Since(start); d > 3*time.Second {
				t.Fatalf("took %v", d)
			}
			if _, hs := tm.Refusals(); hs != c.handshake {
				t.Fatalf("%d handshake failures, want %d", hs, c.handshake)
			}
		})
	}
}
