package proxy

// Read preference: which servers of a route's deployment a request may use.
// Written once for both drivers: relay.go and loop_client_linux.go ask
// exchange.criteria and hand the answer to the topology's selection.
//
// Drivers talk to mongobouncer as to a mongos, so a read that may go to a
// secondary carries $readPreference in its OP_MSG body (server-selection
// spec, "Passing read preference to mongos"); a command without one goes to
// the primary. A legacy OP_QUERY command reaches here translated to that
// form (command/legacy.go): its $readPreference modifier, or its SecondaryOk flag
// as secondaryPreferred, becomes the command's $readPreference.

import (
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/command"
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

// criteria returns what the request needs of a server, and whether the
// route's default read preference must be added to the command (the client
// sent none, and a secondary refuses a read without one).
//
//   - Writes, changes to the catalog, transactions, and commands that
//     follow a cursor (getMore, killCursors: affinity decides) need the
//     primary, whatever read preference they carry.
//   - An aggregate that writes ($out, $merge) needs the primary.
//   - Any other command goes where its $readPreference allows, else where
//     the route's default (read_preference) allows, else to the primary.
func criteria(route *Route, req *command.Request, body bsoncore.Document) (_ topology.Criteria, addDefault bool, _ error) {
	if _, inTxn := req.Key(); inTxn || req.Info.Primary || req.StartTxn || req.Info.Kind != command.Other {
		return topology.Criteria{}, false, nil
	}
	var rp *sdam.ReadPref
	if req.ReadPref != nil {
		if len(req.ReadPref) < 5 {
			return topology.Criteria{}, false, &ReadPrefError{Err: errors.New("not a document")}
		}
		p, err := sdam.ParseReadPref(bsoncore.Document(req.ReadPref))
		if err == nil {
			err = p.Validate(route.Topology.HeartbeatInterval())
		}
		if err != nil {
			return topology.Criteria{}, false, &ReadPrefError{Err: err}
		}
		rp = &p
	} else if route.ReadPref != nil {
		rp, addDefault = route.ReadPref, true
	}
	if rp == nil || rp.Mode == sdam.Primary {
		return topology.Criteria{}, false, nil
	}
	if req.Info.Name == "aggregate" && pipelineWrites(body) {
		return topology.Criteria{}, false, nil
	}
	return topology.Criteria{ReadPref: rp}, addDefault, nil
}

// pipelineWrites reports whether an aggregate command's pipeline ends in a
// stage that writes ($out or $merge).
func pipelineWrites(body bsoncore.Document) bool {
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

// readPrefDocument is the $readPreference element a route's default read
// preference adds to commands that carry none.
func readPrefDocument(rp *sdam.ReadPref) ([]byte, error) {
	if rp == nil {
		return nil, nil
	}
	doc, err := rp.Document()
	if err != nil {
		return nil, fmt.Errorf("read preference: %w", err)
	}
	return bsoncore.AppendDocumentElement(nil, "$readPreference", doc), nil
}
