package upstream

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/pool"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// generous bounds "promptly" on a slow, noisy machine; the operations under
// test would otherwise block for 30 s (the fake server's own limit).
const promptly = 5 * time.Second

func ping() bsoncore.Document {
	return doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt32("ping", 1) })
}

func TestHandshakeRequest(t *testing.T) {
	got := make(chan request, 1)
	srv := newFakeServer(t, func(c *fakeConn) {
		req, ok := c.read()
		if !ok {
			return
		}
		got <- req
		c.reply(req, helloReply(func(b *bsoncore.DocumentBuilder) {
			b.AppendObjectID("serviceId", bson.NewObjectID())
		}), nil)
		blackhole(c)
	})
	long := strings.Repeat("é", 100) // 200 bytes: must be cut to 128 on a rune boundary
	d := NewDialer(Options{AppName: long, Compressors: []string{"zstd", "lz4", "snappy", "zstd"}, LoadBalanced: true, Logger: quiet})
	c, err := d.Dial(testCtx(t), srv.addr(), 7)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := <-got
	if req.compressed {
		t.Error("hello was compressed")
	}
	body := req.body
	checks := []struct {
		path []string
		want any
	}{
		{[]string{"hello"}, int32(1)},
		{[]string{"helloOk"}, true},
		{[]string{"$db"}, "admin"},
		{[]string{"loadBalanced"}, true},
		{[]string{"client", "application", "name"}, strings.Repeat("é", 64)},
		{[]string{"client", "driver", "name"}, "mongobouncer"},
		{[]string{"client", "driver", "version"}, Version},
		{[]string{"client", "os", "type"}, runtime.GOOS},
		{[]string{"client", "os", "architecture"}, runtime.GOARCH},
		{[]string{"client", "platform"}, runtime.Version()},
	}
	for _, ck := range checks {
		v, err := body.LookupErr(ck.path...)
		if err != nil {
			t.Errorf("%v missing in %s", ck.path, body)
			continue
		}
		var have any
		switch v.Type {
		case bsoncore.TypeInt32:
			have = v.Int32()
		case bsoncore.TypeBoolean:
			have = v.Boolean()
		case bsoncore.TypeString:
			have = v.StringValue()
		}
		if have != ck.want {
			t.Errorf("%v = %v, want %v", ck.path, have, ck.want)
		}
	}
	comp, _ := stringArray(body.Lookup("compression"))
	if strings.Join(comp, ",") != "zstd,snappy" {
		t.Errorf("compression offered %v, want [zstd snappy] (unknown and duplicate names dropped)", comp)
	}
	if c.ID() != 7 || c.Address() != srv.addr() {
		t.Errorf("ID/Address %d %q", c.ID(), c.Address())
	}
	if c.Hello().ConnectionID != 42 || c.Hello().MaxWireVersion != 25 {
		t.Errorf("hello recorded %+v", c.Hello())
	}
}

