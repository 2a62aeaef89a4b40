package wire

import (
	"bytes"
	"hash/crc32"
	"iter"
	"slices"
	"strconv"
	"strings"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// castagnoli is the CRC-32C table; hash/crc32 uses the SSE4.2 / ARMv8
// instructions for it when available.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// MsgFlags is the OP_MSG flagBits field.
type MsgFlags uint32

// OP_MSG flag bits. Bits 0-15 are required: a receiver must reject unknown
// ones. Bits 16-31 are optional and unknown ones are ignored.
const (
	// FlagChecksumPresent: the message ends with a CRC-32C of everything
	// before it.
	FlagChecksumPresent MsgFlags = 1 << 0
	// FlagMoreToCome: from a client, no reply is expected (w:0); from a
	// server, another reply follows (exhaust stream).
	FlagMoreToCome MsgFlags = 1 << 1
	// FlagExhaustAllowed: the client accepts several replies (each with
	// moreToCome but the last) to this request.
	FlagExhaustAllowed MsgFlags = 1 << 16

	requiredFlagMask = MsgFlags(0xFFFF)
	knownRequired    = FlagChecksumPresent | FlagMoreToCome
)

// maxSequences caps the kind-1 sections of one message. Commands use at
// most two (bulkWrite's ops and nsInfo); the cap keeps the duplicate
// identifier check, which is quadratic, and the Sequences slice bounded
// against a message made of millions of tiny sections.
const maxSequences = 64

// Has reports whether all bits of x are set in f.
func (f MsgFlags) Has(x MsgFlags) bool { return f&x == x }

// String lists the flag names, e.g. "checksumPresent|moreToCome"; unknown
// bits are shown in hex.
func (f MsgFlags) String() string {
	if f == 0 {
		return "0"
	}
	var parts []string
	if f&FlagChecksumPresent != 0 {
		parts = append(parts, "checksumPresent")
	}
	if f&FlagMoreToCome != 0 {
		parts = append(parts, "moreToCome")
	}
	if f&FlagExhaustAllowed != 0 {
		parts = append(parts, "exhaustAllowed")
	}
	if rest := f &^ (FlagChecksumPresent | FlagMoreToCome | FlagExhaustAllowed); rest != 0 {
		parts = append(parts, "0x"+strconv.FormatUint(uint64(rest), 16))
	}
	return strings.Join(parts, "|")
}

// Sequence is an OP_MSG kind-1 section: a document sequence that stands
// for the body field named Identifier (e.g. "documents" for insert).
type Sequence struct {
	// Identifier is the body field this sequence supplies.
	Identifier string
	// Documents holds the concatenated BSON documents (possibly none).
	Documents []byte
}

// All iterates over the documents of s. It stops early, without panicking,
// at the first document whose length prefix does not fit; sequences from
// ParseMsg are validated, so that only matters for hand-built ones.
func (s Sequence) All() iter.Seq[bsoncore.Document] {
	return func(yield func(bsoncore.Document) bool) {
		b := s.Documents
		for len(b) >= 5 {
			n := int(int32(le.Uint32(b)))
			if n < 5 || n > len(b) {
				return
			}
			if !yield(bsoncore.Document(b[:n])) {
				return
			}
			b = b[n:]
		}
	}
}

// Len returns the number of documents in s (counting stops at the first
// malformed length, as for All).
func (s Sequence) Len() int {
	n := 0
	for range s.All() {
		n++
	}
	return n
}

// Msg is a zero-copy view of an OP_MSG: Body and every Sequence's
// Documents alias the message buffer it was parsed from.
type Msg struct {
	// Header is the message header.
	Header Header
	// Flags is the flagBits field.
	Flags MsgFlags
	// Body is the single kind-0 section (the command or reply document).
	Body bsoncore.Document
	// Sequences are the kind-1 sections in wire order.
	Sequences []Sequence
	// Checksum is the CRC-32C when FlagChecksumPresent is set (verified).
	Checksum uint32
}

// ParseMsg parses and validates a whole OP_MSG (header included). See
// ParseMsgInto for the checks; ParseMsg allocates only when the message has
// kind-1 sections (the Sequences slice, plus unusual identifiers).
func ParseMsg(msg []byte) (Msg, error) {
	var m Msg
	err := ParseMsgInto(msg, &m)
	return m, err
}

// ParseMsgInto parses msg into m, reusing m.Sequences' backing array so
// that the steady state allocates nothing. It checks that:
//   - the header's messageLength equals len(msg) and the opcode is OP_MSG;
//   - no unknown required flag bit (0-15) is set (ErrUnknownFlags);
//   - with checksumPresent, the trailing CRC-32C matches (ErrBadChecksum);
//   - there is exactly one kind-0 section and only kinds 0 and 1
//     (ErrBadSection);
//   - each kind-1 size covers at least its identifier and fits in the
//     message, identifiers are non-empty and unique, and there are at most
//     64 kind-1 sections (ErrBadSection);
//   - every document, in the body and in the sequences, is valid BSON that
//     fits exactly (ErrInvalidBSON; see ValidateDocument).
//
// On error m is reset (keeping only the Sequences backing array).
func ParseMsgInto(msg []byte, m *Msg) error {
	seqs := m.Sequences[:0]
	*m = Msg{Sequences: seqs}
	const op = "parse OP_MSG"
	h, err := parseFrame(op, msg, OpMsg)
	if err != nil {
		return err
	}
	// flagBits, one section kind byte and the smallest document.
	if len(msg) < HeaderLen+4+1+5 {
		return protoErr(op, ErrTruncated, "too short for flags and a body section")
	}
	flags := MsgFlags(le.Uint32(msg[HeaderLen:]))
	if unknown := flags & requiredFlagMask &^ knownRequired; unknown != 0 {
		return protoErr(op, ErrUnknownFlags, "flagBits 0x"+strconv.FormatUint(uint64(flags), 16))
	}
	end := len(msg)
	var sum uint32
	if flags&FlagChecksumPresent != 0 {
		if end < HeaderLen+4+1+5+4 {
			return protoErr(op, ErrTruncated, "too short for a checksum")
		}
		end -= 4
		sum = le.Uint32(msg[end:])
		if crc32.Checksum(msg[:end], castagnoli) != sum {
			return protoErr(op, ErrBadChecksum, "")
		}
	}
	var body []byte
	p := HeaderLen + 4
	for p < end {
		kind := msg[p]
		p++
		if kind > 1 {
			return protoErr(op, ErrBadSection, "unknown section kind "+strconv.Itoa(int(kind)))
		}
		if end-p < 4 {
			return protoErr(op, ErrTruncated, "section truncated before its size")
		}
		n := int(int32(le.Uint32(msg[p:])))
		switch kind {
		case 0:
			if body != nil {
				return protoErr(op, ErrBadSection, "more than one kind-0 section")
			}
			if n < 5 || n > end-p {
				return protoErr(op, ErrInvalidBSON, "body length "+strconv.Itoa(n)+" out of range")
			}
			body = msg[p : p+n]
			if reason := validateDoc(body, 0); reason != "" {
				return protoErr(op, ErrInvalidBSON, "body: "+reason)
			}
		case 1:
			// int32 size and at least a one-byte identifier plus its NUL.
			if n < 4+2 || n > end-p {
				return protoErr(op, ErrBadSection, "kind-1 size "+strconv.Itoa(n)+" out of range")
			}
			sec := msg[p+4 : p+n]
			k := bytes.IndexByte(sec, 0)
			if k < 0 {
				return protoErr(op, ErrBadSection, "kind-1 identifier not NUL-terminated")
			}
			if k == 0 {
				return protoErr(op, ErrBadSection, "kind-1 identifier empty")
			}
			if len(seqs) == maxSequences {
				return protoErr(op, ErrBadSection, "more than "+strconv.Itoa(maxSequences)+" kind-1 sections")
			}
			ident := sec[:k]
			for i := range seqs {
				if seqs[i].Identifier == string(ident) {
					return protoErr(op, ErrBadSection, "duplicate kind-1 identifier")
				}
			}
			docs := sec[k+1:]
			if reason := validateDocs(docs); reason != "" {
				return protoErr(op, ErrInvalidBSON, "kind-1 document: "+reason)
			}
			seqs = append(seqs, Sequence{Identifier: intern(ident), Documents: docs})
		}
		p += n
	}
	if body == nil {
		return protoErr(op, ErrBadSection, "no kind-0 section")
	}
	*m = Msg{Header: h, Flags: flags, Body: body, Sequences: seqs, Checksum: sum}
	return nil
}

// validateDocs validates a concatenation of BSON documents.
func validateDocs(b []byte) string {
	for len(b) > 0 {
		if len(b) < 5 {
			return "trailing bytes shorter than a document"
		}
		n := int(int32(le.Uint32(b)))
		if n < 5 || n > len(b) {
			return "document length out of range"
		}
		if reason := validateDoc(b[:n], 0); reason != "" {
			return reason
		}
		b = b[n:]
	}
	return ""
}

// MsgSize returns the length AppendMsg will produce for these arguments.
func MsgSize(flags MsgFlags, body bsoncore.Document, seqs ...Sequence) int {
	n := HeaderLen + 4 + 1 + len(body)
	for i := range seqs {
		n += 1 + 4 + len(seqs[i].Identifier) + 1 + len(seqs[i].Documents)
	}
	if flags&FlagChecksumPresent != 0 {
		n += 4
	}
	return n
}

// AppendMsg appends an OP_MSG with the given ids, flags, body (kind-0) and
// sequences (kind-1, in order) to dst, growing dst at most once. With
// FlagChecksumPresent it appends the CRC-32C. It does not validate body or
// sequences, and it is the caller's job to keep the result under the
// peer's maxMessageSizeBytes.
func AppendMsg(dst []byte, requestID, responseTo int32, flags MsgFlags, body bsoncore.Document, seqs ...Sequence) []byte {
	size := MsgSize(flags, body, seqs...)
	start := len(dst)
	dst = slices.Grow(dst, size)
	dst = AppendHeader(dst, Header{MessageLength: int32(size), RequestID: requestID, ResponseTo: responseTo, OpCode: OpMsg})
	dst = le.AppendUint32(dst, uint32(flags))
	dst = append(dst, 0)
	dst = append(dst, body...)
	for i := range seqs {
		s := &seqs[i]
		dst = append(dst, 1)
		dst = le.AppendUint32(dst, uint32(4+len(s.Identifier)+1+len(s.Documents)))
		dst = append(dst, s.Identifier...)
		dst = append(dst, 0)
		dst = append(dst, s.Documents...)
	}
	if flags&FlagChecksumPresent != 0 {
		dst = le.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli))
	}
	return dst
}

