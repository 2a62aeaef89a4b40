package proxy

// The client's connection: its socket and its buffers, owned by whoever
// serves the client (its goroutine, or the loop thread holding the
// endpoint's Mu; the read window is the endpoint's, evloop.Window). What
// is done with the bytes (the session, the login, the exchange) is not
// here: only the socket's calls, and what the connection's hello agreed
// on; the replies written on it are reply.go's.

import (
	"crypto/tls"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/mongobouncer/mongobouncer/internal/auth"
	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// conn is the client's connection. Owner only: every field is read and
// written by whoever serves the client; the hand-over between its
// goroutine and the loop happens under the endpoint's Mu.
type conn struct {
	nc net.Conn // nil while the loop owns the client
	// remote is the client's address, listener the address it connected
	// to (set at accept).
	remote   string
	listener string
	deadline bool // a read deadline is set on nc
	hdr      [wire.HeaderLen]byte
	in       *buffer // the request being handled
	aux      *buffer // decompressed request
	out      *buffer // replies we build, and compressed copies
	// nextID is the requestID of our own replies.
	nextID int32
	// sent is where the bytes written to the client are counted: the
	// exchange's bytesOut (set by newClient).
	sent *int
	// legacy is set while a command that came as an OP_QUERY is served:
	// its replies go back as an OP_REPLY (command/legacy.go). Such a request is
	// always the goroutine's.
	legacy bool
	// comp has bit id set for each compressor a hello of the client agreed
	// on: the ones it may send OP_COMPRESSED with (checkCompressed).
	comp uint8
	// tlsConn is the client's TLS connection, nil for a plain client (set
	// by startTLS; such a client never enters the loop).
	tlsConn *tls.Conn
}

// closeConn closes the goroutine's connection; safe to repeat.
func (cn *conn) closeConn() {
	if cn.nc != nil {
		_ = cn.nc.Close()
	}
}

func (cn *conn) releaseBuffers() {
	putBuffer(cn.in)
	putBuffer(cn.aux)
	putBuffer(cn.out)
	cn.in, cn.aux, cn.out = nil, nil, nil
}

// setDeadline sets the read deadline d (zero clears it).
func (cn *conn) setDeadline(d time.Time) {
	if d.IsZero() {
		if cn.deadline {
			_ = cn.nc.SetReadDeadline(time.Time{})
			cn.deadline = false
		}
		return
	}
	_ = cn.nc.SetReadDeadline(d)
	cn.deadline = true
}

// checkCompressed decides, before anything is inflated, whether the
// client may send the OP_COMPRESSED message msg: its compressor must be
// one its hello agreed on (an unknown id is left to wire.Decompress,
// which refuses it by name). The declared size is Decompress's check,
// against readLimit.
func (cn *conn) checkCompressed(msg []byte) error {
	if len(msg) < wire.CompressedHeaderLen {
		return nil // Decompress reports the truncation
	}
	id := wire.CompressorID(msg[wire.HeaderLen+8])
	if id > wire.CompressorZstd || cn.comp&(1<<id) != 0 {
		return nil
	}
	agreed := cn.agreedText()
	return fmt.Errorf("OP_COMPRESSED with compressor %s, which this connection's hello did not agree on (agreed: %s): %w",
		id, agreed, errCompressorNotAgreed)
}

// agreedText names the compressors agreed with the client, for errors.
func (cn *conn) agreedText() string {
	var names []string
	for id := wire.CompressorNoop; id <= wire.CompressorZstd; id++ {
		if cn.comp&(1<<id) != 0 {
			names = append(names, id.String())
		}
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// tlsSubject returns the subject of the client's verified certificate as
// an RFC 2253 distinguished name (most specific first, as MongoDB writes
// the user names of the MONGODB-X509 mechanism), and whether there is one:
// only a TLS client that presented a certificate verified against
// tls_ca_file has one.
func (cn *conn) tlsSubject() (string, bool) {
	if cn.tlsConn == nil {
		return "", false
	}
	st := cn.tlsConn.ConnectionState()
	if len(st.VerifiedChains) == 0 || len(st.VerifiedChains[0]) == 0 {
		return "", false
	}
	return auth.X509Subject(st.VerifiedChains[0][0].RawSubject)
}