func TestCompressionNegotiated(t *testing.T) {
	for _, name := range []string{"snappy", "zlib", "zstd"} {
		t.Run(name, func(t *testing.T) {
			want, _ := wire.CompressorByName(name)
			seen := make(chan request, 4)
			srv := newFakeServer(t, func(c *fakeConn) {
				req, ok := c.read()
				if !ok || !c.reply(req, helloReply(func(b *bsoncore.DocumentBuilder) {
					b.AppendArray("compression", bsoncore.NewArrayBuilder().AppendString(name).Build())
				}), nil) {
					return
				}
				for {
					req, ok := c.read()
					if !ok {
						return
					}
					seen <- req
					// Pad the reply so compression has something to do.
					reply := doc(func(b *bsoncore.DocumentBuilder) {
						b.AppendString("pad", strings.Repeat("x", 4000)).AppendDouble("ok", 1)
					})
					if !c.reply(req, reply, &want) {
						return
					}
				}
			})
			// Detach leaves compressed connections in the netpoller: the
			// event loop never uses them.
			c := dialDev(t, Options{Compressors: []string{"zstd", "snappy", "zlib"}, Detach: true}, srv.addr())
			if id, ok := c.Compressor(); !ok || id != want {
				t.Fatalf("Compressor() = %v, %v; want %v", id, ok, want)
			}
			if _, ok := c.NetConn().(*net.TCPConn); !ok {
				t.Fatalf("NetConn is %T, want the dialled *net.TCPConn", c.NetConn())
			}
			reply, err := c.RoundTrip(testCtx(t), "admin", ping())
			if err != nil {
				t.Fatal(err)
			}
			if len(reply.Lookup("pad").StringValue()) != 4000 {
				t.Fatalf("compressed reply decoded wrong: %d bytes", len(reply))
			}
			if r := <-seen; !r.compressed || r.compressor != want {
				t.Errorf("ping sent compressed=%v with %v, want %v", r.compressed, r.compressor, want)
			}
			// Authentication commands are never compressed.
			if _, err := c.RoundTrip(testCtx(t), "admin", doc(func(b *bsoncore.DocumentBuilder) {
				b.AppendInt32("saslStart", 1).AppendString("mechanism", "SCRAM-SHA-256")
			})); err != nil {
				t.Fatal(err)
			}
			if r := <-seen; r.compressed {
				t.Error("saslStart was compressed")
			}
		})
	}
}

func TestCompressorChoice(t *testing.T) {
	cases := []struct {
		offer, server []string
		want          string // "" = none
	}{
		{[]string{"zstd", "snappy"}, []string{"snappy", "zstd"}, "zstd"}, // our first the server accepts, not its first
		{[]string{"zlib", "zstd", "snappy"}, []string{"snappy", "zstd"}, "zstd"},
		{[]string{"zstd"}, []string{"zlib"}, ""},            // not offered
		{[]string{"zstd"}, []string{"lz4", "zstd"}, "zstd"}, // unknown entries skipped
		{nil, []string{"zstd"}, ""},
	}
	for _, tc := range cases {
		srv := newFakeServer(t, serveHello(helloReply(func(b *bsoncore.DocumentBuilder) {
			arr := bsoncore.NewArrayBuilder()
			for _, s := range tc.server {
				arr.AppendString(s)
			}
			b.AppendArray("compression", arr.Build())
		})))
		c := dialDev(t, Options{Compressors: tc.offer}, srv.addr())
		id, ok := c.Compressor()
		got := ""
		if ok {
			got = id.String()
		}
		if got != tc.want {
			t.Errorf("offer %v, server %v: picked %q, want %q", tc.offer, tc.server, got, tc.want)
		}
	}
}

