package wire

import (
	"errors"
	"strings"
)

// Sentinel errors. Every error returned by this package's parsers and
// codecs matches exactly one of these with errors.Is (a few also match a
// second, more general error such as io.ErrUnexpectedEOF; see ProtocolError).
var (
	// ErrMessageTooSmall reports a messageLength below HeaderLen, or a
	// message slice shorter than the header it must contain.
	ErrMessageTooSmall = errors.New("message too small")
	// ErrMessageTooLarge reports a messageLength (or, for OP_COMPRESSED, an
	// uncompressedSize) above the negotiated maximum.
	ErrMessageTooLarge = errors.New("message too large")
	// ErrUnknownOpCode reports an opcode this package does not know.
	ErrUnknownOpCode = errors.New("unknown opcode")
	// ErrUnexpectedOpCode reports a known opcode handed to a parser for a
	// different one (for example an OP_QUERY given to ParseMsg).
	ErrUnexpectedOpCode = errors.New("unexpected opcode")
	// ErrTruncated reports a message or stream that ends before a field it
	// declares.
	ErrTruncated = errors.New("truncated message")
	// ErrLengthMismatch reports a message slice whose length differs from
	// the messageLength in its header.
	ErrLengthMismatch = errors.New("message length mismatch")
	// ErrInvalidBSON reports a malformed BSON document.
	ErrInvalidBSON = errors.New("invalid BSON")
	// ErrBadChecksum reports an OP_MSG whose CRC-32C does not match.
	ErrBadChecksum = errors.New("bad OP_MSG checksum")
	// ErrUnknownFlags reports an OP_MSG with an unknown required flag bit
	// (bits 0-15) set.
	ErrUnknownFlags = errors.New("unknown required OP_MSG flag bits")
	// ErrBadSection reports an invalid OP_MSG section layout: an unknown
	// section kind, a missing or repeated kind-0 section, or a bad kind-1
	// size or identifier.
	ErrBadSection = errors.New("bad OP_MSG section")
	// ErrUnknownCompressor reports a compressor id or name this package does
	// not implement.
	ErrUnknownCompressor = errors.New("unknown compressor")
	// ErrDecompressedSize reports an OP_COMPRESSED message whose declared
	// uncompressedSize is negative, above the limit, or different from what
	// the compressed data actually yields.
	ErrDecompressedSize = errors.New("decompressed size mismatch")
	// ErrCorruptCompressed reports compressed data the decompressor rejects.
	ErrCorruptCompressed = errors.New("corrupt compressed data")
	// ErrUnexpectedReply: a reply that answers another request than the
	// one out on the connection.
	ErrUnexpectedReply = errors.New("reply to another request")
)

// ProtocolError describes a malformed or unacceptable message. It unwraps
// to Err (one of the package sentinels) and, when set, to Cause, so both
// errors.Is(err, ErrTruncated) and errors.Is(err, io.ErrUnexpectedEOF) work
// for a short read. It never contains message payload bytes, only sizes and
// static descriptions, so it is safe to log.
type ProtocolError struct {
	// Op names the operation that failed, e.g. "parse OP_MSG".
	Op string
	// Err is the sentinel classifying the failure.
	Err error
	// Detail is a short human-readable explanation (may be empty).
	Detail string
	// Cause is an optional underlying error (I/O or decompressor error).
	Cause error
}

// Error implements error.
func (e *ProtocolError) Error() string {
	var b strings.Builder
	b.WriteString("wire: ")
	if e.Op != "" {
		b.WriteString(e.Op)
		b.WriteString(": ")
	}
	if e.Err != nil {
		b.WriteString(e.Err.Error())
	}
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	}
	if e.Cause != nil {
		b.WriteString(": ")
		b.WriteString(e.Cause.Error())
	}
	return b.String()
}

// Unwrap returns the sentinel and, if present, the underlying cause.
func (e *ProtocolError) Unwrap() []error {
	if e.Cause != nil {
		return []error{e.Err, e.Cause}
	}
	return []error{e.Err}
}

func protoErr(op string, sentinel error, detail string) error {
	return &ProtocolError{Op: op, Err: sentinel, Detail: detail}
}
