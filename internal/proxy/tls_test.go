package proxy

// Client TLS: allow, require, certificates and subjects, the handshake
// timeout, and that a TLS client stays off the loop (the sniffing itself
// is gate's).

import (
	"context"
	"crypto/tls"
	"crypto/x509/pkix"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongobouncer/mongobouncer/internal/clienttls"
	"github.com/mongobouncer/mongobouncer/internal/config"
	"github.com/mongobouncer/mongobouncer/internal/routing"
	"github.com/mongobouncer/mongobouncer/internal/testutil/certs"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/testutil/wait"
)

// tlsRig is a proxy serving clients with TLS in some mode, over one fake
// upstream.
type tlsRig struct {
	s      *Server
	addr   string
	ca     *certs.Cert // signs the proxy's certificate and the clients'
	client *certs.Cert // a client certificate signed by ca
}

func newTLSRig(t *testing.T, mode config.TLSMode, loop, clientCerts bool, timeout time.Duration) *tlsRig {
	t.Helper()
	up := fakemongo.Start(t, fakemongo.Options{})
	ca := certs.NewCA(t, "proxy CA")
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{ca.Server(t, "127.0.0.1", "localhost").TLS()}}
	if clientCerts {
		cfg.ClientCAs, cfg.ClientAuth = ca.Pool(), tls.RequireAndVerifyClientCert
	}
	s, err := New(Options{Routes: []*routing.Route{limitsRoute(t, "*", up.Addr())}, EventLoop: loop, Logger: slog.New(slog.DiscardHandler),
		TLS: clienttls.Settings{Mode: mode, Config: cfg, HandshakeTimeout: timeout}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(ln, "") }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	cl := ca.Client(t, pkix.Name{CommonName: "app", OrganizationalUnit: []string{"team,1"}, Organization: []string{"Example"}, Country: []string{"FR"}})
	return &tlsRig{s: s, addr: ln.Addr().String(), ca: ca, client: cl}
}

func (r *tlsRig) dialTLS(t *testing.T, withCert bool) (*affConn, error) {
	t.Helper()
	cfg := &tls.Config{RootCAs: r.ca.Pool(), ServerName: "localhost", MinVersion: tls.VersionTLS12}
	if withCert {
		cfg.Certificates = []tls.Certificate{r.client.TLS()}
	}
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second}, Config: cfg}
	nc, err := d.Dial("tcp", r.addr)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { nc.Close() })
	return &affConn{t: t, c: nc}, nil
}

func (r *tlsRig) dialPlain(t *testing.T) *affConn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", r.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &affConn{t: t, c: nc}
}

// clientsBy returns the server's clients split by TLS, with their loop
// states (read under each client's ownMu).
func (r *tlsRig) clientsBy() (tlsStates, plainStates []loopState) {
	r.s.clientsMu.Lock()
	defer r.s.clientsMu.Unlock()
	for c := range r.s.clients {
		c.lc.Mu.Lock()
		st, isTLS := c.lc.State, c.tlsConn != nil
		c.lc.Mu.Unlock()
		if isTLS {
			tlsStates = append(tlsStates, st)
		} else {
			plainStates = append(plainStates, st)
		}
	}
	return
}

var pingCmd = bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}}

// allow: a TLS and a plain client share the port. With the event loop on,
// the idle plain client is handed to the loop and the TLS one never is.
func TestTLSAllowSharesThePortAndKeepsTLSOffTheLoop(t *testing.T) {
	for _, loop := range []bool{false, true} {
		t.Run(map[bool]string{false: "goroutines", true: "event loop"}[loop], func(t *testing.T) {
			if loop && !EventLoopSupported {
				t.Skip("the event loop is Linux only")
			}
			r := newTLSRig(t, config.TLSModeAllow, loop, false, 0)
			tc, err := r.dialTLS(t, false)
			if err != nil {
				t.Fatal(err)
			}
			pc := r.dialPlain(t)
			for range 3 {
				affOK(t, tc.cmd(pingCmd))
				affOK(t, pc.cmd(pingCmd))
			}
			wait.Until(t, "both clients idle", 5*time.Second, 5*time.Millisecond, func() bool {
				ts, ps := r.clientsBy()
				if len(ts) != 1 || len(ps) != 1 {
					return false
				}
				return !loop || ps[0] == lsIdle
			})
			// Long enough for a hand-over to the loop to have happened.
			time.Sleep(50 * time.Millisecond)
			if ts, _ := r.clientsBy(); ts[0] != lsGoroutine {
				t.Fatalf("the TLS client is in loop state %d, want its goroutine", ts[0])
			}
			affOK(t, tc.cmd(pingCmd))
			affOK(t, pc.cmd(pingCmd))
		})
	}
}