func TestHelloRejected(t *testing.T) {
	oid := bson.NewObjectID()
	cases := []struct {
		name  string
		reply bsoncore.Document
		lb    bool
		check func(t *testing.T, err error)
	}{
		{"shutdown", doc(func(b *bsoncore.DocumentBuilder) {
			b.AppendDouble("ok", 0).AppendString("errmsg", "going away").AppendInt32("code", 91).
				AppendString("codeName", "ShutdownInProgress").
				AppendArray("errorLabels", bsoncore.NewArrayBuilder().AppendString("ResetPool").Build())
		}), false, func(t *testing.T, err error) {
			var ce *CommandError
			if !errors.As(err, &ce) || ce.Code != 91 || ce.CodeName != "ShutdownInProgress" || ce.Message != "going away" || !ce.HasLabel("ResetPool") {
				t.Fatalf("%v: want CommandError 91", err)
			}
			if IsNetworkError(err) {
				t.Fatal("a command error classified as a network error")
			}
		}},
		{"old server", helloReply(nil)[:0], false, nil}, // replaced below
		{"lb without serviceId", helloReply(nil), true, func(t *testing.T, err error) {
			if !errors.Is(err, ErrNoServiceID) {
				t.Fatalf("%v: want ErrNoServiceID", err)
			}
		}},
		{"bad field type", doc(func(b *bsoncore.DocumentBuilder) {
			b.AppendString("maxWireVersion", "25").AppendDouble("ok", 1)
		}), false, func(t *testing.T, err error) {
			if !errors.Is(err, ErrBadReply) || !IsNetworkError(err) {
				t.Fatalf("%v: want ErrBadReply network error", err)
			}
		}},
	}
	cases[1].reply = doc(func(b *bsoncore.DocumentBuilder) {
		b.AppendBoolean("ismaster", true).AppendInt32("maxWireVersion", 5).AppendDouble("ok", 1)
	})
	cases[1].check = func(t *testing.T, err error) {
		if !errors.Is(err, ErrWireVersion) {
			t.Fatalf("%v: want ErrWireVersion", err)
		}
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := newFakeServer(t, serveHello(tc.reply))
			up, err := NewDialer(Options{LoadBalanced: tc.lb, Logger: quiet}).Connect(testCtx(t), srv.addr(), 1)
			if err == nil || up != nil {
				t.Fatalf("Connect = %v, %v; want an error and a nil Upstream", up, err)
			}
			var ce *ConnectError
			if !errors.As(err, &ce) || ce.Stage != "hello" || ce.Addr != srv.addr() {
				t.Fatalf("%v: want ConnectError at hello", err)
			}
			tc.check(t, err)
		})
	}

	t.Run("lb with serviceId", func(t *testing.T) {
		srv := newFakeServer(t, serveHello(helloReply(func(b *bsoncore.DocumentBuilder) { b.AppendObjectID("serviceId", oid) })))
		up, err := NewDialer(Options{LoadBalanced: true, Logger: quiet}).Connect(testCtx(t), srv.addr(), 1)
		if err != nil {
			t.Fatal(err)
		}
		defer up.Close()
		sid, ok := up.(pool.ServiceIDer)
		if !ok {
			t.Fatal("Upstream does not implement pool.ServiceIDer")
		}
		if got, ok := sid.ServiceID(); !ok || got != oid {
			t.Fatalf("ServiceID() = %v, %v; want %v", got, ok, oid)
		}
	})
}

func TestOversizedReplies(t *testing.T) {
	big := doc(func(b *bsoncore.DocumentBuilder) {
		b.AppendString("pad", strings.Repeat("x", 3000)).AppendDouble("ok", 1)
	})

	t.Run("before hello", func(t *testing.T) {
		srv := newFakeServer(t, serveHello(helloReply(func(b *bsoncore.DocumentBuilder) {
			b.AppendString("pad", strings.Repeat("x", 3000))
		})))
		_, err := NewDialer(Options{MaxMessageSize: 1024, Logger: quiet}).Dial(testCtx(t), srv.addr(), 1)
		if !errors.Is(err, wire.ErrMessageTooLarge) || !IsNetworkError(err) {
			t.Fatalf("%v: want ErrMessageTooLarge network error", err)
		}
	})

	// After hello, the server's own maxMessageSizeBytes bounds replies.
	small := helloReply(nil)
	small = replaceInt32(t, small, "maxMessageSizeBytes", 2048)
	serve := func(reply func(c *fakeConn, req request) bool) func(*fakeConn) {
		return func(c *fakeConn) {
			req, ok := c.read()
			if !ok || !c.reply(req, small, nil) {
				return
			}
			if req, ok = c.read(); ok && reply(c, req) {
				blackhole(c)
			}
		}
	}
	t.Run("after hello", func(t *testing.T) {
		srv := newFakeServer(t, serve(func(c *fakeConn, req request) bool { return c.reply(req, big, nil) }))
		c := dialDev(t, Options{MaxMessageSize: 1 << 20}, srv.addr())
		if c.MaxMessageSize() != 2048 {
			t.Fatalf("MaxMessageSize() = %d, want the server's 2048", c.MaxMessageSize())
		}
		_, err := c.RoundTrip(testCtx(t), "admin", ping())
		if !errors.Is(err, wire.ErrMessageTooLarge) || !IsNetworkError(err) {
			t.Fatalf("%v: want ErrMessageTooLarge network error", err)
		}
	})
	t.Run("decompression bomb", func(t *testing.T) {
		srv := newFakeServer(t, func(c *fakeConn) {
			req, ok := c.read()
			if !ok || !c.reply(req, helloReply(func(b *bsoncore.DocumentBuilder) {
				b.AppendArray("compression", bsoncore.NewArrayBuilder().AppendString("zlib").Build())
			}), nil) {
				return
			}
			if req, ok = c.read(); !ok {
				return
			}
			msg := wire.AppendMsg(nil, 99, req.header.RequestID, 0, okReply)
			z, err := wire.Compress(nil, msg, wire.CompressorZlib)
			if err != nil {
				t.Error(err)
				return
			}
			binary.LittleEndian.PutUint32(z[20:], 1<<30) // uncompressedSize: 1 GiB
			if c.write(z) {
				blackhole(c)
			}
		})
		c := dialDev(t, Options{Compressors: []string{"zlib"}}, srv.addr())
		_, err := c.RoundTrip(testCtx(t), "admin", ping())
		if !errors.Is(err, wire.ErrMessageTooLarge) || !IsNetworkError(err) {
			t.Fatalf("%v: want ErrMessageTooLarge network error", err)
		}
	})
}

