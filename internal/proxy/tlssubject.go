package proxy

// The subject of a client certificate as MongoDB names X.509 users: an RFC
// 2253 distinguished name, as OpenSSL prints it with XN_FLAG_RFC2253 (the
// attributes in reverse order, OpenSSL's short attribute names, bytes of
// multi-byte UTF-8 escaped as \XX, unknown attributes and values that are
// not strings as #hex of their DER). mongod names a certificate's user the
// same way: it walks OpenSSL's flat list of attributes backwards, so that
// the attributes of a multi-valued RDN come out in reverse too, and escapes
// every byte from 0x80 as \XX. crypto/x509's pkix.Name.String is close,
// but it rebuilds the name from parsed fields in a fixed order, drops
// multi-valued RDN grouping, and prints DC, UID and emailAddress as OIDs.

import (
	"encoding/asn1"
	"encoding/hex"
	"strings"
)

// attributeNames are OpenSSL's short names of the attributes of a
// distinguished name.
var attributeNames = map[string]string{
	"2.5.4.3":                    "CN",
	"2.5.4.4":                    "SN",
	"2.5.4.5":                    "serialNumber",
	"2.5.4.6":                    "C",
	"2.5.4.7":                    "L",
	"2.5.4.8":                    "ST",
	"2.5.4.9":                    "street",
	"2.5.4.10":                   "O",
	"2.5.4.11":                   "OU",
	"2.5.4.12":                   "title",
	"2.5.4.17":                   "postalCode",
	"2.5.4.42":                   "GN",
	"2.5.4.43":                   "initials",
	"2.5.4.44":                   "generationQualifier",
	"2.5.4.46":                   "dnQualifier",
	"2.5.4.65":                   "pseudonym",
	"0.9.2342.19200300.100.1.25": "DC",
	"0.9.2342.19200300.100.1.1":  "UID",
	"1.2.840.113549.1.9.1":       "emailAddress",
}

// dnAttribute is one attribute of a relative distinguished name, its value
// kept raw so that non-string values can be printed as their DER.
type dnAttribute struct {
	Type  asn1.ObjectIdentifier
	Value asn1.RawValue
}

// dnRDNSET is a relative distinguished name (a SET OF attributes; the
// name's SET suffix tells encoding/asn1 so).
type dnRDNSET []dnAttribute

// maxSubjectLen bounds the subject printed: certificates are bounded by
// the TLS record layer already, but a name is compared and logged.
const maxSubjectLen = 16 * 1024

// x509Subject formats a certificate's RawSubject (DER) as RFC 2253; false
// when it does not parse.
func x509Subject(raw []byte) (string, bool) {
	var seq []dnRDNSET
	rest, err := asn1.Unmarshal(raw, &seq)
	if err != nil || len(rest) > 0 {
		return "", false
	}
	var b strings.Builder
	for i := len(seq) - 1; i >= 0; i-- {
		if i != len(seq)-1 {
			b.WriteByte(',')
		}
		rdn := seq[i]
		for j := len(rdn) - 1; j >= 0; j-- {
			a := rdn[j]
			if j != len(rdn)-1 {
				b.WriteByte('+')
			}
			name, known := attributeNames[a.Type.String()]
			if !known {
				name = a.Type.String()
			}
			b.WriteString(name)
			b.WriteByte('=')
			var s string
			if _, err := asn1.Unmarshal(a.Value.FullBytes, &s); known && err == nil {
				escapeDNValue(&b, s)
			} else {
				b.WriteByte('#')
				b.WriteString(hex.EncodeToString(a.Value.FullBytes))
			}
			if b.Len() > maxSubjectLen {
				return "", false
			}
		}
	}
	return b.String(), true
}

// escapeDNValue writes s escaped as RFC 2253 section 2.4 asks: the special
// characters with a backslash, a leading # or space and a trailing space,
// and control characters as \XX; and, as OpenSSL (ASN1_STRFLGS_ESC_MSB)
// and mongod do, each byte from 0x80 as \XX, so "Jürgen" is J\C3\BCrgen.
func escapeDNValue(b *strings.Builder, s string) {
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case strings.IndexByte(`,+"\<>;`, ch) >= 0,
			i == 0 && (ch == '#' || ch == ' '),
			i == len(s)-1 && ch == ' ':
			b.WriteByte('\\')
			b.WriteByte(ch)
		case ch < 0x20 || ch >= 0x7f:
			b.WriteByte('\\')
			b.WriteString(strings.ToUpper(hex.EncodeToString([]byte{ch})))
		default:
			b.WriteByte(ch)
		}
	}
}
