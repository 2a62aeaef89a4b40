package auth

// A certificate subject as an RFC 2253 name, as OpenSSL and MongoDB write it.

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
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
		// In reverse within the RDN too (DER sorts a SET: CN's OID first).
		{"multi-valued RDN", pkix.RDNSequence{{atv(oidO, "Org")}, {atv(oidCN, "a"), atv(oidOU, "b")}},
			"OU=b+CN=a,O=Org"},
		{"UTF-8 bytes escaped", pkix.RDNSequence{{atv(oidCN, "Jürgen")}}, `CN=J\C3\BCrgen`},
		{"short names OpenSSL uses", pkix.RDNSequence{{atv(oidDC, "com")}, {atv(oidDC, "example")}, {atv(oidEmail, "x@example.com")}},
			"emailAddress=x@example.com,DC=example,DC=com"},
		{"escapes", pkix.RDNSequence{{atv(oidCN, `#a,b+c"d\e<f>g;h `)}, {atv(oidOU, " lead")}},
			`OU=\ lead,CN=\#a\,b\+c\"d\\e\<f\>g\;h\ `},
		{"control characters", pkix.RDNSequence{{atv(oidCN, "a\nb")}}, `CN=a\0Ab`},
		{"unknown attribute as DER", pkix.RDNSequence{{atv(oidOdd, "v")}}, "1.2.3.4=#130176"},
		{"non-string value as DER", pkix.RDNSequence{{atv(oidCN, 5)}}, "CN=#020105"},
	}
	for _, c := range cases {
		got, ok := X509Subject(rawName(t, c.seq))
		if !ok || got != c.want {
			t.Errorf("%s: %q %v, want %q", c.name, got, ok, c.want)
		}
	}
	for _, bad := range [][]byte{nil, {0x30}, {0x30, 0x00, 0x00}, {0x02, 0x01, 0x05}} {
		if s, ok := X509Subject(bad); ok {
			t.Errorf("% x: parsed as %q", bad, s)
		}
	}
}

// X509Subject names subjects as OpenSSL does (openssl x509 -nameopt
// RFC2253), which is how MongoDB's documentation tells users to find an
// X.509 user's name, and how mongod names it.
func TestX509SubjectMatchesOpenSSL(t *testing.T) {
	openssl, err := exec.LookPath("openssl")
	if err != nil {
		msg := "openssl is not installed: run `make c-tools` as root"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	dir := t.TempDir()
	for i, seq := range []pkix.RDNSequence{
		{{atv(oidO, "Org")}, {atv(oidCN, "a"), atv(oidOU, "b")}},
		{{atv(oidC, "US")}, {atv(oidO, "Ex;ample"), atv(oidO, "Two")}, {atv(oidCN, `a,b+c "d" #`)}},
		{{atv(oidC, "DE")}, {atv(oidCN, "Jürgen ")}, {atv(oidOU, "\x7f\x01")}},
		{{atv(oidDC, "com")}, {atv(oidEmail, "x@example.com"), atv(oidCN, "z"), atv(oidOU, "zz")}},
		{{atv(oidOdd, "v")}, {atv(oidCN, "#lead"), atv(oidOU, " both ")}},
		// The string types OpenSSL decodes: BMPString (UTF-16),
		// UniversalString (UTF-32), T61String (Latin-1 to OpenSSL).
		{{atv(oidCN, asn1.RawValue{Tag: asn1.TagBMPString, Bytes: []byte{0, 'J', 0, 0xfc, 0, 'r'}})},
			{atv(oidO, asn1.RawValue{Tag: 28, Bytes: []byte{0, 0, 0, 'J', 0, 0, 0, 0xfc}})},
			{atv(oidOU, asn1.RawValue{Tag: asn1.TagT61String, Bytes: []byte("J\xfcr")})}},
		// Attributes of business and EV certificates.
		{{atv(oid(t, "1.3.6.1.4.1.311.60.2.1.3"), "DE")}, {atv(oid(t, "2.5.4.15"), "Private Organization")},
			{atv(oid(t, "2.5.4.97"), "VATDE-123")}, {atv(oid(t, "2.5.4.13"), "ops"), atv(oid(t, "0.9.2342.19200300.100.1.3"), "a@example.com")}},
	} {
		raw := rawName(t, seq)
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), RawSubject: raw,
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, fmt.Sprintf("%d.pem", i))
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(openssl, "x509", "-in", path, "-noout", "-subject", "-nameopt", "RFC2253").CombinedOutput()
		if err != nil {
			t.Fatalf("openssl: %v\n%s", err, out)
		}
		want := strings.TrimPrefix(strings.TrimSpace(string(out)), "subject=")
		if got, ok := X509Subject(raw); !ok || got != want {
			t.Errorf("%v: %q %v, openssl says %q", seq, got, ok, want)
		}
	}
}

// oid parses a dotted object identifier.
func oid(t *testing.T, s string) asn1.ObjectIdentifier {
	t.Helper()
	var o asn1.ObjectIdentifier
	for _, part := range strings.Split(s, ".") {
		n, err := strconv.Atoi(part)
		if err != nil {
			t.Fatal(err)
		}
		o = append(o, n)
	}
	return o
}

func FuzzX509Subject(f *testing.F) {
	f.Add(rawName(f, pkix.RDNSequence{{atv(oidC, "US")}, {atv(oidCN, "client")}}))
	f.Add(rawName(f, pkix.RDNSequence{{atv(oidCN, "a"), atv(oidOU, "b")}, {atv(oidOdd, 7)}}))
	f.Add(rawName(f, pkix.RDNSequence{{atv(oidCN, " #,+\"\\<>;\x00 ")}}))
	f.Add([]byte{0x30, 0x80})
	f.Add(rawName(f, pkix.RDNSequence{{atv(oidCN, asn1.RawValue{Tag: 28, Bytes: []byte{0, 0, 0xd8, 0, 0, 0, 0, 'a', 1}})}}))
	f.Fuzz(func(t *testing.T, raw []byte) {
		s, ok := X509Subject(raw)
		if !ok && s != "" {
			t.Fatalf("failed with output %q", s)
		}
		if len(s) > maxSubjectLen+1024 {
			t.Fatalf("%d bytes", len(s))
		}
	})
}
