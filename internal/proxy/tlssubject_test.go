package proxy

import (
	"crypto/x509/pkix"
	"encoding/asn1"
	"testing"
)

func rawName(t testing.TB, seq pkix.RDNSequence) []byte {
	t.Helper()
	b, err := asn1.Marshal(seq)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func atv(oid asn1.ObjectIdentifier, v any) pkix.AttributeTypeAndValue {
	return pkix.AttributeTypeAndValue{Type: oid, Value: v}
}

var (
	oidC     = asn1.ObjectIdentifier{2, 5, 4, 6}
	oidO     = asn1.ObjectIdentifier{2, 5, 4, 10}
	oidOU    = asn1.ObjectIdentifier{2, 5, 4, 11}
	oidCN    = asn1.ObjectIdentifier{2, 5, 4, 3}
	oidDC    = asn1.ObjectIdentifier{0, 9, 2342, 19200300, 100, 1, 25}
	oidEmail = asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 9, 1}
	oidOdd   = asn1.ObjectIdentifier{1, 2, 3, 4}
)

func TestX509Subject(t *testing.T) {
	cases := []struct {
		name string
		seq  pkix.RDNSequence
		want string
	}{
		{"reverse order", pkix.RDNSequence{{atv(oidC, "US")}, {atv(oidO, "MongoDB")}, {atv(oidOU, "Drivers")}, {atv(oidCN, "client")}},
			"CN=client,OU=Drivers,O=MongoDB,C=US"},
		{"multi-valued RDN", pkix.RDNSequence{{atv(oidO, "Org")}, {atv(oidCN, "a"), atv(oidOU, "b")}},
			"CN=a+OU=b,O=Org"},
		{"short names OpenSSL uses", pkix.RDNSequence{{atv(oidDC, "com")}, {atv(oidDC, "example")}, {atv(oidEmail, "x@example.com")}},
			"emailAddress=x@example.com,DC=example,DC=com"},
		{"escapes", pkix.RDNSequence{{atv(oidCN, `#a,b+c"d\e<f>g;h `)}, {atv(oidOU, " lead")}},
			`OU=\ lead,CN=\#a\,b\+c\"d\\e\<f\>g\;h\ `},
		{"control characters", pkix.RDNSequence{{atv(oidCN, "a\nb")}}, `CN=a\0Ab`},
		{"unknown attribute as DER", pkix.RDNSequence{{atv(oidOdd, "v")}}, "1.2.3.4=#130176"},
		{"non-string value as DER", pkix.RDNSequence{{atv(oidCN, 5)}}, "CN=#020105"},
	}
	for _, c := range cases {
		got, ok := x509Subject(rawName(t, c.seq))
		if !ok || got != c.want {
			t.Errorf("%s: %q %v, want %q", c.name, got, ok, c.want)
		}
	}
	for _, bad := range [][]byte{nil, {0x30}, {0x30, 0x00, 0x00}, {0x02, 0x01, 0x05}} {
		if s, ok := x509Subject(bad); ok {
			t.Errorf("% x: parsed as %q", bad, s)
		}
	}
}

func FuzzX509Subject(f *testing.F) {
	f.Add(rawName(f, pkix.RDNSequence{{atv(oidC, "US")}, {atv(oidCN, "client")}}))
	f.Add(rawName(f, pkix.RDNSequence{{atv(oidCN, "a"), atv(oidOU, "b")}, {atv(oidOdd, 7)}}))
	f.Add(rawName(f, pkix.RDNSequence{{atv(oidCN, " #,+\"\\<>;\x00 ")}}))
	f.Add([]byte{0x30, 0x80})
	f.Fuzz(func(t *testing.T, raw []byte) {
		s, ok := x509Subject(raw)
		if !ok && s != "" {
			t.Fatalf("failed with output %q", s)
		}
		if len(s) > maxSubjectLen+1024 {
			t.Fatalf("%d bytes", len(s))
		}
	})
}
