package app

import (
	"net"
	"testing"

	"github.com/mongobouncer/mongobouncer/internal/config"
)

// A mongodb+srv:// route takes authSource from its TXT record unless the
// string names one (whatever its spelling), and X.509 keeps $external.
func TestSRVAuthSourceFromTXT(t *testing.T) {
	r := fakeResolver{
		srv: []*net.SRV{{Target: "a.cluster.example.net.", Port: 27017}},
		txt: []string{"authSource=fromtxt"},
	}
	for _, c := range []struct{ uri, want string }{
		{"mongodb+srv://u:p@cluster.example.net/", "fromtxt"},
		{"mongodb+srv://u:p@cluster.example.net/orders", "fromtxt"},
		{"mongodb+srv://u:p@cluster.example.net/?authSource=mine", "mine"},
		{"mongodb+srv://u:p@cluster.example.net/?AUTHSOURCE=mine", "mine"},
		{"mongodb+srv://cluster.example.net/?authMechanism=MONGODB-X509", "$external"},
	} {
		cs, err := config.ParseConnString(c.uri)
		if err != nil {
			t.Fatal(err)
		}
		got, _, err := resolveSRV(cs, r)
		if err != nil {
			t.Fatal(err)
		}
		cred, err := upstreamCredential(got)
		if err != nil || cred == nil || cred.Source != c.want {
			t.Errorf("%s: credential %v, %v; want source %q", c.uri, cred, err, c.want)
		}
	}
}
