package wire

import (
	"encoding/binary"
	"fmt"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Message framing for relays that receive bytes as they come (the proxy's
// event loop, on epoll or io_uring) and for ReadMessage, which reads from a
// stream: one place decides how long a message is, whether that length is
// acceptable, how far a buffer may grow for it, and whether what arrived
// is exactly one message.

// MessageLength returns how many bytes the message at the front of b takes
// in all: HeaderLen while fewer than 4 bytes have arrived, then its
// messageLength. A messageLength below HeaderLen (ErrMessageTooSmall) or
// above maxSize (ErrMessageTooLarge) is an error, found before anything is
// allocated for it. maxSize <= 0 means DefaultMaxMessageSize.
func MessageLength(b []byte, maxSize int) (int, error) {
	if len(b) < 4 {
		return HeaderLen, nil
	}
	if maxSize <= 0 {
		maxSize = DefaultMaxMessageSize
	}
	n := int(int32(binary.LittleEndian.Uint32(b)))
	if n < HeaderLen {
		return 0, protoErr("read message", ErrMessageTooSmall, "messageLength "+strconv.Itoa(n))
	}
	if n > maxSize {
		return 0, protoErr("read message", ErrMessageTooLarge,
			"messageLength "+strconv.Itoa(n)+" exceeds "+strconv.Itoa(maxSize))
	}
	return n, nil
}

// GrowMessage returns b (its bytes kept) with more room toward a message
// of n bytes: b itself when it has room for all of it, else a copy whose
// capacity doubles, from at least 64 KiB, up to n. n must come from
// MessageLength, which bounds it; growing with the bytes that arrive, not
// with the length the header claims, means a peer that declares a large
// message and sends little costs what it sent.
func GrowMessage(b []byte, n int) []byte {
	if cap(b) >= n {
		return b
	}
	nb := make([]byte, len(b), min(n, max(2*cap(b), firstReadSize)))
	copy(nb, b)
	return nb
}

// Framed is what NextMessage found at the front of a receive buffer.
type Framed struct {
	// Msg is the whole first message, nil while it is incomplete.
	Msg []byte
	// Need is the total length the first message takes (HeaderLen until its
	// length is known).
	Need int
	// Extra counts the bytes received past Msg: the start of another
	// message, which a request-reply exchange never expects.
	Extra int
}

// NextMessage frames the bytes received so far at the front of b. It
// returns the first message once it is whole, or how long it will be.
func NextMessage(b []byte, maxSize int) (Framed, error) {
	need, err := MessageLength(b, maxSize)
	if err != nil {
		return Framed{}, err
	}
	if len(b) < need {
		return Framed{Need: need}, nil
	}
	return Framed{Msg: b[:need:need], Need: need, Extra: len(b) - need}, nil
}

// ReplyView returns the flags and the body of an OP_MSG reply without
// validating it, for relays that pass the bytes on unchanged: the body is
// only read with bounds-checked element walks. It returns a nil body for a
// message that is not an OP_MSG or has no kind-0 section.
func ReplyView(msg []byte) (MsgFlags, bsoncore.Document) {
	if len(msg) < HeaderLen+5 || OpCode(int32(le.Uint32(msg[12:]))) != OpMsg {
		return 0, nil
	}
	flags := MsgFlags(le.Uint32(msg[16:]))
	end := len(msg)
	if flags&FlagChecksumPresent != 0 {
		end -= 4
	}
	for p := HeaderLen + 4; p < end; {
		kind := msg[p]
		p++
		if p+4 > end {
			break
		}
		n := int(int32(le.Uint32(msg[p:])))
		if n < 5 || p+n > end {
			break
		}
		if kind == 0 {
			return flags, bsoncore.Document(msg[p : p+n])
		}
		p += n
	}
	return flags, nil
}

// CheckReply reports a whole reply that cannot be relayed: one that does
// not answer request reqID (checked when checkTo: a stale reply left on the
// connection, or a confused server), or whose checksum does not match.
// Nothing more on that connection can be trusted after either.
func CheckReply(reply []byte, addr string, reqID int32, checkTo bool) error {
	if len(reply) < HeaderLen {
		return fmt.Errorf("upstream %s sent a reply of %d bytes: %w", addr, len(reply), ErrMessageTooSmall)
	}
	if to := int32(le.Uint32(reply[8:])); checkTo && to != reqID {
		return fmt.Errorf("upstream %s answered request %d with a reply to %d: %w", addr, reqID, to, ErrUnexpectedReply)
	}
	if !ChecksumOK(reply) {
		return fmt.Errorf("upstream %s sent a reply whose checksum does not match: %w", addr, ErrBadChecksum)
	}
	return nil
}