func replaceInt32(t *testing.T, d bsoncore.Document, key string, v int32) bsoncore.Document {
	t.Helper()
	elems, err := d.Elements()
	if err != nil {
		t.Fatal(err)
	}
	idx, out := bsoncore.AppendDocumentStart(nil)
	for _, e := range elems {
		if e.Key() == key {
			out = bsoncore.AppendInt32Element(out, key, v)
		} else {
			out = append(out, e...)
		}
	}
	out, err = bsoncore.AppendDocumentEnd(out, idx)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestBadReplies(t *testing.T) {
	cases := map[string]func(c *fakeConn, req request) []byte{
		"wrong responseTo": func(c *fakeConn, req request) []byte {
			return wire.AppendMsg(nil, 1, req.header.RequestID+1, 0, okReply)
		},
		"unrequested moreToCome": func(c *fakeConn, req request) []byte {
			return wire.AppendMsg(nil, 1, req.header.RequestID, wire.FlagMoreToCome, okReply)
		},
		"OP_REPLY": func(c *fakeConn, req request) []byte {
			return wire.AppendReply(nil, 1, req.header.RequestID, okReply)
		},
	}
	for name, bad := range cases {
		t.Run(name, func(t *testing.T) {
			srv := newFakeServer(t, func(c *fakeConn) {
				req, ok := c.read()
				if !ok || !c.reply(req, helloReply(nil), nil) {
					return
				}
				if req, ok = c.read(); ok && c.write(bad(c, req)) {
					blackhole(c)
				}
			})
			c := dialDev(t, Options{}, srv.addr())
			_, err := c.RoundTrip(testCtx(t), "admin", ping())
			if !errors.Is(err, ErrBadReply) || !IsNetworkError(err) {
				t.Fatalf("%v: want ErrBadReply network error", err)
			}
		})
	}
}

func TestConnectInterrupted(t *testing.T) {
	hole := newFakeServer(t, blackhole)

	t.Run("cancel during hello", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		err := connectWithin(t, NewDialer(Options{Logger: quiet}), ctx, hole.addr())
		var ce *ConnectError
		if !errors.Is(err, context.Canceled) || !errors.As(err, &ce) || ce.Stage != "hello" {
			t.Fatalf("%v: want a ConnectError at hello wrapping context.Canceled", err)
		}
	})
	t.Run("connect timeout", func(t *testing.T) {
		err := connectWithin(t, NewDialer(Options{ConnectTimeout: 100 * time.Millisecond, Logger: quiet}), context.Background(), hole.addr())
		if !errors.Is(err, context.DeadlineExceeded) || !IsNetworkError(err) {
			t.Fatalf("%v: want DeadlineExceeded", err)
		}
	})
	t.Run("cancel during dial", func(t *testing.T) {
		// An unroutable address would depend on the network; a Dial that
		// hangs until cancelled stands for it.
		dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		}
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		err := connectWithin(t, NewDialer(Options{Dial: dial, Logger: quiet}), ctx, "192.0.2.1:27017")
		var ce *ConnectError
		if !errors.Is(err, context.Canceled) || !errors.As(err, &ce) || ce.Stage != "dial" {
			t.Fatalf("%v: want a ConnectError at dial wrapping context.Canceled", err)
		}
	})
	t.Run("refused", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		err = connectWithin(t, NewDialer(Options{Logger: quiet}), context.Background(), addr)
		if !IsNetworkError(err) || errors.Is(err, context.Canceled) {
			t.Fatalf("%v: want a plain network error", err)
		}
	})
}

