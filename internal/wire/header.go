package wire

import (
	"encoding/binary"
	"errors"
	"io"
	"strconv"
)

// HeaderLen is the size of the standard message header (MsgHeader).
const HeaderLen = 16

// DefaultMaxMessageSize is the maxMessageSizeBytes every MongoDB server has
// reported so far; use it until the upstream's hello says otherwise.
const DefaultMaxMessageSize = 48_000_000

var le = binary.LittleEndian

// OpCode identifies the kind of a wire message.
type OpCode int32

// Opcodes. Only OpMsg, OpCompressed, OpQuery (the first hello) and OpReply
// are still accepted by servers; the others were removed in MongoDB 6.0 and
// are listed so that they can be named in errors and logs.
const (
	OpReply       OpCode = 1
	OpUpdate      OpCode = 2001
	OpInsert      OpCode = 2002
	OpQuery       OpCode = 2004
	OpGetMore     OpCode = 2005
	OpDelete      OpCode = 2006
	OpKillCursors OpCode = 2007
	OpCompressed  OpCode = 2012
	OpMsg         OpCode = 2013
)

// String returns the opcode's wire-protocol name, e.g. "OP_MSG".
func (o OpCode) String() string {
	switch o {
	case OpReply:
		return "OP_REPLY"
	case OpUpdate:
		return "OP_UPDATE"
	case OpInsert:
		return "OP_INSERT"
	case OpQuery:
		return "OP_QUERY"
	case OpGetMore:
		return "OP_GET_MORE"
	case OpDelete:
		return "OP_DELETE"
	case OpKillCursors:
		return "OP_KILL_CURSORS"
	case OpCompressed:
		return "OP_COMPRESSED"
	case OpMsg:
		return "OP_MSG"
	}
	return "OpCode(" + strconv.Itoa(int(o)) + ")"
}

// Known reports whether o is one of the opcodes defined above.
func (o OpCode) Known() bool {
	switch o {
	case OpReply, OpUpdate, OpInsert, OpQuery, OpGetMore, OpDelete, OpKillCursors, OpCompressed, OpMsg:
		return true
	}
	return false
}

// Header is the standard message header that starts every wire message.
type Header struct {
	// MessageLength is the length of the whole message, header included.
	MessageLength int32
	// RequestID identifies this message on its connection.
	RequestID int32
	// ResponseTo is the RequestID of the request this message answers
	// (0 for requests).
	ResponseTo int32
	// OpCode is the message kind.
	OpCode OpCode
}

// ParseHeader decodes the header at the start of b. It fails with
// ErrTruncated when b is shorter than HeaderLen and with ErrMessageTooSmall
// when messageLength is below HeaderLen. It does not check the opcode, so
// that callers can report unknown opcodes with the request id in hand.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderLen {
		return Header{}, protoErr("parse header", ErrTruncated, "fewer than 16 bytes")
	}
	h := Header{
		MessageLength: int32(le.Uint32(b[0:])),
		RequestID:     int32(le.Uint32(b[4:])),
		ResponseTo:    int32(le.Uint32(b[8:])),
		OpCode:        OpCode(int32(le.Uint32(b[12:]))),
	}
	if h.MessageLength < HeaderLen {
		return h, protoErr("parse header", ErrMessageTooSmall, "messageLength "+strconv.Itoa(int(h.MessageLength)))
	}
	return h, nil
}

// AppendHeader appends the 16 header bytes of h to dst.
func AppendHeader(dst []byte, h Header) []byte {
	dst = le.AppendUint32(dst, uint32(h.MessageLength))
	dst = le.AppendUint32(dst, uint32(h.RequestID))
	dst = le.AppendUint32(dst, uint32(h.ResponseTo))
	return le.AppendUint32(dst, uint32(h.OpCode))
}

// SetRequestID overwrites the requestID of msg in place. It does nothing if
// msg is shorter than a header. For an OP_MSG with checksumPresent the
// checksum covers the header, so call UpdateChecksum afterwards (or strip
// the checksum with ClearMsgFlags).
func SetRequestID(msg []byte, id int32) {
	if len(msg) >= HeaderLen {
		le.PutUint32(msg[4:], uint32(id))
	}
}