// require: a plain client gets an error reply saying TLS is required, and
// is counted; a TLS client is served.
func TestTLSRequireRefusesPlain(t *testing.T) {
	r := newTLSRig(t, config.TLSModeRequire, false, false, 0)
	pc := r.dialPlain(t)
	rep := pc.cmd(bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}})
	if msg, _ := rep.Lookup("errmsg").StringValueOK(); !strings.Contains(msg, "requires TLS") {
		t.Fatalf("plain client got %v, want an error saying TLS is required", rep)
	}
	if plain, hs := r.s.TLSRefusals(); plain != 1 || hs != 0 {
		t.Fatalf("refusals: plain %d, handshake %d", plain, hs)
	}
	tc, err := r.dialTLS(t, false)
	if err != nil {
		t.Fatal(err)
	}
	affOK(t, tc.cmd(pingCmd))
}

// With client CAs a client without a certificate fails its handshake;
// one with a certificate is served and its subject is the RFC 2253 name.
func TestTLSClientCertificateAndSubject(t *testing.T) {
	r := newTLSRig(t, config.TLSModeRequire, false, true, 0)
	if c, err := r.dialTLS(t, false); err == nil {
		// TLS 1.3: the server's verdict on the client comes with the
		// first read.
		_ = c.c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err = c.c.Write([]byte{0}); err == nil {
			_, err = c.c.Read(make([]byte, 1))
		}
		if err == nil {
			t.Fatal("a client without a certificate was served")
		}
	}
	wait.Until(t, "the failed handshake counted", 5*time.Second, 5*time.Millisecond, func() bool {
		_, hs := r.s.TLSRefusals()
		return hs == 1
	})
	tc, err := r.dialTLS(t, true)
	if err != nil {
		t.Fatal(err)
	}
	affOK(t, tc.cmd(pingCmd))
	r.s.clientsMu.Lock()
	var subjects []string
	for c := range r.s.clients {
		if s, ok := c.tlsSubject(); ok {
			subjects = append(subjects, s)
		}
	}
	r.s.clientsMu.Unlock()
	if want := `CN=app,OU=team\,1,O=Example,C=FR`; len(subjects) != 1 || subjects[0] != want {
		t.Fatalf("subjects %q, want [%s]", subjects, want)
	}
}

// A client that says nothing, or starts a handshake and stalls, is closed
// after the handshake timeout; the accept loop serves others meanwhile.
func TestTLSHandshakeTimeout(t *testing.T) {
	r := newTLSRig(t, config.TLSModeAllow, false, false, 300*time.Millisecond)
	silent := r.dialPlain(t)
	stalled := r.dialPlain(t)
	if _, err := stalled.c.Write([]byte{0x16, 0x03, 0x01, 0x00}); err != nil {
		t.Fatal(err)
	}
	// Not blocked behind them:
	tc, err := r.dialTLS(t, false)
	if err != nil {
		t.Fatal(err)
	}
	affOK(t, tc.cmd(pingCmd))
	for _, c := range []*affConn{silent, stalled} {
		_ = c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
		start := time.Now()
		if _, err := c.c.Read(make([]byte, 1)); err == nil {
			t.Fatal("read a byte, want the connection closed")
		} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatal("the proxy did not close a client stuck before its handshake")
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("closed after %v", d)
		}
	}
	if _, hs := r.s.TLSRefusals(); hs != 1 {
		t.Fatalf("%d handshake failures counted, want 1 (the stalled one; the silent one is not a TLS failure)", hs)
	}
}

// A unix socket client is served plain even when TLS is required, as by
// mongod.
func TestTLSRequireServesUnixSocketsPlain(t *testing.T) {
	r := newTLSRig(t, config.TLSModeRequire, false, false, 0)
	path := filepath.Join(t.TempDir(), "mb.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = r.s.Serve(ln, "") }()
	nc, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	affOK(t, (&affConn{t: t, c: nc}).cmd(pingCmd))
	if plain, _ := r.s.TLSRefusals(); plain != 0 {
		t.Fatalf("%d plain refusals", plain)
	}
}
