package wire

// Rewriting a request: the one change the proxy makes to a command it
// forwards, adding an element to its body (a route's default
// $readPreference).

import (
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// AppendToMsgBody appends to dst the OP_MSG msg with elem, one encoded BSON
// element, added at the end of its body (kind-0 section), keeping the ids,
// flags and document sequences; a checksum, if present, is recomputed. msg
// is parsed and validated first; elem must be a valid element (an invalid
// one is refused). The result is never longer than MaxMessageSize allows
// the caller to check: it is len(msg)+len(elem) bytes.
func AppendToMsgBody(dst, msg, elem []byte) ([]byte, error) {
	const op = "rewrite OP_MSG"
	m, err := ParseMsg(msg)
	if err != nil {
		return dst, err
	}
	if _, rest, ok := bsoncore.ReadElement(elem); !ok || len(rest) != 0 {
		return dst, protoErr(op, ErrInvalidBSON, "the element to add is not one BSON element")
	}
	h, _ := ParseHeader(msg)
	body := make([]byte, 0, len(m.Body)+len(elem))
	body = append(body, m.Body[:len(m.Body)-1]...)
	body = append(body, elem...)
	body = append(body, 0)
	le.PutUint32(body, uint32(len(body)))
	// ReadElement checks only the element's frame, not its value (a
	// string without its NUL passes): the body is validated as a whole,
	// as the receiving end will.
	if reason := validateDoc(body, 0); reason != "" {
		return dst, protoErr(op, ErrInvalidBSON, "the element to add: "+reason)
	}
	return AppendMsg(dst, h.RequestID, h.ResponseTo, m.Flags, body, m.Sequences...), nil
}
