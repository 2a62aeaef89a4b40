// A DNS server on loopback for the tests: it answers SRV and TXT queries
// from a table the test changes while it runs.

package srv

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// srvRec is one SRV record of the table.
type srvRec struct {
	target   string
	port     uint16
	priority uint16
	weight   uint16
}

// zone is the table the loopback server answers from. Names are absolute
// and lower-case ("_mongodb._tcp.cluster0.example.com."). A name in
// neither map gets NXDOMAIN; a name in one map only gets an empty answer
// for the other type.
type zone struct {
	mu       sync.Mutex
	srv      map[string][]srvRec
	txt      map[string][][]string // records, each a list of character strings
	servfail bool                  // answer every query with SERVFAIL
	silent   bool                  // answer nothing, so the client times out
	queries  int
}

func (z *zone) setSRV(name string, recs ...srvRec) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if recs == nil {
		delete(z.srv, name)
		return
	}
	z.srv[name] = recs
}

func (z *zone) setTXT(name string, recs ...[]string) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.txt[name] = recs
}

func (z *zone) setServfail(b bool) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.servfail = b
}

func (z *zone) setSilent(b bool) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.silent = b
}

func (z *zone) queryCount() int {
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.queries
}

func (z *zone) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.queries++
	if z.silent {
		return
	}
	m := new(dns.Msg)
	m.SetReply(req)
	m.RecursionAvailable = true // else Go calls an empty answer a lame referral
	if z.servfail || len(req.Question) != 1 {
		m.Rcode = dns.RcodeServerFailure
		_ = w.WriteMsg(m)
		return
	}
	q := req.Question[0]
	name := strings.ToLower(q.Name)
	srvs, hasSRV := z.srv[name]
	txts, hasTXT := z.txt[name]
	hdr := dns.RR_Header{Name: q.Name, Rrtype: q.Qtype, Class: dns.ClassINET, Ttl: 300}
	switch {
	case !hasSRV && !hasTXT:
		m.Rcode = dns.RcodeNameError
	case q.Qtype == dns.TypeSRV:
		for _, s := range srvs {
			m.Answer = append(m.Answer, &dns.SRV{Hdr: hdr, Priority: s.priority, Weight: s.weight, Port: s.port,
				Target: dns.Fqdn(s.target)})
		}
	case q.Qtype == dns.TypeTXT:
		for _, t := range txts {
			m.Answer = append(m.Answer, &dns.TXT{Hdr: hdr, Txt: t})
		}
	}
	_ = w.WriteMsg(m)
}

// startDNS serves an empty zone on a loopback UDP port until the test ends
// and returns it with a resolver that sends every query there.
func startDNS(t *testing.T) (*zone, *net.Resolver) {
	t.Helper()
	z := &zone{srv: map[string][]srvRec{}, txt: map[string][][]string{}}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	s := &dns.Server{PacketConn: pc, Handler: z, NotifyStartedFunc: func() { close(started) }}
	served := make(chan error, 1)
	go func() { served <- s.ActivateAndServe() }()
	select {
	case <-started:
	case err := <-served:
		t.Fatalf("DNS server: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("DNS server did not start in 5s")
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.ShutdownContext(ctx); err != nil {
			t.Errorf("DNS server shutdown: %v", err)
		}
		select {
		case <-served:
		case <-time.After(5 * time.Second):
			t.Error("DNS server goroutine did not end in 5s")
		}
	})
	addr := pc.LocalAddr().String()
	r := &net.Resolver{
		PreferGo: true,
		Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "udp", addr)
		},
	}
	return z, r
}

// testCtx bounds a test's DNS work.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}
