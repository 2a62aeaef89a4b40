package command

// The error replies mongobouncer builds: one document shape, the codes it
// answers upstream failures with, the labels that make drivers retry
// correctly, and the shutdown codes of a member softened in relayed
// replies.

import (
	"encoding/binary"
	"strconv"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Error codes of the synthetic replies. They come from the set drivers
// retry, and none of them is a "state change" code: those would make a
// driver mark mongobouncer unknown and drop its pool to us for what is an
// upstream problem.
const (
	CodeHostUnreachable = 6
	CodeNetworkTimeout  = 89
	CodeSocketException = 9001
	// CodeFailedToParse answers a request the proxy cannot read (a bad
	// $readPreference); it is not retryable.
	CodeFailedToParse = 9
)

// Shutdown codes: a server that says it is shutting down.
const (
	CodeShutdownInProgress    = 91
	CodeInterruptedAtShutdown = 11600
)

// ErrorReply builds the body of a MongoDB error reply. Drivers decide what
// to retry from code and errorLabels, so every synthetic error goes through
// here.
func ErrorReply(code int32, codeName, msg string, labels ...string) bsoncore.Document {
	idx, doc := bsoncore.AppendDocumentStart(nil)
	doc = bsoncore.AppendDoubleElement(doc, "ok", 0)
	doc = bsoncore.AppendStringElement(doc, "errmsg", msg)
	doc = bsoncore.AppendInt32Element(doc, "code", code)
	doc = bsoncore.AppendStringElement(doc, "codeName", codeName)
	if len(labels) > 0 {
		aidx, d := bsoncore.AppendArrayElementStart(doc, "errorLabels")
		for i, l := range labels {
			d = bsoncore.AppendStringElement(d, strconv.Itoa(i), l)
		}
		doc, _ = bsoncore.AppendArrayEnd(d, aidx)
	}
	doc, _ = bsoncore.AppendDocumentEnd(doc, idx)
	return doc
}

// OKReply is the body {ok: 1}. It is shared: never write into it.
var OKReply = func() bsoncore.Document {
	idx, d := bsoncore.AppendDocumentStart(nil)
	d = bsoncore.AppendDoubleElement(d, "ok", 1)
	d, _ = bsoncore.AppendDocumentEnd(d, idx)
	return d
}()

// Labels chooses the error labels that make drivers retry req correctly
// when it failed to reach or finish at its upstream; inTxn says it was
// part of an open transaction.
func Labels(req *Request, inTxn bool) []string {
	switch {
	case inTxn && req.Info.Kind == Commit:
		return []string{"RetryableWriteError", "UnknownTransactionCommitResult"}
	case inTxn && req.Info.Kind == Abort:
		return []string{"RetryableWriteError"}
	case inTxn:
		return []string{"TransientTransactionError"}
	case req.Info.Write:
		return []string{"RetryableWriteError"}
	}
	return nil
}

// SoftenShutdown rewrites in place the shutdown codes (91
// ShutdownInProgress, 11600 InterruptedAtShutdown) of a relayed reply body,
// its own code and its writeConcernError's, to HostUnreachable (6), and
// reports whether it changed anything.
//
// A driver that receives a shutdown code clears its whole pool to the
// server that sent it, and that server is mongobouncer, which is not
// shutting down: one member is. HostUnreachable is retried the same way
// (reads by code, writes by the RetryableWriteError label the member
// added), without costing the application its connections to mongobouncer.
// The topology has already seen the original code. codeName and errmsg
// stay as the member wrote them (they say what happened; a shorter name
// would move every byte after it); drivers decide on the code.
func SoftenShutdown(body []byte) bool {
	return softenCodes(body, true)
}

// softenCodes does SoftenShutdown's work on one document; top says to look
// into a writeConcernError too.
func softenCodes(doc []byte, top bool) bool {
	if len(doc) < 5 {
		return false
	}
	changed := false
	rest := doc[4 : len(doc)-1]
	for len(rest) > 0 {
		el, next, ok := bsoncore.ReadElement(rest)
		if !ok {
			break
		}
		rest = next
		switch el.Key() {
		case "code":
			v := el.Value()
			if v.Type != bsoncore.TypeInt32 || len(v.Data) != 4 {
				continue
			}
			if c := int32(binary.LittleEndian.Uint32(v.Data)); c == CodeShutdownInProgress || c == CodeInterruptedAtShutdown {
				// v.Data aliases doc.
				binary.LittleEndian.PutUint32(v.Data, uint32(CodeHostUnreachable))
				changed = true
			}
		case "writeConcernError":
			if d, ok := el.Value().DocumentOK(); ok && top {
				changed = softenCodes(d, false) || changed
			}
		}
	}
	return changed
}