// PeekMsgFlags returns the flagBits of an OP_MSG without parsing it. ok is
// false if msg is not an OP_MSG long enough to hold them.
func PeekMsgFlags(msg []byte) (flags MsgFlags, ok bool) {
	if len(msg) < HeaderLen+4 || OpCode(int32(le.Uint32(msg[12:]))) != OpMsg {
		return 0, false
	}
	return MsgFlags(le.Uint32(msg[HeaderLen:])), true
}

// ChecksumOK reports whether msg carries no checksum (it is not an OP_MSG,
// or its checksumPresent flag is clear) or a correct one. It reads nothing
// else, for relays that pass messages on unparsed.
func ChecksumOK(msg []byte) bool {
	flags, ok := PeekMsgFlags(msg)
	if !ok || flags&FlagChecksumPresent == 0 {
		return true
	}
	if len(msg) < HeaderLen+4+4 {
		return false
	}
	end := len(msg) - 4
	return crc32.Checksum(msg[:end], castagnoli) == le.Uint32(msg[end:])
}

// UpdateChecksum recomputes the trailing CRC-32C of an OP_MSG whose
// checksumPresent flag is set, after the caller changed the message (for
// example with SetRequestID). It does nothing for other messages.
func UpdateChecksum(msg []byte) {
	flags, ok := PeekMsgFlags(msg)
	if !ok || flags&FlagChecksumPresent == 0 || len(msg) < HeaderLen+4+4 {
		return
	}
	end := len(msg) - 4
	le.PutUint32(msg[end:], crc32.Checksum(msg[:end], castagnoli))
}