// connectWithin connects, expecting a failure well before the fake server's
// own 30 s limit.
func connectWithin(t *testing.T, d *Dialer, ctx context.Context, addr string) error {
	t.Helper()
	start := time.Now()
	up, err := d.Connect(ctx, addr, 1)
	if err == nil {
		up.Close()
		t.Fatal("connected")
	}
	if el := time.Since(start); el > promptly {
		t.Fatalf("took %v to fail", el)
	}
	return err
}

// Interrupting a round trip works the same on connections detached from
// Go's netpoller (Options.Detach, Linux) as on ordinary ones.
func TestRoundTripInterrupted(t *testing.T) {
	for _, detach := range []bool{false, true} {
		t.Run(fmt.Sprintf("detach=%v", detach), func(t *testing.T) { testRoundTripInterrupted(t, Options{Detach: detach}) })
	}
}

func testRoundTripInterrupted(t *testing.T, o Options) {
	srv := newFakeServer(t, func(c *fakeConn) {
		req, ok := c.read()
		if ok && c.reply(req, helloReply(nil), nil) {
			blackhole(c)
		}
	})
	t.Run("cancel", func(t *testing.T) {
		c := dialDev(t, o, srv.addr())
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(50*time.Millisecond, cancel)
		start := time.Now()
		_, err := c.RoundTrip(ctx, "admin", ping())
		if !errors.Is(err, context.Canceled) || !IsNetworkError(err) || time.Since(start) > promptly {
			t.Fatalf("%v after %v: want a prompt Canceled network error", err, time.Since(start))
		}
		// Cancellation closed the connection.
		if _, err := c.RoundTrip(testCtx(t), "admin", ping()); !errors.Is(err, ErrClosed) {
			t.Fatalf("RoundTrip after cancel: %v, want ErrClosed", err)
		}
	})
	t.Run("deadline", func(t *testing.T) {
		c := dialDev(t, o, srv.addr())
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		_, err := c.RoundTrip(ctx, "admin", ping())
		var ne *NetworkError
		if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &ne) {
			t.Fatalf("%v: want DeadlineExceeded network error", err)
		}
	})
	t.Run("close during read", func(t *testing.T) {
		c := dialDev(t, o, srv.addr())
		errc := make(chan error, 1)
		go func() {
			_, err := c.ReadMessage(nil)
			errc <- err
		}()
		time.Sleep(20 * time.Millisecond)
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if err := c.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		select {
		case err := <-errc:
			if !errors.Is(err, ErrClosed) || !IsNetworkError(err) {
				t.Fatalf("read after Close: %v", err)
			}
		case <-time.After(promptly):
			t.Fatal("Close did not interrupt ReadMessage")
		}
	})
}

type fakeAuth struct {
	err   error
	calls int
	reply bsoncore.Document
}

