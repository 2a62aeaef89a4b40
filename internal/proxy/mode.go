package proxy

import "fmt"

// PoolMode says how long a client keeps an upstream connection.
type PoolMode uint8

const (
	// ModeTransaction lends a connection per request, and for the whole of a
	// transaction (startTransaction to the reply of commit/abort) and of an
	// exhaust stream.
	ModeTransaction PoolMode = iota
	// ModeSession lends a client a connection at its first forwarded request
	// and keeps it until the client disconnects.
	ModeSession
	// ModeStatement lends a connection for one request and its complete
	// response only; transactions keep server affinity but not a connection.
	ModeStatement
)

// String returns the configuration spelling of m.
func (m PoolMode) String() string {
	switch m {
	case ModeSession:
		return "session"
	case ModeTransaction:
		return "transaction"
	case ModeStatement:
		return "statement"
	}
	return fmt.Sprintf("PoolMode(%d)", uint8(m))
}

// ParsePoolMode parses "session", "transaction" or "statement".
func ParsePoolMode(s string) (PoolMode, error) {
	switch s {
	case "session":
		return ModeSession, nil
	case "transaction", "":
		return ModeTransaction, nil
	case "statement":
		return ModeStatement, nil
	}
	return 0, fmt.Errorf("pool mode %q: must be one of session, transaction, statement", s)
}