// SetResponseTo overwrites the responseTo of msg in place. The checksum
// caveat of SetRequestID applies.
func SetResponseTo(msg []byte, id int32) {
	if len(msg) >= HeaderLen {
		le.PutUint32(msg[8:], uint32(id))
	}
}

// ReadMessage reads one whole message (header included) from r and returns
// it. The message is read into buf when cap(buf) is large enough, otherwise
// into a new slice that grows with the bytes that actually arrive (from
// 64 KiB, doubling, up to the message's size): a peer that declares a large
// message and sends less costs at most twice what it sent. A messageLength
// below HeaderLen (ErrMessageTooSmall) or above maxSize (ErrMessageTooLarge)
// is rejected after the 16 header bytes and before anything is allocated or
// read further. maxSize <= 0 means DefaultMaxMessageSize.
//
// A clean end of stream before the first byte returns io.EOF unwrapped. An
// end of stream inside a message returns an error matching both
// ErrTruncated and io.ErrUnexpectedEOF. Other read errors (timeouts, resets)
// are returned unwrapped so that net.Error checks keep working. After any
// error the stream position is unknown and the connection must be dropped.
func ReadMessage(r io.Reader, buf []byte, maxSize int) ([]byte, error) {
	if maxSize <= 0 {
		maxSize = DefaultMaxMessageSize
	}
	var hdr []byte
	if cap(buf) >= HeaderLen {
		hdr = buf[:HeaderLen]
	} else {
		hdr = make([]byte, HeaderLen)
	}
	if _, err := io.ReadFull(r, hdr); err != nil {
		return nil, readErr(err)
	}
	n, err := MessageLength(hdr, maxSize)
	if err != nil {
		return nil, err
	}
	if cap(buf) >= n {
		msg := buf[:n]
		if _, err := io.ReadFull(r, msg[HeaderLen:]); err != nil {
			return nil, readBodyErr(err)
		}
		return msg, nil
	}
	msg := GrowMessage(hdr[:HeaderLen:HeaderLen], n)
	for len(msg) < n {
		if len(msg) == cap(msg) {
			msg = GrowMessage(msg, n)
		}
		k, err := io.ReadFull(r, msg[len(msg):min(n, cap(msg))])
		msg = msg[:len(msg)+k]
		if err != nil {
			return nil, readBodyErr(err)
		}
	}
	return msg, nil
}

// firstReadSize is how much ReadMessage allocates for a message before any
// of its body has arrived; larger messages grow as they are read.
const firstReadSize = 64 << 10

// readBodyErr maps an error from inside a message: an end of stream there
// is a truncated message, never a clean io.EOF.
func readBodyErr(err error) error {
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return readErr(err)
}

func readErr(err error) error {
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return &ProtocolError{Op: "read message", Err: ErrTruncated, Cause: io.ErrUnexpectedEOF}
	}
	return err
}

// parseFrame checks that msg is exactly one whole message of opcode want.
func parseFrame(op string, msg []byte, want OpCode) (Header, error) {
	if len(msg) < HeaderLen {
		return Header{}, protoErr(op, ErrMessageTooSmall, "fewer than 16 bytes")
	}
	h, err := ParseHeader(msg)
	if err != nil {
		return h, protoErr(op, ErrMessageTooSmall, "messageLength "+strconv.Itoa(int(h.MessageLength)))
	}
	if int(h.MessageLength) > len(msg) {
		return h, protoErr(op, ErrTruncated,
			"messageLength "+strconv.Itoa(int(h.MessageLength))+" but "+strconv.Itoa(len(msg))+" bytes")
	}
	if int(h.MessageLength) < len(msg) {
		return h, protoErr(op, ErrLengthMismatch,
			"messageLength "+strconv.Itoa(int(h.MessageLength))+" but "+strconv.Itoa(len(msg))+" bytes")
	}
	if h.OpCode != want {
		if !h.OpCode.Known() {
			return h, protoErr(op, ErrUnknownOpCode, h.OpCode.String())
		}
		return h, protoErr(op, ErrUnexpectedOpCode, h.OpCode.String())
	}
	return h, nil
}
