package topology

// Connection establishment failures that no load explains, real ones
// rather than made-up errors: a name that does not resolve and a
// certificate that does not verify. SDAM marks the server Unknown and CMAP
// clears its pool for them, where a connection that breaks or times out in
// its handshake is labelled SystemOverloadedError and changes nothing
// (TestHandshakeNetworkErrorIsBackpressure): an overloaded server does not
// make its name stop resolving, nor its certificate stop verifying.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/testutil/certs"
	"github.com/mongobouncer/mongobouncer/internal/testutil/fakemongo"
	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// A pool connection whose establishment fails for a reason no load
// explains, sent through HandleError as the proxy sends a failed checkout's
// error, marks the server Unknown (with that error) and clears its pool.
// The monitor is given its own way to the server (a dial to the fake's
// address, a CA that signed its certificate) so that the server is Usable
// beforehand and only the pool's connections fail.
func TestConnectFailureNoLoadExplainsMarksUnknown(t *testing.T) {
	ca := certs.NewCA(t, "upstream CA")
	serverTLS := &tls.Config{Certificates: []tls.Certificate{ca.Server(t, "127.0.0.1", "localhost").TLS()}}
	for _, tc := range []struct {
		name string
		// setup starts the upstream and returns the host the topology is
		// given, and the pool's and the monitor's dialer options.
		setup func(t *testing.T) (host string, pool, monitor upstream.Options)
		stage string
		// check tells whether err is the failure the case is about.
		check func(err error) bool
	}{
		{
			// A name that is not a domain name (an empty label): Go's
			// resolver answers "no such host" (a *net.DNSError) before
			// asking any server, so the test sends no query off the
			// machine, which a name under .invalid would (the resolver
			// asks the configured nameserver, which says NXDOMAIN).
			name: "name does not resolve",
			setup: func(t *testing.T) (string, upstream.Options, upstream.Options) {
				fake := fakemongo.Start(t, fakemongo.Options{})
				_, port, _ := net.SplitHostPort(fake.Addr())
				toFake := func(ctx context.Context, network, _ string) (net.Conn, error) {
					var d net.Dialer
					return d.DialContext(ctx, network, fake.Addr())
				}
				return net.JoinHostPort("mongobouncer-test..invalid", port), upstream.Options{}, upstream.Options{Dial: toFake}
			},
			stage: "dial",
			check: func(err error) bool {
				var dnsErr *net.DNSError
				return errors.As(err, &dnsErr)
			},
		},
		{
			name: "certificate signed by a CA the pool does not trust",
			setup: func(t *testing.T) (string, upstream.Options, upstream.Options) {
				fake := fakemongo.Start(t, fakemongo.Options{TLSConfig: serverTLS})
				other := certs.NewCA(t, "another CA")
				return fake.Addr(), upstream.Options{TLSConfig: &tls.Config{RootCAs: other.Pool()}},
					upstream.Options{TLSConfig: &tls.Config{RootCAs: ca.Pool()}}
			},
			stage: "tls",
			check: func(err error) bool {
				var authErr x509.UnknownAuthorityError
				return errors.As(err, &authErr)
			},
		},
		{
			name: "certificate for another name",
			setup: func(t *testing.T) (string, upstream.Options, upstream.Options) {
				fake := fakemongo.Start(t, fakemongo.Options{TLSConfig: serverTLS})
				return fake.Addr(), upstream.Options{TLSConfig: &tls.Config{RootCAs: ca.Pool(), ServerName: "mongo.example.com"}},
					upstream.Options{TLSConfig: &tls.Config{RootCAs: ca.Pool()}}
			},
			stage: "tls",
			check: func(err error) bool {
				var hostErr x509.HostnameError
				return errors.As(err, &hostErr)
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host, po, mo := tc.setup(t)
			rec := &recorder{}
			o := testOptions(rec, host)
			o.HeartbeatInterval = time.Minute
			po.AppName, po.ConnectTimeout, po.Logger = poolApp, 2*time.Second, testLogger()
			mo.AppName, mo.ConnectTimeout, mo.Logger = monitorApp, 2*time.Second, testLogger()
			o.Dialer, o.MonitorDialer = upstream.NewDialer(po), upstream.NewDialer(mo)
			topo := newTopology(t, o)
			s := selectAfterFirstCheck(t, topo)

			_, err := s.Pool().CheckOut(ctxTimeout(t, 10*time.Second))
			var ce *upstream.ConnectError
			if !errors.As(err, &ce) || ce.Stage != tc.stage || !tc.check(err) {
				t.Fatalf("CheckOut = %v, want the %s stage to fail with it", err, tc.stage)
			}
			s.HandleError(err, nil)
			if g := s.Pool().Stats().Generation; g != 1 {
				t.Errorf("after %v: pool generation %d, want 1 (cleared)", err, g)
			}
			if n := len(rec.poolEvents(pool.PoolCleared, "")); n != 1 {
				t.Errorf("%d PoolCleared events, want 1", n)
			}
			var unknown bool
			for _, e := range rec.topoEvents(ServerChanged, "") {
				if e.New.State == Unknown && errors.Is(e.Err, err) {
					unknown = true
				}
			}
			if !unknown {
				t.Errorf("server not marked Unknown by %v", err)
			}
			// The monitor, asked for a check, finds the server again.
			eventually(t, "server Usable again", func() bool { return s.State() == Usable })
		})
	}
}