func (a *fakeAuth) Authenticate(ctx context.Context, c *Conn, h *Hello) error {
	a.calls++
	if h == nil || h != c.Hello() {
		return errors.New("hello not passed")
	}
	r, err := c.RoundTrip(ctx, "admin", doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt32("saslStart", 1) }))
	if err != nil {
		return err
	}
	a.reply = r
	return a.err
}

func TestAuthenticator(t *testing.T) {
	srv := newFakeServer(t, serveHello(helloReply(nil)))
	a := &fakeAuth{}
	c := dialDev(t, Options{Authenticator: a}, srv.addr())
	if a.calls != 1 || a.reply == nil {
		t.Fatalf("authenticator calls %d, reply %v", a.calls, a.reply)
	}
	if _, err := c.RoundTrip(testCtx(t), "admin", ping()); err != nil {
		t.Fatal(err)
	}

	bad := &fakeAuth{err: &CommandError{Code: 18, CodeName: "AuthenticationFailed"}}
	_, err := NewDialer(Options{Authenticator: bad, Logger: quiet}).Dial(testCtx(t), srv.addr(), 2)
	var ce *ConnectError
	var cmd *CommandError
	if !errors.As(err, &ce) || ce.Stage != "auth" || !errors.As(err, &cmd) || cmd.Code != 18 {
		t.Fatalf("%v: want ConnectError at auth wrapping code 18", err)
	}
}

func TestTLS(t *testing.T) {
	cert, pool := selfSigned(t)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	srv := startFake(t, ln, serveHello(helloReply(nil)))
	// Detach leaves TLS connections as they are: crypto/tls reads them.
	c := dialDev(t, Options{TLSConfig: &tls.Config{RootCAs: pool}, Detach: true}, srv.addr())
	if _, ok := c.NetConn().(*tls.Conn); !ok {
		t.Fatalf("NetConn is %T, want *tls.Conn", c.NetConn())
	}
	if _, err := c.RoundTrip(testCtx(t), "admin", ping()); err != nil {
		t.Fatal(err)
	}
	// An untrusted certificate fails at the tls stage.
	_, err = NewDialer(Options{TLSConfig: &tls.Config{}, Logger: quiet}).Dial(testCtx(t), srv.addr(), 2)
	var ce *ConnectError
	if !errors.As(err, &ce) || ce.Stage != "tls" {
		t.Fatalf("%v: want ConnectError at tls", err)
	}
}

func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "upstream test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:         true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool
}

func TestParseAddress(t *testing.T) {
	cases := []struct{ in, network, addr string }{
		{"localhost:27017", "tcp", "localhost:27017"},
		{"db.example.com", "tcp", "db.example.com:27017"},
		{"127.0.0.1:1234", "tcp", "127.0.0.1:1234"},
		{"[::1]:27018", "tcp", "[::1]:27018"},
		{"[::1]", "tcp", "[::1]:27017"},
		{"::1", "tcp", "[::1]:27017"},
		{"/tmp/mongodb-27017.sock", "unix", "/tmp/mongodb-27017.sock"},
		{"%2Ftmp%2Fmongodb-27017.sock", "unix", "/tmp/mongodb-27017.sock"},
		{"%2ftmp%2fmongo.sock", "unix", "/tmp/mongo.sock"},
		{"relative/mongo.sock", "unix", "relative/mongo.sock"},
	}
	for _, tc := range cases {
		n, a := ParseAddress(tc.in)
		if n != tc.network || a != tc.addr {
			t.Errorf("ParseAddress(%q) = %q, %q; want %q, %q", tc.in, n, a, tc.network, tc.addr)
		}
	}
}

