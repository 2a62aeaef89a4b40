package gate

// What a client that has not logged in (client authentication on, no
// identity yet) may send and be answered, as rules over plain values: its
// messages are read under max_prelogin_message_size (ReadLimit), and of the
// commands that are not a handshake or a login only ping and buildInfo are
// answered, by mongobouncer itself (PreLoginAnswered, BuildInfo), as a
// mongos answers ping. The verdict on a request (proxy's admit) applies
// them.

import (
	"fmt"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/wire"
)

// DefaultMaxPreLoginMessageSize is max_prelogin_message_size's default:
// room for a handshake with the largest client metadata and a
// speculative login, and for a SCRAM step, many times over.
const DefaultMaxPreLoginMessageSize = 64 * 1024

// PreLoginLimit is max_prelogin_message_size given its setting (0 or less:
// the default).
func PreLoginLimit(setting int) int {
	if setting > 0 {
		return setting
	}
	return DefaultMaxPreLoginMessageSize
}

// ReadLimit is the largest message a client may send now: maxMsg (its
// listener's or route's max_message_size), and while it must still log in
// (pending) preLogin (PreLoginLimit) if smaller. It bounds the length a
// header declares and the uncompressed size an OP_COMPRESSED declares,
// both before anything of that size is allocated.
func ReadLimit(pending bool, maxMsg, preLogin int) int {
	if pending {
		return min(maxMsg, preLogin)
	}
	return maxMsg
}

// SizeError is the protocol error for a message of n bytes over limit
// (ReadLimit), or under the header's size; byPreLogin says limit is
// max_prelogin_message_size's.
func SizeError(n, limit int, byPreLogin bool) error {
	if n >= wire.HeaderLen && byPreLogin {
		return fmt.Errorf("a message of %d bytes before login is over max_prelogin_message_size (%d bytes): log in first: %w",
			n, limit, wire.ErrMessageTooLarge)
	}
	return fmt.Errorf("message length %d is outside [%d, %d]: %w", n, wire.HeaderLen, limit, wire.ErrMessageTooLarge)
}

// PreLoginAnswered reports whether the command name on database db is one
// mongobouncer answers for a client that has not logged in: ping and
// buildInfo, which a server runs without a login too (health checks), on
// any database but the admin console's (adminDB).
func PreLoginAnswered(name, db, adminDB string) bool {
	switch name {
	case "ping", "buildInfo", "buildinfo":
		return db != "" && db != adminDB
	}
	return false
}

// BuildInfo is the reply to a buildInfo before a login: what mongobouncer
// knows of its upstreams without asking one, the release of the
// maxWireVersion it tells clients (maxWire, that of the oldest upstream),
// with the document limit of its hello (maxBSON). Once logged in,
// buildInfo goes upstream and has the server's full answer.
func BuildInfo(maxWire, maxBSON int32) bsoncore.Document {
	major, minor := releaseOfWire(maxWire)
	idx, doc := bsoncore.AppendDocumentStart(nil)
	doc = bsoncore.AppendStringElement(doc, "version", fmt.Sprintf("%d.%d.0", major, minor))
	aidx, d := bsoncore.AppendArrayElementStart(doc, "versionArray")
	d = bsoncore.AppendInt32Element(d, "0", major)
	d = bsoncore.AppendInt32Element(d, "1", minor)
	d = bsoncore.AppendInt32Element(d, "2", 0)
	d = bsoncore.AppendInt32Element(d, "3", 0)
	doc, _ = bsoncore.AppendArrayEnd(d, aidx)
	doc = bsoncore.AppendInt32Element(doc, "bits", 64)
	doc = bsoncore.AppendInt32Element(doc, "maxBsonObjectSize", maxBSON)
	doc = bsoncore.AppendDoubleElement(doc, "ok", 1)
	doc, _ = bsoncore.AppendDocumentEnd(doc, idx)
	return doc
}

// wireReleases maps the wire versions that began a MongoDB release series
// to it, newest first (the driver specifications' table).
var wireReleases = []struct{ wire, major, minor int32 }{
	{25, 8, 0}, {21, 7, 0}, {17, 6, 0}, {13, 5, 0}, {9, 4, 4}, {8, 4, 2}, {7, 4, 0}, {6, 3, 6},
}

// releaseOfWire returns the release series a maxWireVersion of w
// guarantees: the newest that began at w or below.
func releaseOfWire(w int32) (major, minor int32) {
	for _, r := range wireReleases {
		if w >= r.wire {
			return r.major, r.minor
		}
	}
	last := wireReleases[len(wireReleases)-1]
	return last.major, last.minor
}
