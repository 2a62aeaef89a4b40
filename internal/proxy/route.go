package proxy

// How a request finds its route (internal/routing has the routes
// themselves) and what it needs of the route's servers: the server's
// routing table, swapped whole on a reload, and which commands are reads
// that the route's read preference may send away from the primary.

import (
	"errors"

	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"

	"github.com/mongobouncer/mongobouncer/internal/command"
	"github.com/mongobouncer/mongobouncer/internal/routing"
	"github.com/mongobouncer/mongobouncer/internal/topology"
)

// errShuttingDown ends a wait at the pause gate when the server shuts down.
var errShuttingDown = errors.New("mongobouncer is shutting down")

// errRouteReplaced fails a request that waited at a paused route which a
// reload then replaced or removed.
var errRouteReplaced = errors.New("the route was reconfigured while the request waited at its pause")

// SetRoutes replaces the routing table (configuration reload). Routes that
// stay must be passed as the same *Route values; clients holding a removed
// route's connections keep them until they release them (see Route.Held).
func (s *Server) SetRoutes(routes []*routing.Route) error {
	t, err := routing.NewTable(routes, s.opts.MaxCursors, s.opts.MaxTransactions)
	if err != nil {
		return err
	}
	s.table.Store(t)
	return nil
}

// Routes returns the current routes.
func (s *Server) Routes() []*routing.Route {
	return append([]*routing.Route(nil), s.table.Load().All()...)
}

// Route returns the route named name ("*" for the catch-all), or nil.
func (s *Server) Route(name string) *routing.Route { return s.table.Load().Named(name) }

// routeFor finds the route of a database name given as bytes.
func (s *Server) routeFor(db []byte) *routing.Route { return s.table.Load().For(db) }

// criteria returns what the request needs of a server, and whether the
// route's default read preference must be added to the command. Writes,
// changes to the catalog, transactions, and commands that follow a cursor
// (getMore, killCursors: affinity decides) need the primary, whatever read
// preference they carry; any other command is a read, which goes where the
// route says (routing.Route.Criteria). A legacy OP_QUERY command reaches
// here translated (legacy.go): its $readPreference modifier, or its
// SecondaryOk flag as secondaryPreferred, is req.rp.
func criteria(route *routing.Route, req *command.Request, body bsoncore.Document) (_ topology.Criteria, addDefault bool, _ error) {
	if _, inTxn := req.Key(); inTxn || req.Info.Primary || req.StartTxn || req.Info.Kind != command.Other {
		return topology.Criteria{}, false, nil
	}
	return route.Criteria(body, req.ReadPref)
}
