package admin

import (
	"bytes"
	"log/slog"
	"net"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Handler answers the admin commands sent over the wire to the virtual
// "mongobouncer" database. It has the method set of proxy.AdminHandler.
type Handler struct {
	c *core
}

// NewHandler returns the wire admin handler. A nil logger discards.
func NewHandler(ctl Controller, logger *slog.Logger) *Handler {
	return &Handler{c: newCore(ctl, logger)}
}

// HandleAdmin runs the command in body (its first key) for peer and returns
// the reply body: {<result>: ..., ok: 1}, or a MongoDB error document.
// Peers that IsAdminPeer refuses get Unauthorized (13) whatever they send.
func (h *Handler) HandleAdmin(peer net.Addr, body bsoncore.Document) bsoncore.Document {
	peerText := "<nil>"
	if peer != nil {
		peerText = peer.String()
	}
	if !IsAdminPeer(peer) {
		h.c.log.Warn("admin command refused", slog.String("peer", peerText), slog.String("via", "wire"))
		return errorDoc(errorf(CodeUnauthorized,
			"not authorized: admin commands are only accepted from loopback or the admin listener"))
	}
	cmd, route, aerr := parseWire(body)
	if aerr != nil {
		h.c.log.Warn("admin command rejected", slog.String("peer", peerText), slog.String("via", "wire"), slog.String("error", aerr.Msg))
		return errorDoc(aerr)
	}
	res, aerr := h.c.exec(cmd, route, "wire", peerText)
	if aerr != nil {
		return errorDoc(aerr)
	}
	doc, err := resultDoc(res)
	if err != nil {
		h.c.log.Error("admin reply encoding failed", slog.String("command", cmd.name), slog.String("error", err.Error()))
		return errorDoc(errorf(CodeInternalError, "cannot encode the %s reply: %v", cmd.name, err))
	}
	return doc
}

// parseWire finds the command (first key) and its route argument.
func parseWire(body bsoncore.Document) (*command, string, *Error) {
	if err := body.Validate(); err != nil {
		return nil, "", errorf(CodeBadValue, "invalid command document: %v", err)
	}
	first, err := body.IndexErr(0)
	if err != nil {
		return nil, "", errorf(CodeBadValue, "empty command document; valid commands: %s", commandNames)
	}
	cmd, ok := lookupCommand(first.Key())
	if !ok {
		return nil, "", errorf(CodeCommandNotFound, "no such admin command %q; valid commands: %s", first.Key(), commandNames)
	}
	v, err := body.LookupErr("route")
	if err != nil { // absent: every route
		return cmd, "", nil
	}
	if !cmd.route {
		return nil, "", errorf(CodeBadValue, "%s takes no route argument", cmd.name)
	}
	route, ok := v.StringValueOK()
	if !ok {
		return nil, "", errorf(CodeBadValue, "route must be a string, not %s", v.Type)
	}
	if route == "" {
		// Most likely an unset variable in a script: never "every route".
		return nil, "", errorf(CodeBadValue, "route must not be empty; leave it out for every route")
	}
	return cmd, route, nil
}

// resultDoc encodes {<key>: value, note, ok: 1}. Integers are encoded at
// their smallest size, so mongosh shows 3 rather than Long('3').
func resultDoc(res result) (bsoncore.Document, error) {
	d := make(bson.D, 0, 3)
	if res.key != "" {
		v := res.value
		if res.key == "config" {
			v = orderedValue(v)
		}
		d = append(d, bson.E{Key: res.key, Value: v})
	}
	if res.note != "" {
		d = append(d, bson.E{Key: "note", Value: res.note})
	}
	d = append(d, bson.E{Key: "ok", Value: 1.0})
	var buf bytes.Buffer
	enc := bson.NewEncoder(bson.NewDocumentWriter(&buf))
	enc.IntMinSize()
	enc.NilSliceAsEmpty()
	enc.NilMapAsEmpty()
	if err := enc.Encode(d); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// errorDoc is the MongoDB error reply for e: {ok: 0, errmsg, code,
// codeName}.
func errorDoc(e *Error) bsoncore.Document {
	idx, doc := bsoncore.AppendDocumentStart(nil)
	doc = bsoncore.AppendDoubleElement(doc, "ok", 0)
	doc = bsoncore.AppendStringElement(doc, "errmsg", "mongobouncer: "+e.Msg)
	doc = bsoncore.AppendInt32Element(doc, "code", e.Code)
	doc = bsoncore.AppendStringElement(doc, "codeName", e.CodeName())
	doc, _ = bsoncore.AppendDocumentEnd(doc, idx)
	return doc
}
