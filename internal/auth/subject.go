package auth

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
	"encoding/binary"
	"encoding/hex"
	"strings"
	"unicode/utf8"
)

// attributeNames are OpenSSL's short names (OBJ_nid2sn, OpenSSL 3.0) of
// the attributes a distinguished name may hold: every X.520 attribute
// (2.5.4.x) it knows, and the others found in certificate subjects. Only
// attributes named here are printed as a string; OpenSSL and mongod print
// these by name too (business and EV certificates carry businessCategory
// and jurisdictionC, for instance), so a missing one would give a user
// name neither of them gives.
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
	"2.5.4.13":                   "description",
	"2.5.4.14":                   "searchGuide",
	"2.5.4.15":                   "businessCategory",
	"2.5.4.16":                   "postalAddress",
	"2.5.4.17":                   "postalCode",
	"2.5.4.18":                   "postOfficeBox",
	"2.5.4.19":                   "physicalDeliveryOfficeName",
	"2.5.4.20":                   "telephoneNumber",
	"2.5.4.21":                   "telexNumber",
	"2.5.4.22":                   "teletexTerminalIdentifier",
	"2.5.4.23":                   "facsimileTelephoneNumber",
	"2.5.4.24":                   "x121Address",
	"2.5.4.25":                   "internationaliSDNNumber",
	"2.5.4.26":                   "registeredAddress",
	"2.5.4.27":                   "destinationIndicator",
	"2.5.4.28":                   "preferredDeliveryMethod",
	"2.5.4.29":                   "presentationAddress",
	"2.5.4.30":                   "supportedApplicationContext",
	"2.5.4.31":                   "member",
	"2.5.4.32":                   "owner",
	"2.5.4.33":                   "roleOccupant",
	"2.5.4.34":                   "seeAlso",
	"2.5.4.35":                   "userPassword",
	"2.5.4.36":                   "userCertificate",
	"2.5.4.37":                   "cACertificate",
	"2.5.4.38":                   "authorityRevocationList",
	"2.5.4.39":                   "certificateRevocationList",
	"2.5.4.40":                   "crossCertificatePair",
	"2.5.4.41":                   "name",
	"2.5.4.42":                   "GN",
	"2.5.4.43":                   "initials",
	"2.5.4.44":                   "generationQualifier",
	"2.5.4.45":                   "x500UniqueIdentifier",
	"2.5.4.46":                   "dnQualifier",
	"2.5.4.47":                   "enhancedSearchGuide",
	"2.5.4.48":                   "protocolInformation",
	"2.5.4.49":                   "distinguishedName",
	"2.5.4.50":                   "uniqueMember",
	"2.5.4.51":                   "houseIdentifier",
	"2.5.4.52":                   "supportedAlgorithms",
	"2.5.4.53":                   "deltaRevocationList",
	"2.5.4.54":                   "dmdName",
	"2.5.4.65":                   "pseudonym",
	"2.5.4.72":                   "role",
	"2.5.4.97":                   "organizationIdentifier",
	"2.5.4.98":                   "c3",
	"2.5.4.99":                   "n3",
	"2.5.4.100":                  "dnsName",
	"0.9.2342.19200300.100.1.1":  "UID",
	"0.9.2342.19200300.100.1.3":  "mail",
	"0.9.2342.19200300.100.1.25": "DC",
	"1.2.840.113549.1.9.1":       "emailAddress",
	"1.2.840.113549.1.9.2":       "unstructuredName",
	"1.2.840.113549.1.9.8":       "unstructuredAddress",
	"1.3.6.1.4.1.311.60.2.1.1":   "jurisdictionL",
	"1.3.6.1.4.1.311.60.2.1.2":   "jurisdictionST",
	"1.3.6.1.4.1.311.60.2.1.3":   "jurisdictionC",
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

// X509Subject formats a certificate's RawSubject (DER) as RFC 2253, the
// user name MongoDB gives the certificate's holder; false when it does not
// parse.
func X509Subject(raw []byte) (string, bool) {
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
			if s, ok := dnString(a.Value); known && ok {
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

// tagUniversalString is ASN.1's UniversalString (UTF-32BE), which
// encoding/asn1 does not decode.
const tagUniversalString = 28

// dnString is an attribute's value as a string, when it is one of the
// string types: those encoding/asn1 decodes, and UniversalString, which
// OpenSSL prints as text too.
func dnString(v asn1.RawValue) (string, bool) {
	if v.Class == asn1.ClassUniversal && v.Tag == tagUniversalString && !v.IsCompound {
		if len(v.Bytes)%4 != 0 {
			return "", false
		}
		var b strings.Builder
		for i := 0; i < len(v.Bytes); i += 4 {
			r := rune(binary.BigEndian.Uint32(v.Bytes[i:]))
			if !utf8.ValidRune(r) {
				return "", false
			}
			b.WriteRune(r)
		}
		return b.String(), true
	}
	var s string
	if _, err := asn1.Unmarshal(v.FullBytes, &s); err != nil {
		return "", false
	}
	return s, true
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