func TestCommandErrorParsing(t *testing.T) {
	oks := []bsoncore.Document{
		doc(func(b *bsoncore.DocumentBuilder) { b.AppendDouble("ok", 1) }),
		doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt32("ok", 1) }),
		doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt64("ok", 1) }),
		doc(func(b *bsoncore.DocumentBuilder) { b.AppendBoolean("ok", true) }),
	}
	for _, d := range oks {
		if err := commandError(d); err != nil {
			t.Errorf("%s: %v", d, err)
		}
	}
	fails := []bsoncore.Document{
		doc(func(b *bsoncore.DocumentBuilder) { b.AppendDouble("ok", 0) }),
		doc(func(b *bsoncore.DocumentBuilder) { b.AppendBoolean("ok", false) }),
		doc(func(b *bsoncore.DocumentBuilder) { b.AppendString("ok", "1") }),
		doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt32("n", 1) }),
	}
	for _, d := range fails {
		if commandError(d) == nil {
			t.Errorf("%s: not an error", d)
		}
	}
	err := commandError(doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt32("n", 1) }))
	if !strings.Contains(err.Error(), "no ok field") {
		t.Errorf("missing ok: %v", err)
	}
}

func TestParseHello(t *testing.T) {
	pid := bson.NewObjectID()
	raw := doc(func(b *bsoncore.DocumentBuilder) {
		b.AppendBoolean("ismaster", true).
			AppendInt64("maxWireVersion", 17).
			AppendDouble("maxBsonObjectSize", 16777216).
			AppendNull("logicalSessionTimeoutMinutes").
			AppendString("setName", "rs0").
			AppendArray("hosts", bsoncore.NewArrayBuilder().AppendString("a:1").AppendString("b:2").Build()).
			AppendDocument("topologyVersion", doc(func(b *bsoncore.DocumentBuilder) {
				b.AppendObjectID("processId", pid).AppendInt64("counter", 3)
			})).
			AppendDouble("ok", 1)
	})
	h, err := ParseHello(raw)
	if err != nil {
		t.Fatal(err)
	}
	if !h.IsWritablePrimary || h.MaxWireVersion != 17 || h.MaxBSONObjectSize != 16777216 ||
		h.LogicalSessionTimeoutMinutes != nil || h.SetName != "rs0" || strings.Join(h.Hosts, ",") != "a:1,b:2" ||
		h.TopologyVersion == nil || h.TopologyVersion.ProcessID != pid || h.TopologyVersion.Counter != 3 {
		t.Fatalf("parsed %+v", h)
	}
	for _, bad := range []bsoncore.Document{
		doc(func(b *bsoncore.DocumentBuilder) { b.AppendDouble("maxWireVersion", 1.5) }),
		doc(func(b *bsoncore.DocumentBuilder) { b.AppendInt64("maxMessageSizeBytes", 1<<40) }),
		doc(func(b *bsoncore.DocumentBuilder) { b.AppendString("hosts", "a:1") }),
		doc(func(b *bsoncore.DocumentBuilder) { b.AppendString("serviceId", "x") }),
	} {
		if _, err := ParseHello(bad); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}

func TestWithDB(t *testing.T) {
	got, err := withDB(ping(), "admin")
	if err != nil || got.Lookup("$db").StringValue() != "admin" || got.Lookup("ping").Int32() != 1 {
		t.Fatalf("%s, %v", got, err)
	}
	if err := got.Validate(); err != nil {
		t.Fatal(err)
	}
	again, err := withDB(got, "other")
	if err != nil || again.Lookup("$db").StringValue() != "admin" {
		t.Fatalf("existing $db replaced: %s, %v", again, err)
	}
	if _, err := withDB(bsoncore.Document{1, 2, 3}, "x"); err == nil {
		t.Fatal("invalid document accepted")
	}
}

func TestNetworkErrorTimeout(t *testing.T) {
	ne := &NetworkError{Addr: "x", Op: "read", Err: os.ErrDeadlineExceeded}
	if !ne.Timeout() {
		t.Fatal("deadline not a timeout")
	}
	if (&NetworkError{Addr: "x", Op: "read", Err: ErrClosed}).Timeout() {
		t.Fatal("closed is a timeout")
	}
}
