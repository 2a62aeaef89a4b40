package proxy

// The pool modes are typed once, in config (config.PoolMode, validated
// there); the proxy takes them as they are. These are its short names.

import "github.com/mongobouncer/mongobouncer/internal/config"

// PoolMode says how long a client keeps an upstream connection: config's
// type, not a copy of it. The zero value "" is transaction.
type PoolMode = config.PoolMode

const (
	// ModeTransaction lends a connection per request, and for the whole of a
	// transaction (startTransaction to the reply of commit/abort) and of an
	// exhaust stream.
	ModeTransaction = config.PoolModeTransaction
	// ModeSession lends a client a connection at its first forwarded request
	// and keeps it until the client disconnects.
	ModeSession = config.PoolModeSession
	// ModeStatement lends a connection for one request and its complete
	// response only; transactions keep server affinity but not a connection.
	ModeStatement = config.PoolModeStatement
)
