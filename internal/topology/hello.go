package topology

import (
	"fmt"
	"slices"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/upstream"
)

// parseHello decodes a hello reply received on the monitoring connection.
// Negotiated, per-connection fields (compression, SASL mechanisms) are not in
// a plain hello reply; they are taken from the connection's handshake
// reply hs so that the result describes the server as completely as the
// handshake did. raw is retained.
func parseHello(raw bsoncore.Document, hs *upstream.Hello) (*upstream.Hello, error) {
	h, err := upstream.ParseHello(raw)
	if err != nil {
		return nil, fmt.Errorf("topology: hello reply: %w", err)
	}
	if hs != nil {
		h.Compression = slices.Clone(hs.Compression)
		h.SaslSupportedMechs = slices.Clone(hs.SaslSupportedMechs)
		if !h.HasServiceID {
			h.ServiceID, h.HasServiceID = hs.ServiceID, hs.HasServiceID
		}
	}
	return h, nil
}
