package routing

// The routing table: the routes of one configuration, found by database
// name. Immutable once built; a reload builds a new one.

import (
	"errors"
	"fmt"
)

// Table finds the route of a database: its own, else the catch-all "*".
type Table struct {
	byName   map[string]*Route
	wildcard *Route
	all      []*Route
}

// NewTable checks routes (each with a topology and a pool mode config
// defines, no name twice) and prepares those not yet in use; maxCursors and
// maxTxns bound each new route's affinity maps. Routes carried over from
// the previous table must be passed as the same *Route values: they keep
// their live settings, pause and affinity.
func NewTable(routes []*Route, maxCursors, maxTxns int) (*Table, error) {
	if len(routes) == 0 {
		return nil, errors.New("routing: no routes")
	}
	t := &Table{byName: make(map[string]*Route, len(routes))}
	for _, r := range routes {
		if r == nil || r.Topology == nil {
			return nil, fmt.Errorf("routing: route %q has no topology", routeName(r))
		}
		if _, dup := t.byName[r.Name]; dup || (r.Name == "*" && t.wildcard != nil) {
			return nil, fmt.Errorf("routing: route %q is defined twice", r.Name)
		}
		if !poolMode(r.Mode).Valid() {
			return nil, fmt.Errorf("routing: route %q: pool mode %q: must be one of session, transaction, statement", r.Name, r.Mode)
		}
		r.init(maxCursors, maxTxns)
		if r.Name == "*" {
			t.wildcard = r
		} else {
			t.byName[r.Name] = r
		}
		t.all = append(t.all, r)
	}
	return t, nil
}

func routeName(r *Route) string {
	if r == nil {
		return "<nil>"
	}
	return r.Name
}

// All returns the table's routes, in the order they were given; the
// caller must not change the slice.
func (t *Table) All() []*Route { return t.all }

// Named returns the route named name ("*" for the catch-all), or nil.
func (t *Table) Named(name string) *Route {
	if name == "*" {
		return t.wildcard
	}
	return t.byName[name]
}

// For returns the route of database db, given as the bytes of a request:
// its own route, else the catch-all, else nil. The map lookup with a
// converted key does not allocate.
func (t *Table) For(db []byte) *Route {
	if r, ok := t.byName[string(db)]; ok {
		return r
	}
	return t.wildcard
}
