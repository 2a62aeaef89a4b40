package session

// Cursors of load-balanced clients across a drain. A driver with
// loadBalanced=true sends every getMore and the killCursors of a cursor on
// the connection that opened it, so such a cursor can only be finished on
// this mongobouncer: the load-balancer specification has the driver pin
// it. Refusing its getMore with ShutdownInProgress during a drain would end
// the application's iteration with an error (drivers do not retry a
// getMore), and closing the connection after the drain would do the same.
// So for these clients the drain admits the getMores and killCursors of
// the cursors they opened here, and waits for those cursors to be
// exhausted or killed, as it waits for open transactions, within
// shutdown_timeout. A plain client's cursor is not waited for: its driver
// may send the getMore on any connection, to any mongobouncer.

import "github.com/mongobouncer/mongobouncer/internal/command"

// maxLBCursors bounds the cursors remembered per load-balanced client: a
// client that opens more without reading them to the end or killing them
// has the newest ones forgotten (their getMore during a drain is refused),
// so that it cannot grow the set without limit.
const maxLBCursors = 1024

// NoteLBCursor records what a reply did to the cursors of a load-balanced
// client: a command other than getMore that returned a cursor opened it;
// a getMore that returned cursor id 0 exhausted it, and one that failed
// ended it (CursorNotFound, or the server killed it); a killCursors ends
// the cursors it names. Called for every reply of every client; it costs a
// plain client one load.
func (ss *Session) NoteLBCursor(req *command.Request, ri command.Reply, killIDs []int64) {
	if !ss.lbMode.Load() {
		return
	}
	ss.Mu.Lock()
	defer ss.Mu.Unlock()
	switch {
	case req.Info.Kind == command.GetMore && (ri.CursorID == 0 || !ri.OK):
		delete(ss.lbCursors, req.CursorID)
	case req.Info.Kind == command.KillCursors:
		for _, id := range killIDs {
			delete(ss.lbCursors, id)
		}
	case req.Info.Kind != command.GetMore && ri.OK && ri.CursorID != 0:
		if ss.lbCursors == nil {
			ss.lbCursors = make(map[int64]struct{})
		}
		if len(ss.lbCursors) < maxLBCursors {
			ss.lbCursors[ri.CursorID] = struct{}{}
		}
	}
}

// DrainFinishesCursor reports whether req, arriving during a drain, is
// the getMore or killCursors of a cursor the (load-balanced) client opened
// here, which the drain lets through.
func (ss *Session) DrainFinishesCursor(req *command.Request) bool {
	if !ss.lbMode.Load() {
		return false
	}
	ss.Mu.Lock()
	defer ss.Mu.Unlock()
	switch req.Info.Kind {
	case command.GetMore:
		_, ok := ss.lbCursors[req.CursorID]
		return ok
	case command.KillCursors:
		// Its ids are read when proxy forwards it; a
		// load-balanced driver kills only a cursor of this connection.
		return len(ss.lbCursors) > 0
	}
	return false
}
