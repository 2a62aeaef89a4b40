// Package command reads MongoDB commands and replies and builds the error
// replies mongobouncer sends. It knows the wire format's documents, not
// connections: what a request is (its command, database, session,
// transaction, cursor), what a reply says (ok, code, labels, cursor id,
// SDAM state-change errors), the error documents drivers retry on, and the
// translation of a legacy OP_QUERY command to the OP_MSG the proxy
// forwards and of its reply back. Everything here reads BSON in place,
// without decoding it, and allocates nothing for a known command.
package command