// ClearMsgFlags clears the given flag bits of the OP_MSG msg in place and
// returns the (possibly shorter) message. Clearing FlagChecksumPresent on a
// message that has it drops the 4 checksum bytes and fixes messageLength;
// if the checksum stays, it is recomputed. The proxy uses this to strip
// checksumPresent or exhaustAllowed from a message it forwards. It does not
// verify the old checksum: parse the message first (ParseMsgInto does).
func ClearMsgFlags(msg []byte, clear MsgFlags) ([]byte, error) {
	const op = "clear OP_MSG flags"
	if _, err := parseFrame(op, msg, OpMsg); err != nil {
		return msg, err
	}
	if len(msg) < HeaderLen+4 {
		return msg, protoErr(op, ErrTruncated, "too short for flags")
	}
	old := MsgFlags(le.Uint32(msg[HeaderLen:]))
	flags := old &^ clear
	if flags == old {
		return msg, nil
	}
	if old&FlagChecksumPresent != 0 && len(msg) < HeaderLen+4+4 {
		return msg, protoErr(op, ErrTruncated, "too short for a checksum")
	}
	le.PutUint32(msg[HeaderLen:], uint32(flags))
	if old&FlagChecksumPresent != 0 {
		if flags&FlagChecksumPresent == 0 {
			msg = msg[:len(msg)-4]
			le.PutUint32(msg[0:], uint32(len(msg)))
		} else {
			UpdateChecksum(msg)
		}
	}
	return msg, nil
}
