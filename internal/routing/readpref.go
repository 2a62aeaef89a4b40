package routing

// Read preference: which servers of a route's deployment a read may use.
//
// Drivers talk to mongobouncer as to a mongos, so a read that may go to a
// secondary carries $readPreference in its OP_MSG body (server-selection
// spec, "Passing read preference to mongos"); a command without one goes to
// the primary, unless the route has a default read preference. The proxy
// decides which commands are reads at all (writes, transactions and the
// commands that follow a cursor go to the primary or where affinity says);
// this file decides where a read may go.

import (
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/sdam"
	"github.com/mongobouncer/mongobouncer/internal/topology"
)

// ReadPrefError is a $readPreference the proxy cannot honour: malformed,
// an unknown mode, or an invalid maxStalenessSeconds. The client gets
// FailedToParse (9) and the request goes nowhere.
type ReadPrefError struct{ Err error }

// Error says what is wrong with the read preference.
func (e *ReadPrefError) Error() string { return "invalid $readPreference: " + e.Err.Error() }

// Unwrap returns the parse or validation error.
func (e *ReadPrefError) Unwrap() error { return e.Err }

// Criteria returns what a read needs of a server, and whether the route's
// default read preference must be added to the command (the client sent
// none, and a secondary refuses a read without one). body is the command,
// rp its $readPreference document (nil when it has none). The read goes
// where rp allows, else where the route's default allows, else to the
// primary (the zero Criteria); an aggregate whose pipeline writes ($out,
// $merge) goes to the primary whatever it carries.
func (r *Route) Criteria(body bsoncore.Document, rp []byte) (_ topology.Criteria, addDefault bool, _ error) {
	var pref *sdam.ReadPref
	if rp != nil {
		if len(rp) < 5 {
			return topology.Criteria{}, false, &ReadPrefError{Err: errors.New("not a document")}
		}
		p, err := sdam.ParseReadPref(bsoncore.Document(rp))
		if err == nil {
			err = p.Validate(r.Topology.HeartbeatInterval())
		}
		if err != nil {
			return topology.Criteria{}, false, &ReadPrefError{Err: err}
		}
		pref = &p
	} else if r.ReadPref != nil {
		pref, addDefault = r.ReadPref, true
	}
	if pref == nil || pref.Mode == sdam.Primary {
		return topology.Criteria{}, false, nil
	}
	if pipelineWrites(body) {
		return topology.Criteria{}, false, nil
	}
	return topology.Criteria{ReadPref: pref}, addDefault, nil
}

// pipelineWrites reports whether body is an aggregate command whose
// pipeline ends in a stage that writes ($out or $merge).
func pipelineWrites(body bsoncore.Document) bool {
	if first, err := body.IndexErr(0); err != nil || first.Key() != "aggregate" {
		return false
	}
	v, err := body.LookupErr("pipeline")
	if err != nil {
		return false
	}
	arr, ok := v.ArrayOK()
	if !ok {
		return false
	}
	vals, err := arr.Values()
	if err != nil || len(vals) == 0 {
		return false
	}
	stage, ok := vals[len(vals)-1].DocumentOK()
	if !ok {
		return false
	}
	el, err := stage.IndexErr(0)
	if err != nil {
		return false
	}
	k := el.Key()
	return k == "$out" || k == "$merge"
}

// readPrefElement is the $readPreference element a route's default read
// preference adds to commands that carry none.
func readPrefElement(rp *sdam.ReadPref) ([]byte, error) {
	if rp == nil {
		return nil, nil
	}
	doc, err := rp.Document()
	if err != nil {
		return nil, fmt.Errorf("read preference: %w", err)
	}
	return bsoncore.AppendDocumentElement(nil, "$readPreference", doc), nil
}
