package gate

// Telling a TLS client from a plain one by its first bytes (tls_mode =
// "allow" or "require"), before anything else is read from it.

import "io"

// tlsRecordHandshake is the first byte of a TLS handshake record.
const tlsRecordHandshake = 0x16

// SniffTLS reads a new client's first bytes from r into buf until they
// tell a TLS handshake record from a MongoDB message, and returns how many
// it read (all kept in buf: a plain client's first request, or the start
// of a TLS handshake to replay). The first byte alone does not tell: 0x16
// is also the low byte of a message length (a 278-byte hello starts with
// it). A TLS record continues with the version 3.1 to 3.4 (TLS 1.0 to 1.3
// spell the record version 0x0301 to 0x0303), which for a message would
// mean a first request of at least 66,326 bytes; a driver's first request
// is a hello of a few hundred. buf must hold at least 3 bytes.
func SniffTLS(r io.Reader, buf []byte) (n int, isTLS bool, err error) {
	for {
		if isTLS, decided := TLSRecordStart(buf[:n]); decided {
			return n, isTLS, nil
		}
		m, err := r.Read(buf[n:])
		n += m
		if _, decided := TLSRecordStart(buf[:n]); err != nil && !decided {
			return n, false, err
		}
	}
}

// TLSRecordStart tells from a connection's first bytes whether they start
// a TLS handshake record (see SniffTLS), and whether b is enough to tell.
func TLSRecordStart(b []byte) (isTLS, decided bool) {
	switch {
	case len(b) > 0 && b[0] != tlsRecordHandshake:
		return false, true
	case len(b) >= 3:
		return b[1] == 3 && b[2] >= 1 && b[2] <= 4, true
	}
	return false, false
}
