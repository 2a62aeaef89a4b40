package wire

import (
	"bytes"
	"slices"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// OP_REPLY responseFlags bits.
const (
	// ReplyCursorNotFound: the getMore's cursor id was not found.
	ReplyCursorNotFound int32 = 1 << 0
	// ReplyQueryFailure: the single document is a {$err: ...} error.
	ReplyQueryFailure int32 = 1 << 1
	// ReplyAwaitCapable: the server supports awaitData; servers always set
	// it, so AppendReply does too.
	ReplyAwaitCapable int32 = 1 << 3
)

// Query is a parsed OP_QUERY. Drivers send it only for the first hello
// (isMaster on admin.$cmd) when no API version is declared. Query and
// ReturnFieldsSelector alias the message buffer.
type Query struct {
	// Header is the message header.
	Header Header
	// Flags is the OP_QUERY flags field.
	Flags int32
	// FullCollectionName is "db.collection"; "admin.$cmd" for commands.
	FullCollectionName string
	// NumberToSkip is the number of documents to skip.
	NumberToSkip int32
	// NumberToReturn is the batch size (-1 for commands).
	NumberToReturn int32
	// Query is the query or command document.
	Query bsoncore.Document
	// ReturnFieldsSelector is the optional projection (nil if absent).
	ReturnFieldsSelector bsoncore.Document
}

// ParseQuery parses and validates a whole OP_QUERY message: exact length,
// a NUL-terminated collection name, a valid query document, an optional
// valid selector, and nothing after it.
func ParseQuery(msg []byte) (Query, error) {
	const op = "parse OP_QUERY"
	h, err := parseFrame(op, msg, OpQuery)
	if err != nil {
		return Query{}, err
	}
	b := msg[HeaderLen:]
	if len(b) < 4 {
		return Query{}, protoErr(op, ErrTruncated, "no flags")
	}
	q := Query{Header: h, Flags: int32(le.Uint32(b))}
	b = b[4:]
	k := bytes.IndexByte(b, 0)
	if k < 0 {
		return Query{}, protoErr(op, ErrTruncated, "fullCollectionName not NUL-terminated")
	}
	q.FullCollectionName = intern(b[:k])
	b = b[k+1:]
	if len(b) < 8 {
		return Query{}, protoErr(op, ErrTruncated, "no numberToSkip/numberToReturn")
	}
	q.NumberToSkip = int32(le.Uint32(b))
	q.NumberToReturn = int32(le.Uint32(b[4:]))
	b = b[8:]
	doc, rest, reason := readDoc(b)
	if reason != "" {
		return Query{}, protoErr(op, ErrInvalidBSON, "query: "+reason)
	}
	q.Query = doc
	if len(rest) > 0 {
		sel, rest2, reason := readDoc(rest)
		if reason != "" {
			return Query{}, protoErr(op, ErrInvalidBSON, "returnFieldsSelector: "+reason)
		}
		if len(rest2) > 0 {
			return Query{}, protoErr(op, ErrLengthMismatch, strconv.Itoa(len(rest2))+" trailing bytes")
		}
		q.ReturnFieldsSelector = sel
	}
	return q, nil
}

// readDoc splits one validated document off the front of b.
func readDoc(b []byte) (doc bsoncore.Document, rest []byte, reason string) {
	if len(b) < 5 {
		return nil, b, "document truncated"
	}
	n := int(int32(le.Uint32(b)))
	if n < 5 || n > len(b) {
		return nil, b, "document length out of range"
	}
	if reason := validateDoc(b[:n], 0); reason != "" {
		return nil, b, reason
	}
	return b[:n], b[n:], ""
}

// AppendQuery appends an OP_QUERY (responseTo 0, no field selector) to dst.
func AppendQuery(dst []byte, requestID int32, flags int32, fullCollectionName string, skip, nReturn int32, query bsoncore.Document) []byte {
	size := HeaderLen + 4 + len(fullCollectionName) + 1 + 8 + len(query)
	dst = slices.Grow(dst, size)
	dst = AppendHeader(dst, Header{MessageLength: int32(size), RequestID: requestID, OpCode: OpQuery})
	dst = le.AppendUint32(dst, uint32(flags))
	dst = append(dst, fullCollectionName...)
	dst = append(dst, 0)
	dst = le.AppendUint32(dst, uint32(skip))
	dst = le.AppendUint32(dst, uint32(nReturn))
	return append(dst, query...)
}

// Reply is a parsed OP_REPLY. Documents alias the message buffer.
type Reply struct {
	// Header is the message header.
	Header Header
	// ResponseFlags holds the Reply* bits.
	ResponseFlags int32
	// CursorID is the cursor for a legacy query (0 for commands).
	CursorID int64
	// StartingFrom is the position of the first document in the cursor.
	StartingFrom int32
	// NumberReturned is the document count, checked against Documents.
	NumberReturned int32
	// Documents are the returned documents.
	Documents []bsoncore.Document
}

// replyFixedLen is responseFlags + cursorID + startingFrom + numberReturned.
const replyFixedLen = 4 + 8 + 4 + 4

// ParseReply parses and validates a whole OP_REPLY: exact length, valid
// documents filling the rest of the message, and a numberReturned equal to
// their count (checked against the remaining bytes before allocating).
func ParseReply(msg []byte) (Reply, error) {
	const op = "parse OP_REPLY"
	h, err := parseFrame(op, msg, OpReply)
	if err != nil {
		return Reply{}, err
	}
	b := msg[HeaderLen:]
	if len(b) < replyFixedLen {
		return Reply{}, protoErr(op, ErrTruncated, "fixed fields truncated")
	}
	r := Reply{
		Header:         h,
		ResponseFlags:  int32(le.Uint32(b)),
		CursorID:       int64(le.Uint64(b[4:])),
		StartingFrom:   int32(le.Uint32(b[12:])),
		NumberReturned: int32(le.Uint32(b[16:])),
	}
	b = b[replyFixedLen:]
	if r.NumberReturned < 0 || int(r.NumberReturned) > len(b)/5 {
		return Reply{}, protoErr(op, ErrTruncated, "numberReturned "+strconv.Itoa(int(r.NumberReturned))+
			" does not fit in "+strconv.Itoa(len(b))+" bytes")
	}
	if r.NumberReturned > 0 {
		r.Documents = make([]bsoncore.Document, 0, r.NumberReturned)
	}
	for len(b) > 0 {
		if len(r.Documents) == int(r.NumberReturned) {
			return Reply{}, protoErr(op, ErrLengthMismatch, "more documents than numberReturned")
		}
		doc, rest, reason := readDoc(b)
		if reason != "" {
			return Reply{}, protoErr(op, ErrInvalidBSON, reason)
		}
		r.Documents = append(r.Documents, doc)
		b = rest
	}
	if len(r.Documents) != int(r.NumberReturned) {
		return Reply{}, protoErr(op, ErrTruncated, "fewer documents than numberReturned")
	}
	return r, nil
}

// AppendReply appends an OP_REPLY answering responseTo with docs (flags
// ReplyAwaitCapable, cursor 0, startingFrom 0), as a server answers a
// command sent over OP_QUERY.
func AppendReply(dst []byte, requestID, responseTo int32, docs ...bsoncore.Document) []byte {
	return AppendReplyFull(dst, requestID, responseTo, ReplyAwaitCapable, 0, 0, docs...)
}

// AppendReplyFull appends an OP_REPLY with every field given.
func AppendReplyFull(dst []byte, requestID, responseTo, flags int32, cursorID int64, startingFrom int32, docs ...bsoncore.Document) []byte {
	size := HeaderLen + replyFixedLen
	for _, d := range docs {
		size += len(d)
	}
	dst = slices.Grow(dst, size)
	dst = AppendHeader(dst, Header{MessageLength: int32(size), RequestID: requestID, ResponseTo: responseTo, OpCode: OpReply})
	dst = le.AppendUint32(dst, uint32(flags))
	dst = le.AppendUint64(dst, uint64(cursorID))
	dst = le.AppendUint32(dst, uint32(startingFrom))
	dst = le.AppendUint32(dst, uint32(len(docs)))
	for _, d := range docs {
		dst = append(dst, d...)
	}
	return dst
}
